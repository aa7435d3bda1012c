#include "ops/matmul.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/flops.h"
#include "engine/gemm.h"
#include "engine/gemm_avx512.h"
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
// A forward routed to `widest` (where the CPU runs the AVX-512 kernels) folds the bias, the
// residual and a following activation into the product, and in an eval-mode layer reads the
// weights packed once per version of their values (PackedB, kept with them). On ViT-B/16's
// layers that measured level with OpenBLAS, not ahead (docs/benchmarks.md, "ViT-B/16's
// linears on the engine's kernel with their weights packed once"), so every rule names
// OpenBLAS, the kernels the peer shares; a rule switched to `widest` moves those shapes.
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

// LinearForwardKernel's choice while one is alive: 1 + the kernel, 0 for none.
std::atomic<int> forward_kernel_override{0};

GemmKernel linear_kernel(LinearProduct product, int64_t rows, int64_t out, int64_t in) {
  if (const int forced = forward_kernel_override.load(std::memory_order_relaxed);
      product == LinearProduct::forward && forced != 0)
    return static_cast<GemmKernel>(forced - 1);
  for (const LinearRoute& route : kLinearRoutes)
    if (route.product == product && rows >= route.min_rows && out >= route.min_out && in >= route.min_in)
      return route.kernel;
  return GemmKernel::blas;
}

// The weights' form kept for the forward: op(B) = weightᵀ packed (PackedB). The first word
// of its key (PreparedForms), distinct from the convolutions' forms.
constexpr uint64_t kLinearPackedWeights = 0x6c696e6561720001;  // "linear", 1

std::shared_ptr<const PackedB> packed_weights(const Tensor& w) {
  return w.prepared<PackedB>({kLinearPackedWeights}, [&] {
    auto packed = std::make_shared<const PackedB>(true, w.size(1), w.size(0), w.data(), w.size(1));
    return std::pair<std::shared_ptr<const PackedB>, int64_t>{packed, packed->bytes()};
  });
}

// The row map of an activation, for a product's epilogue (GemmEpilogue::map).
template <Activation kind>
void activate_row(const float* z, float* y, int64_t n) {
  activation_values(z, y, n, kind);
}

GemmEpilogue::RowMap row_map(Activation kind) {
  switch (kind) {
    case Activation::Relu: return activate_row<Activation::Relu>;
    case Activation::Gelu: return activate_row<Activation::Gelu>;
    case Activation::Silu: return activate_row<Activation::Silu>;
  }
  throw Error(cat("linear: unknown activation ", static_cast<int>(kind)));
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
      gemm(false, false, rows_, in, out, 1.0f, u.data(), out, std::as_const(w_).data(), in, 0.0f, dx.data(), in,
           linear_kernel(LinearProduct::input_gradient, rows_, out, in));
    }
    if (needs[1]) {
      dw = Tensor::empty(w_.shape());
      gemm(true, false, out, in, rows_, 1.0f, u.data(), out, std::as_const(x_).data(), in, 0.0f, dw.data(), in,
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

namespace {

// linear, then the activation `then` where there is one (linear_activation).
Tensor affine(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Tensor& residual_in,
              const Tensor& into, const std::optional<Activation>& then, bool keep_packed) {
  check(x_in.defined() && weight_in.defined(), "linear: undefined input or weight");
  check(weight_in.dim() == 2, "linear: weight must be 2-D (out, in), got ", weight_in.shape());
  const int64_t out_features = weight_in.size(0), in_features = weight_in.size(1);
  check(x_in.dim() >= 1 && x_in.size(-1) == in_features, "linear: weight ", weight_in.shape(), " expects ", in_features,
        " input features, input is ", x_in.shape());
  if (bias_in.defined())
    check(bias_in.shape() == Shape{out_features}, "linear: bias ", bias_in.shape(), " does not match weight ",
          weight_in.shape(), " (expects [", out_features, "])");
  // Read-only from here on: a non-const data() would count as a write and move the
  // weights' version, dropping their packed form.
  const Tensor x = x_in.contiguous(), w = weight_in.contiguous();
  const Tensor bias = bias_in.defined() ? bias_in.contiguous() : Tensor();
  Shape out_shape = x.shape();
  out_shape.back() = out_features;
  const int64_t rows = numel(Shape(x.shape().begin(), x.shape().end() - 1));
  if (residual_in.defined())
    check(residual_in.shape() == out_shape, "linear: residual ", residual_in.shape(), " does not match the output ",
          out_shape, " of input ", x.shape(), " and weight ", w.shape());
  const Tensor residual = residual_in.defined() ? residual_in.contiguous() : Tensor();
  const bool record = needs_grad({x, w, bias, residual});
  if (into.defined())
    check(!record && into.shape() == out_shape && into.is_contiguous(), "linear: output destination ", into.shape(),
          " for input ", x.shape(), " and weight ", w.shape(), " must be contiguous, of the output's shape ",
          out_shape, ", and used outside a recorded graph");
  Tensor out = into.defined() ? into : Tensor::empty(out_shape);
  // A recorded activation keeps the linear's output for its transports, so writes its own;
  // otherwise it overwrites the output in place.
  Tensor activated = then && record ? Tensor::empty(out_shape) : out;
  // Each row starts from residual + bias; the product adds onto it (engine/gemm.h).
  GemmEpilogue epilogue{bias.defined() ? bias.data() : nullptr, residual.defined() ? residual.data() : nullptr,
                        out_features};
  if (then) epilogue.map = row_map(*then), epilogue.mapped = activated.data(), epilogue.ldm = out_features;
  count_multiply_adds(rows * out_features * in_features);
  const GemmKernel kernel = linear_kernel(LinearProduct::forward, rows, out_features, in_features);
  if (keep_packed && kernel == GemmKernel::widest && avx512_gemm_available() && rows > 0 && in_features > 0 &&
      out_features > 0)
    gemm_with_epilogue(rows, 1.0f, x.data(), in_features, *packed_weights(w), epilogue, out.data(), out_features);
  else
    gemm_with_epilogue(false, true, rows, out_features, in_features, 1.0f, x.data(), in_features, w.data(),
                       in_features, epilogue, out.data(), out_features, kernel);
  if (record) attach(out, std::make_shared<LinearNode>(x.detach(), w.detach(), rows), {x, w, bias, residual});
  if (then) record_activation(out, activated, *then);
  return then ? activated : out;
}

}  // namespace

LinearForwardKernel::LinearForwardKernel(GemmKernel kernel) {
  int none = 0;
  check(forward_kernel_override.compare_exchange_strong(none, 1 + static_cast<int>(kernel)),
        "LinearForwardKernel: another one is alive");
}
LinearForwardKernel::~LinearForwardKernel() { forward_kernel_override = 0; }

Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual, const Tensor& into,
              bool keep_packed) {
  return affine(x, weight, bias, residual, into, std::nullopt, keep_packed);
}

Tensor linear_activation(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation kind,
                         bool keep_packed) {
  return affine(x, weight, bias, {}, {}, kind, keep_packed);
}

}  // namespace adjoint
