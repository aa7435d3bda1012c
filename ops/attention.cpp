#include "ops/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/gemm.h"
#include "engine/threads.h"

namespace adjoint {

namespace {

// Extents of one call: `batch` independent heads, T queries, S keys, head sizes d and dv.
struct AttentionShape {
  int64_t batch, T, S, d, dv;
};

// Rows of the pattern per parallel chunk: about 16K scores.
int64_t row_grain(int64_t S) { return std::max<int64_t>(1, (1 << 14) / std::max<int64_t>(S, 1)); }

// The attention pattern softmax(Q Kᵀ·alpha [+ mask]) for every head, (batch, T, S). The
// forward pass uses alpha = s; the soft pullback alpha = s/τ.
Tensor pattern(const float* q, const float* k, const AttentionShape& sh, float alpha, bool causal) {
  const auto [batch, T, S, d, dv] = sh;
  Tensor a = Tensor::empty({batch, T, S});
  float* pa = a.data();
  gemm_batched(batch, false, true, T, S, d, alpha, q, d, T * d, k, d, S * d, 0.0f, pa, S, T * S);
  parallel_for(batch * T, row_grain(S), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = pa + r * S;
      // Keys 0..i are visible to query i under the causal mask (i = r mod T); at least
      // key 0 always is, so no row is empty.
      const int64_t visible = causal ? std::min<int64_t>(S, r % T + 1) : S;
      const float peak = *std::max_element(row, row + visible);
      double total = 0;
      for (int64_t j = 0; j < visible; ++j) total += row[j] = std::exp(row[j] - peak);
      const float inv = float(1.0 / total);
      for (int64_t j = 0; j < visible; ++j) row[j] *= inv;
      std::fill(row + visible, row + S, 0.0f);
    }
  });
  return a;
}

class AttentionNode : public Node {
public:
  AttentionNode(Tensor q, Tensor k, Tensor v, Tensor a, AttentionShape shape, bool causal, float scale)
      : q_(std::move(q)), k_(std::move(k)), v_(std::move(v)), a_(std::move(a)), sh_(shape), causal_(causal),
        scale_(scale) {}
  std::string name() const override { return "scaled_dot_product_attention"; }

  std::vector<Tensor> vjp(const Tensor& u, const Transport& t) override {
    const auto [batch, T, S, d, dv] = sh_;
    const float* pu = u.data();
    std::vector<Tensor> out(3);

    if (needs[2]) {  // dV = Aᵀ u, A the forward pattern or, for the soft pullback, the re-tempered one
      Tensor a = t.is_soft() ? pattern(q_.data(), k_.data(), sh_, scale_ / t.tau.attention, causal_) : a_;
      const float* pa = a.data();
      // gemm writes every element, zeros when there are no queries (T = 0, an empty sum).
      Tensor dv_t = Tensor::empty(v_.shape());
      gemm_batched(batch, true, false, S, dv, T, 1.0f, pa, S, T * S, pu, dv, T * dv, 0.0f, dv_t.data(), dv, S * dv);
      out[2] = dv_t;
    }
    // Only the gradient differentiates the pattern; the pullbacks hold it fixed.
    if (!t.is_gradient() || !(needs[0] || needs[1])) return out;

    // dA = u Vᵀ, then through the softmax: dZ = A ⊙ (dA − rowsum(dA ⊙ A)).
    const float* pa = a_.data();
    Tensor dz = Tensor::empty({batch, T, S});
    float* pz = dz.data();
    gemm_batched(batch, false, true, T, S, dv, 1.0f, pu, dv, T * dv, v_.data(), dv, S * dv, 0.0f, pz, S, T * S);
    parallel_for(batch * T, row_grain(S), [&](int64_t r0, int64_t r1) {
      for (int64_t r = r0; r < r1; ++r) {
        const float* ar = pa + r * S;
        float* zr = pz + r * S;
        double dot = 0;
        for (int64_t j = 0; j < S; ++j) dot += double(zr[j]) * ar[j];
        for (int64_t j = 0; j < S; ++j) zr[j] = ar[j] * (zr[j] - float(dot));  // masked: A = 0
      }
    });
    if (needs[0]) {  // dQ = s·dZ K
      Tensor dq = Tensor::empty(q_.shape());
      gemm_batched(batch, false, false, T, d, S, scale_, pz, S, T * S, k_.data(), d, S * d, 0.0f, dq.data(), d, T * d);
      out[0] = dq;
    }
    if (needs[1]) {  // dK = s·dZᵀ Q
      Tensor dk = Tensor::empty(k_.shape());  // as dV
      gemm_batched(batch, true, false, S, d, T, scale_, pz, S, T * S, q_.data(), d, T * d, 0.0f, dk.data(), d, S * d);
      out[1] = dk;
    }
    return out;
  }

public:
  void release() override { q_ = k_ = v_ = a_ = Tensor(); }

private:
  Tensor q_, k_, v_;  // detached, contiguous
  Tensor a_;          // the forward pattern (batch, T, S)
  AttentionShape sh_;
  bool causal_;
  float scale_;
};

}  // namespace

Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale) {
  check(q.defined() && k.defined() && v.defined(), "scaled_dot_product_attention: undefined input");
  // Messages are built only on failure: this runs on every forward.
  auto require = [&](bool ok, const char* what) {
    if (!ok)
      throw Error(cat("scaled_dot_product_attention: ", what, ": q ", q.shape(), ", k ", k.shape(), ", v ",
                      v.shape()));
  };
  const int64_t rank = q.dim();
  require(rank >= 2 && k.dim() == rank && v.dim() == rank, "q, k, v need the same rank (at least 2)");
  require(std::equal(q.shape().begin(), q.shape().end() - 2, k.shape().begin()) &&
              std::equal(q.shape().begin(), q.shape().end() - 2, v.shape().begin()),
          "leading (batch, head) dims differ");
  require(q.size(-1) == k.size(-1), "q and k head sizes differ");
  require(k.size(-2) == v.size(-2), "k and v key counts differ");
  const AttentionShape sh{numel(Shape(q.shape().begin(), q.shape().end() - 2)), q.size(-2), k.size(-2), q.size(-1),
                          v.size(-1)};
  require(sh.d > 0 && sh.S > 0 && sh.dv > 0, "empty head or key set");
  if (scale < 0) scale = float(1.0 / std::sqrt(double(sh.d)));

  Tensor qc = q.contiguous(), kc = k.contiguous(), vc = v.contiguous();
  Tensor a = pattern(qc.data(), kc.data(), sh, scale, causal);
  Shape out_shape = q.shape();
  out_shape.back() = sh.dv;
  Tensor out = Tensor::empty(out_shape);
  gemm_batched(sh.batch, false, false, sh.T, sh.dv, sh.S, 1.0f, a.data(), sh.S, sh.T * sh.S, vc.data(), sh.dv,
               sh.S * sh.dv, 0.0f, out.data(), sh.dv, sh.T * sh.dv);

  if (needs_grad({qc, kc, vc}))
    attach(out, std::make_shared<AttentionNode>(qc.detach(), kc.detach(), vc.detach(), a, sh, causal, scale),
           {qc, kc, vc});
  return out;
}

}  // namespace adjoint
