// Row-major single-precision GEMM: C = alpha · op(A) · op(B) + beta · C, with op(A) M×K,
// op(B) K×N. Large products are split into column (or row) panels chosen from the shape
// alone, each a single-threaded cblas_sgemm run as a TBB task, so results are bitwise
// reproducible at any thread count and OpenBLAS never starts threads of its own.
#pragma once
#include <cstdint>

namespace adjoint {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Batched: `count` independent products, matrices at fixed strides. Parallel over the batch
// when each product is small, over panels when each is large.
void gemm_batched(int64_t count, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b,
                  float beta, float* C, int64_t ldc, int64_t stride_c);

// The OpenBLAS kernel family in use ("SkylakeX", "Haswell", ...). On first use the engine
// replaces a generic fallback (OpenBLAS older than the CPU) with the best family the CPU runs.
const char* blas_kernels();

}  // namespace adjoint
