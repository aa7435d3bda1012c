#include "engine/gemm.h"

#include <cblas.h>

#include <algorithm>

#include "engine/threads.h"

namespace adjoint {

namespace {

// One single-threaded sgemm (OpenBLAS is pinned to one thread by engine/threads.cpp).
void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
           const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans,
              static_cast<int>(M), static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B,
              static_cast<int>(ldb), beta, C, static_cast<int>(ldc));
}

// Work below which a product is not worth splitting (flops).
constexpr double kSplitFlops = 4.0e6;
// Panel width: wide enough to keep sgemm near peak, narrow enough to feed 2+ cores.
constexpr int64_t kPanel = 256;

}  // namespace

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
          const float* B, int64_t ldb, float beta, float* C, int64_t ldc) {
  if (M == 0 || N == 0) return;
  const double flops = 2.0 * double(M) * double(N) * double(K);
  if (flops < kSplitFlops || num_threads() == 1 || (M <= kPanel && N <= kPanel)) {
    sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
    return;
  }
  if (N >= M) {  // column panels: C[:, j0:j1] = op(A) · op(B)[:, j0:j1]
    parallel_for(N, kPanel, [&](int64_t j0, int64_t j1) {
      const float* Bj = tb ? B + j0 * ldb : B + j0;
      sgemm(ta, tb, M, j1 - j0, K, alpha, A, lda, Bj, ldb, beta, C + j0, ldc);
    });
  } else {  // row panels: C[i0:i1, :] = op(A)[i0:i1, :] · op(B)
    parallel_for(M, kPanel, [&](int64_t i0, int64_t i1) {
      const float* Ai = ta ? A + i0 : A + i0 * lda;
      sgemm(ta, tb, i1 - i0, N, K, alpha, Ai, lda, B, ldb, beta, C + i0 * ldc, ldc);
    });
  }
}

void gemm_batched(int64_t count, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, int64_t stride_a, const float* B, int64_t ldb, int64_t stride_b, float beta, float* C,
                  int64_t ldc, int64_t stride_c) {
  const double flops = 2.0 * double(M) * double(N) * double(K);
  if (flops >= 8 * kSplitFlops) {  // each product is big: split inside it
    for (int64_t b = 0; b < count; ++b)
      gemm(ta, tb, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb, beta, C + b * stride_c, ldc);
    return;
  }
  parallel_for(count, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      sgemm(ta, tb, M, N, K, alpha, A + b * stride_a, lda, B + b * stride_b, ldb, beta, C + b * stride_c, ldc);
  });
}

}  // namespace adjoint
