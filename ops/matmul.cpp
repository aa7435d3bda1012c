#include "ops/matmul.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/flops.h"
#include "engine/gemm.h"
#include "engine/threads.h"
#include "engine/vectorize.h"

namespace adjoint {

// Rows are summed within fixed blocks of kRowBlock rows (in parallel, vectorised along the
// row), then the block sums are added in block order. The blocks do not depend on the
// thread count, so neither does the result.
void column_sums(const float* m, int64_t rows, int64_t cols, float* out, int64_t out_stride) {
  constexpr int64_t kRowBlock = 64;
  const int64_t blocks = (rows + kRowBlock - 1) / kRowBlock;
  std::vector<double> partial(static_cast<size_t>(blocks * cols), 0.0);
  parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    run_widest([&] {  // the columns side by side, a vector of doubles at a time
      for (int64_t b = b0; b < b1; ++b) {
        double* sum = partial.data() + b * cols;
        for (int64_t r = b * kRowBlock; r < std::min(rows, (b + 1) * kRowBlock); ++r) {
          const float* row = m + r * cols;
          for (int64_t c = 0; c < cols; ++c) sum[c] += row[c];
        }
      }
    });
  });
  parallel_for(cols, 1024, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      double total = 0;
      for (int64_t b = 0; b < blocks; ++b) total += partial[static_cast<size_t>(b * cols + c)];
      out[c * out_stride] = static_cast<float>(total);
    }
  });
}

namespace {

// The shapes of one matmul: `count` products of (M, K) · (K, N). When b is a single matrix
// shared by every row of a, count is 1 and M holds all of a's rows (the folded case).
struct MatmulShape {
  int64_t count, M, K, N;
};

class MatmulNode : public Node {
 public:
  MatmulNode(Tensor a, Tensor b, MatmulShape s) : a_(std::move(a)), b_(std::move(b)), s_(s) {}
  std::string name() const override { return "matmul"; }

  // C = A·B: dA = dC·Bᵀ, dB = Aᵀ·dC, per product.
  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override {
    const auto [count, M, K, N] = s_;
    Tensor da, db;
    if (needs[0]) {
      da = Tensor::empty(a_.shape());
      gemm_batched(count, false, true, M, K, N, 1.0f, u.data(), N, M * N, b_.data(), N, K * N, 0.0f, da.data(), K,
                   M * K);
    }
    if (needs[1]) {
      db = Tensor::empty(b_.shape());
      gemm_batched(count, true, false, K, N, M, 1.0f, a_.data(), K, M * K, u.data(), N, M * N, 0.0f, db.data(), N,
                   K * N);
    }
    return {da, db};
  }

 public:
  void release() override { a_ = b_ = Tensor(); }

 private:
  Tensor a_, b_;
  MatmulShape s_;
};

// linear's three products and which kernels run each (engine/gemm.h), as one table of
// rules: the first rule whose least extents a product meets chooses, OpenBLAS otherwise.
// On ViT-B/16's layers the engine's AVX-512 kernel (with the forward's bias and residual in
// its epilogue) measured level with OpenBLAS, not ahead (docs/benchmarks.md "The engine's
// GEMM on ViT-B/16's linear layers"), so every rule names OpenBLAS, the kernels the peer
// shares; a rule switched to `widest` moves those shapes and folds the epilogue.
enum class LinearProduct { forward, input_gradient, weight_gradient };

struct LinearRoute {
  LinearProduct product;
  int64_t min_rows, min_out, min_in;
  GemmKernel kernel;
};

constexpr LinearRoute kLinearRoutes[] = {
    {LinearProduct::forward, 256, 768, 768, GemmKernel::blas},
    {LinearProduct::input_gradient, 256, 768, 768, GemmKernel::blas},
    {LinearProduct::weight_gradient, 256, 768, 768, GemmKernel::blas},
};

GemmKernel linear_kernel(LinearProduct product, int64_t rows, int64_t out, int64_t in) {
  for (const LinearRoute& route : kLinearRoutes)
    if (route.product == product && rows >= route.min_rows && out >= route.min_out && in >= route.min_in)
      return route.kernel;
  return GemmKernel::blas;
}

class LinearNode : public Node {
 public:
  LinearNode(Tensor x, Tensor weight, int64_t rows) : x_(std::move(x)), w_(std::move(weight)), rows_(rows) {}
  std::string name() const override { return "linear"; }

  // y = x·Wᵀ + b [+ r] over `rows` rows: dx = dy·W, dW = dyᵀ·x, db = Σ_rows dy, dr = dy.
  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override {
    const int64_t out = w_.size(0), in = w_.size(1);
    Tensor dx, dw, db;
    if (needs[0]) {
      dx = Tensor::empty(x_.shape());
      gemm(false, false, rows_, in, out, 1.0f, u.data(), out, w_.data(), in, 0.0f, dx.data(), in,
           linear_kernel(LinearProduct::input_gradient, rows_, out, in));
    }
    if (needs[1]) {
      dw = Tensor::empty(w_.shape());
      gemm(true, false, out, in, rows_, 1.0f, u.data(), out, x_.data(), in, 0.0f, dw.data(), in,
           linear_kernel(LinearProduct::weight_gradient, rows_, out, in));
    }
    if (needs.size() > 2 && needs[2]) {
      db = Tensor::empty({out});
      column_sums(u.data(), rows_, out, db.data());
    }
    return {dx, dw, db, needs.size() > 3 && needs[3] ? u : Tensor()};
  }

 public:
  void release() override { x_ = w_ = Tensor(); }

 private:
  Tensor x_, w_;
  int64_t rows_;
};

}  // namespace

Tensor matmul(const Tensor& a_in, const Tensor& b_in) {
  check(a_in.defined() && b_in.defined(), "matmul: undefined operand");
  check(a_in.dim() >= 2 && b_in.dim() >= 2, "matmul: expects matrices (2-D or more), got a ", a_in.shape(), " and b ",
        b_in.shape());
  const int64_t M = a_in.size(-2), K = a_in.size(-1), N = b_in.size(-1);
  check(b_in.size(-2) == K, "matmul: a ", a_in.shape(), " and b ", b_in.shape(), " have inner dimensions ", K, " and ",
        b_in.size(-2));
  Shape out_shape(a_in.shape().begin(), a_in.shape().end() - 1);
  out_shape.push_back(N);
  MatmulShape s{1, M, K, N};
  if (b_in.dim() == 2) {
    s.M = numel(Shape(a_in.shape().begin(), a_in.shape().end() - 1));  // every row of a against one b
  } else {
    const Shape batch_a(a_in.shape().begin(), a_in.shape().end() - 2);
    const Shape batch_b(b_in.shape().begin(), b_in.shape().end() - 2);
    check(batch_a == batch_b, "matmul: batch dimensions differ: a ", a_in.shape(), " and b ", b_in.shape(),
          " (batched operands need equal batch dimensions, or a 2-D b)");
    s.count = numel(batch_a);
  }
  Tensor a = a_in.contiguous(), b = b_in.contiguous();
  Tensor out = Tensor::empty(out_shape);
  count_multiply_adds(s.count * s.M * s.N * s.K);
  gemm_batched(s.count, false, false, s.M, s.N, s.K, 1.0f, a.data(), K, s.M * K, b.data(), N, K * N, 0.0f, out.data(),
               N, s.M * N);
  if (needs_grad({a, b})) attach(out, std::make_shared<MatmulNode>(a.detach(), b.detach(), s), {a, b});
  return out;
}

Tensor linear(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Tensor& residual_in,
              const Tensor& into) {
  check(x_in.defined() && weight_in.defined(), "linear: undefined input or weight");
  check(weight_in.dim() == 2, "linear: weight must be 2-D (out, in), got ", weight_in.shape());
  const int64_t out_features = weight_in.size(0), in_features = weight_in.size(1);
  check(x_in.dim() >= 1 && x_in.size(-1) == in_features, "linear: weight ", weight_in.shape(), " expects ", in_features,
        " input features, input is ", x_in.shape());
  if (bias_in.defined())
    check(bias_in.shape() == Shape{out_features}, "linear: bias ", bias_in.shape(), " does not match weight ",
          weight_in.shape(), " (expects [", out_features, "])");
  Tensor x = x_in.contiguous(), w = weight_in.contiguous();
  Tensor bias = bias_in.defined() ? bias_in.contiguous() : Tensor();
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  const int64_t rows = numel(Shape(x.shape().begin(), x.shape().end() - 1));
  if (residual_in.defined())
    check(residual_in.shape() == out_shape, "linear: residual ", residual_in.shape(), " does not match the output ",
          out_shape, " of input ", x.shape(), " and weight ", w.shape());
  Tensor residual = residual_in.defined() ? residual_in.contiguous() : Tensor();
  const bool record = needs_grad({x, w, bias, residual});
  if (into.defined())
    check(!record && into.shape() == out_shape && into.is_contiguous(), "linear: output destination ", into.shape(),
          " for input ", x.shape(), " and weight ", w.shape(), " must be contiguous, of the output's shape ",
          out_shape, ", and used outside a recorded graph");
  Tensor out = into.defined() ? into : Tensor::empty(out_shape);
  // Each row starts from residual + bias; the product adds onto it (engine/gemm.h).
  const GemmEpilogue epilogue{bias.defined() ? bias.data() : nullptr, residual.defined() ? residual.data() : nullptr,
                              out_features};
  count_multiply_adds(rows * out_features * in_features);
  gemm_with_epilogue(false, true, rows, out_features, in_features, 1.0f, x.data(), in_features, w.data(), in_features,
                     epilogue, out.data(), out_features,
                     linear_kernel(LinearProduct::forward, rows, out_features, in_features));
  if (record)
    attach(out, std::make_shared<LinearNode>(x.detach(), w.detach(), rows), {x, w, bias, residual});
  return out;
}

}  // namespace adjoint
