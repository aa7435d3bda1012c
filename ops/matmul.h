// Matrix products: matmul and the affine layer linear. Both fold leading dimensions into
// one GEMM where they can, since one large product runs far faster than many small ones.
// Both are (bi)linear maps, so every transport carries the exact vector-Jacobian product.
#pragma once
#include "engine/tensor.h"

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
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, const Tensor& residual = {},
              const Tensor& into = {});

// out[c·out_stride] = Σ_r m[r, c] for a row-major (rows, cols) matrix, summed in double in an
// order that does not depend on the thread count: the bias gradients of linear and bilinear
// layers. Walks the matrix row by row: a column at a time would read it strided.
void column_sums(const float* m, int64_t rows, int64_t cols, float* out, int64_t out_stride = 1);

}  // namespace adjoint
