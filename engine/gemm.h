// Row-major single-precision GEMM: C = alpha · op(A) · op(B) + beta · C, with op(A) M×K,
// op(B) K×N. When several threads run, a large product is split into column (or row)
// panels chosen from its shape, each a single-threaded cblas_sgemm run as a TBB task;
// OpenBLAS never starts threads of its own. Split or not, every element of C is summed in
// the same order (panels are multiples of the kernels' register tile and stay above
// OpenBLAS's small-matrix path), so results are bitwise the same at any thread count.
#pragma once
#include <cstdint>

namespace adjoint {

void gemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
          int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// As gemm, on the calling thread only: for callers that already run their products in
// parallel (conv2d over image blocks), where splitting again would only repack operands.
void gemm_serial(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                 int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc);

// Where matrix b of a batch starts, in elements from the base pointer:
//   (b / inner_count) · outer + (b % inner_count) · inner.
// With inner_count = 1 it is a plain fixed stride. Two levels address matrices that are not
// evenly spaced, such as head h of example n inside a packed (batch, tokens, 3, heads, dh)
// tensor: outer = tokens·3·heads·dh, inner_count = heads, inner = dh (rows 3·heads·dh apart).
struct BatchStrides {
  int64_t outer = 0;
  int64_t inner_count = 1;
  int64_t inner = 0;
  BatchStrides(int64_t stride = 0) : outer(stride) {}  // NOLINT: a single stride converts
  BatchStrides(int64_t outer_, int64_t inner_count_, int64_t inner_)
      : outer(outer_), inner_count(inner_count_), inner(inner_) {}
  int64_t at(int64_t b) const { return (b / inner_count) * outer + (b % inner_count) * inner; }
};

// Batched: `count` independent products, matrix b of A at A + stride_a.at(b) (likewise B, C).
// Parallel over the batch when each product is small, over panels when each is large.
void gemm_batched(int64_t count, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, float alpha,
                  const float* A, int64_t lda, BatchStrides stride_a, const float* B, int64_t ldb,
                  BatchStrides stride_b, float beta, float* C, int64_t ldc, BatchStrides stride_c);

// The OpenBLAS kernel family in use ("SkylakeX", "Haswell", ...). On first use the engine
// replaces a generic fallback (OpenBLAS older than the CPU) with the best family the CPU runs.
const char* blas_kernels();

}  // namespace adjoint
