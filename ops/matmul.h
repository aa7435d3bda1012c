// Matrix products: matmul and the affine layer linear. Both fold leading dimensions into
// one GEMM where they can, since one large product runs far faster than many small ones.
// Both are (bi)linear maps, so every transport carries the exact vector-Jacobian product.
#pragma once
#include "engine/gemm.h"
#include "engine/tensor.h"
#include "ops/activation.h"

namespace adjoint {

// a (M, K) · b (K, N) → (M, N).
// Batched: a (..., M, K) · b (..., K, N) with equal batch dimensions → (..., M, N).
// b 2-D with a of higher rank: a's leading dimensions are folded into one (rows, K) · (K, N).
Tensor matmul(const Tensor& a, const Tensor& b);

// x · weightᵀ + bias, like torch.nn.functional.linear: x (..., in), weight (out, in),
// bias (out) or undefined → (..., out). The leading dimensions of x fold into one GEMM.
// With `residual` (the output's shape): residual + x · weightᵀ + bias, a residual
// connection's sum made by the product itself: the GEMM accumulates onto residual + bias,
// where a separate add would make another pass over three tensors.
//
// With `into` (contiguous, the output's shape, possibly a view of a larger tensor) and no
// graph recorded: the output is written there and `into` returned, so that a caller that
// assembles a result from blocks of rows (models/layers.h rowwise_in_chunks) copies nothing.
//
// With `keep_packed` (an eval-mode layer, whose weights change only when something writes
// them): where the forward runs on the engine's kernel, the weights' packed form is kept with
// them (Tensor::prepared) and made once per version of their values. Without it (a training
// step, which changes them every step) each call packs its own and frees it. The same bits.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, const Tensor& residual = {},
              const Tensor& into = {}, bool keep_packed = false);

// activation(linear(x, weight, bias), kind), one op: where linear's forward runs on the
// engine's kernel (kLinearRoutes, ops/matmul.cpp) the activation is applied to the output's
// rows as the product finishes them, while they are in cache; elsewhere after it. The bits of
// the two ops. Recorded, the graph is theirs: the linear's output is kept for the
// activation's transports.
Tensor linear_activation(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation kind,
                         bool keep_packed = false);

// While alive, linear's forward runs on `kernel` for every shape instead of the route
// table's choice (ops/matmul.cpp kLinearRoutes): tests compare both paths bit for bit. One
// at a time.
class LinearForwardKernel {
 public:
  explicit LinearForwardKernel(GemmKernel kernel);
  ~LinearForwardKernel();
  LinearForwardKernel(const LinearForwardKernel&) = delete;
  LinearForwardKernel& operator=(const LinearForwardKernel&) = delete;
};

// out[c·out_stride] = Σ_r m[r, c] for a row-major (rows, cols) matrix, summed in double in an
// order that does not depend on the thread count: the bias gradients of linear and bilinear
// layers. Walks the matrix row by row: a column at a time would read it strided.
void column_sums(const float* m, int64_t rows, int64_t cols, float* out, int64_t out_stride = 1);

}  // namespace adjoint
