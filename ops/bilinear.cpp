#include "ops/bilinear.h"

#include <algorithm>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/flops.h"
#include "engine/gemm.h"
#include "engine/threads.h"
#include "ops/matmul.h"

namespace adjoint {

namespace {

// The layer's matrices as row-major (h, d+1) arrays. Skipping column 0 (the bias) is a
// pointer offset of 1 with the leading dimension kept at d+1, so every product below
// runs on x itself and no (M, d+1) copy of x̃ is ever built.
//
// rows = M (the folded leading dims of x), h outputs, d inputs.
struct BilinearShape {
  int64_t M, h, d;
};

// P = x̃ Wᵀ (M, h) for one of the two matrices W (h, d+1).
Tensor project(const float* x, const float* W, const BilinearShape& sh) {
  const auto [M, h, d] = sh;
  Tensor p = Tensor::empty({M, h});
  float* pp = p.data();
  // The bias column, gathered once (read a row at a time, its entries d + 1 floats apart
  // cost 7% of a bilinear LM's inference), in every row; then the product accumulates.
  std::vector<float> bias(static_cast<size_t>(h));
  for (int64_t o = 0; o < h; ++o) bias[static_cast<size_t>(o)] = W[o * (d + 1)];
  parallel_for(M, 256, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) std::copy(bias.begin(), bias.end(), pp + r * h);
  });
  gemm(false, true, M, h, d, 1.0f, x, d, W + 1, d + 1, 1.0f, pp, h);
  return p;
}

// out = a ⊙ b elementwise over n values.
void multiply(const float* a, const float* b, float* out, int64_t n) {
  parallel_for(n, 1 << 14, [&](int64_t s, int64_t e) {
    for (int64_t i = s; i < e; ++i) out[i] = a[i] * b[i];
  });
}

// dW (h, d+1) = gᵀ x̃ for g (M, h): column 0 is the column sums of g.
Tensor weight_gradient(const float* g, const float* x, const BilinearShape& sh) {
  const auto [M, h, d] = sh;
  Tensor dw = Tensor::zeros({h, d + 1});
  float* pw = dw.data();
  column_sums(g, M, h, pw, d + 1);
  if (M > 0) gemm(true, false, h, d, M, 1.0f, g, h, x, d, 0.0f, pw + 1, d + 1);
  return dw;
}

class BilinearNode : public Node {
public:
  BilinearNode(Tensor x, Tensor L, Tensor R, Tensor lx, Tensor rx, BilinearShape shape)
      : x_(std::move(x)), L_(std::move(L)), R_(std::move(R)), lx_(std::move(lx)), rx_(std::move(rx)), sh_(shape) {}
  std::string name() const override { return "bilinear"; }

  std::vector<Tensor> vjp(const Tensor& u, const Transport& t) override {
    const auto [M, h, d] = sh_;
    // u ⊙ Rx̃ meets L, u ⊙ Lx̃ meets R.
    Tensor u_rx = Tensor::empty({M, h}), u_lx = Tensor::empty({M, h});
    multiply(u.data(), rx_.data(), u_rx.data(), M * h);
    multiply(u.data(), lx_.data(), u_lx.data(), M * h);

    std::vector<Tensor> out(3);
    if (needs[0]) {
      // dx = (u⊙Rx̃) L[:, 1:] + (u⊙Lx̃) R[:, 1:], halved for the pullbacks.
      const float half_or_one = t.is_gradient() ? 1.0f : 0.5f;
      Tensor dx = Tensor::empty(x_.shape());
      gemm(false, false, M, d, h, half_or_one, u_rx.data(), h, L_.data() + 1, d + 1, 0.0f, dx.data(), d);
      gemm(false, false, M, d, h, half_or_one, u_lx.data(), h, R_.data() + 1, d + 1, 1.0f, dx.data(), d);
      out[0] = dx;
    }
    if (needs[1]) out[1] = weight_gradient(u_rx.data(), x_.data(), sh_);
    if (needs[2]) out[2] = weight_gradient(u_lx.data(), x_.data(), sh_);
    return out;
  }

private:
  Tensor x_, L_, R_;  // detached, contiguous
  Tensor lx_, rx_;    // L x̃ and R x̃, (M, h)
  BilinearShape sh_;
};

}  // namespace

Tensor bilinear(const Tensor& x, const Tensor& L, const Tensor& R) {
  check(x.defined() && L.defined() && R.defined(), "bilinear: undefined input");
  // Messages are built only on failure: this runs on every forward.
  auto require = [&](bool ok, const char* what) {
    if (!ok) throw Error(cat("bilinear: ", what, ", got x ", x.shape(), ", L ", L.shape(), ", R ", R.shape()));
  };
  require(x.dim() >= 1 && x.size(-1) >= 1, "x needs a non-empty feature dim");
  require(L.dim() == 2 && L.size(0) >= 1 && L.size(1) == x.size(-1) + 1,
          "L must be (h, d+1) for x (..., d), its bias in column 0");
  require(R.shape() == L.shape(), "L and R shapes differ");
  const int64_t d = x.size(-1);
  const BilinearShape sh{x.numel() / d, L.size(0), d};

  Tensor xc = x.contiguous(), Lc = L.contiguous(), Rc = R.contiguous();
  count_multiply_adds(2 * sh.M * sh.h * sh.d);  // the two projections
  Tensor lx = project(xc.data(), Lc.data(), sh), rx = project(xc.data(), Rc.data(), sh);
  Shape out_shape = x.shape();
  out_shape.back() = sh.h;
  Tensor out = Tensor::empty(out_shape);
  multiply(lx.data(), rx.data(), out.data(), sh.M * sh.h);

  if (needs_grad({xc, Lc, Rc}))
    attach(out, std::make_shared<BilinearNode>(xc.detach(), Lc.detach(), Rc.detach(), lx, rx, sh), {xc, Lc, Rc});
  return out;
}

}  // namespace adjoint
