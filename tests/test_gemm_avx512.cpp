// The engine's own AVX-512 GEMM (engine/gemm_avx512.h): every transpose combination, edge
// tiles, depth blocks, alpha and beta and leading dimensions against a double-precision
// product; the same bits when gemm splits it across threads. Skipped on CPUs without AVX-512.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "engine/gemm.h"
#include "engine/gemm_avx512.h"
#include "engine/random.h"
#include "engine/threads.h"

using namespace adjoint;

namespace {

std::vector<float> random_values(int64_t n, uint64_t seed) {
  Generator gen(seed);
  return uniform({n}, -1.0f, 1.0f, gen).to_vector();
}

// Element (i, j) of op(X) for a row-major X with leading dimension ld.
double at(const std::vector<float>& x, bool trans, int64_t ld, int64_t i, int64_t j) {
  return trans ? x[j * ld + i] : x[i * ld + j];
}

struct Case {
  bool ta, tb;
  int64_t M, N, K;
  float alpha, beta;
};

// Runs one case through `run` (avx512_gemm or gemm with GemmKernel::widest) with padded
// leading dimensions, and checks every element of C against the double product, and that
// the padding between rows of C is untouched.
template <class Run>
void check_case(const Case& c, Run run) {
  CAPTURE(c.ta);
  CAPTURE(c.tb);
  CAPTURE(c.M);
  CAPTURE(c.N);
  CAPTURE(c.K);
  const int64_t lda = (c.ta ? c.M : c.K) + 3, ldb = (c.tb ? c.K : c.N) + 5, ldc = c.N + 7;
  const std::vector<float> A = random_values((c.ta ? c.K : c.M) * lda, 1);
  const std::vector<float> B = random_values((c.tb ? c.N : c.K) * ldb, 2);
  const std::vector<float> C0 = random_values(c.M * ldc, 3);
  std::vector<float> C = C0;
  run(c, A.data(), lda, B.data(), ldb, C.data(), ldc);
  double worst = 0, largest = 0;
  bool padding_kept = true;
  for (int64_t i = 0; i < c.M; ++i) {
    for (int64_t j = 0; j < c.N; ++j) {
      double sum = 0;
      for (int64_t k = 0; k < c.K; ++k) sum += at(A, c.ta, lda, i, k) * at(B, c.tb, ldb, k, j);
      const double want = c.alpha * sum + (c.beta == 0.0f ? 0.0 : c.beta * double(C0[i * ldc + j]));
      worst = std::max(worst, std::abs(want - double(C[i * ldc + j])));
      largest = std::max(largest, std::abs(want));
    }
    for (int64_t j = c.N; j < ldc; ++j) padding_kept = padding_kept && C[i * ldc + j] == C0[i * ldc + j];
  }
  CHECK(largest > 0.1);
  CHECK(worst < 1e-5 * double(c.K + 1));
  CHECK(padding_kept);
}

const std::vector<Case> kCases = {
    {false, false, 12, 32, 16, 1.0f, 0.0f},   // one full tile
    {false, false, 25, 70, 300, 1.0f, 0.0f},  // edge tiles in both directions, two depth blocks
    {true, false, 37, 45, 513, 0.5f, 1.0f},   // A transposed, three depth blocks, accumulate
    {false, true, 250, 33, 19, 2.0f, -0.5f},  // B transposed, two row blocks, general beta
    {true, true, 5, 1100, 40, 1.0f, 1.0f},    // both transposed, two column blocks
    {false, false, 1, 1, 1, 1.0f, 0.0f},      // the smallest product
};

}  // namespace

TEST_CASE("avx512_gemm: matches a double product for every transpose, edge, block and alpha/beta" *
          doctest::skip(!avx512_gemm_available())) {
  for (const Case& c : kCases)
    check_case(c, [](const Case& c, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
      avx512_gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A, lda, B, ldb, c.beta, C, ldc);
    });
}

TEST_CASE("gemm with the widest kernels: the same bits split across threads or not" *
          doctest::skip(!avx512_gemm_available())) {
  const int saved = num_threads();
  // 200 × 900 × 300: above gemm's split threshold, uneven panels.
  const int64_t M = 200, N = 900, K = 300;
  const std::vector<float> A = random_values(M * K, 4), B = random_values(K * N, 5);
  std::vector<float> one(size_t(M * N)), two(size_t(M * N));
  set_num_threads(1);
  gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, one.data(), N, GemmKernel::widest);
  set_num_threads(2);
  gemm(false, false, M, N, K, 1.0f, A.data(), K, B.data(), N, 0.0f, two.data(), N, GemmKernel::widest);
  set_num_threads(saved);
  CHECK(one == two);
  check_case({false, false, M, N, K, 1.0f, 0.0f},
             [](const Case& c, const float* A, int64_t lda, const float* B, int64_t ldb, float* C, int64_t ldc) {
               gemm(c.ta, c.tb, c.M, c.N, c.K, c.alpha, A, lda, B, ldb, c.beta, C, ldc, GemmKernel::widest);
             });
  CHECK(std::string(widest_gemm_kernels()) == "adjoint AVX-512");
}

TEST_CASE("PackedA: products with op(A) packed once give the bits of the unpacked product, on either kernel") {
  // 100 × 300 (three row blocks of the AVX-512 kernel at depth 300: two depth blocks), both
  // transposes of A, several products sharing one packing.
  const int64_t M = 100, K = 300, N = 70;
  const std::vector<float> A = random_values(M * K, 6), B = random_values(K * N, 7);
  for (const GemmKernel kernel : {GemmKernel::blas, GemmKernel::widest})
    for (const bool ta : {false, true}) {
      CAPTURE(ta);
      const int64_t lda = ta ? M : K;  // A holds op(A) or its transpose, row-major
      const PackedA packed(ta, M, K, A.data(), lda, kernel);
      for (int repeat = 0; repeat < 2; ++repeat) {
        std::vector<float> with_packed(size_t(M * N), 1.0f), plain(size_t(M * N), 1.0f);
        gemm_serial(packed, false, N, 0.5f, B.data(), N, 1.0f, with_packed.data(), N);
        gemm_serial(ta, false, M, N, K, 0.5f, A.data(), lda, B.data(), N, 1.0f, plain.data(), N, kernel);
        CHECK(with_packed == plain);
      }
    }
}

TEST_CASE("gemm_with_epilogue: bias and residual added in the product give the bits of filling C first, split or not") {
  // Column panels (N > M) and row panels (M > N) at 2 threads, edge tiles, two depth blocks;
  // bias only, residual only (leading dimension wider than C's), both.
  const int saved = num_threads();
  for (const auto& [M, N] : {std::pair<int64_t, int64_t>{250, 900}, {900, 250}}) {
    const int64_t K = 300, ldc = N + 7, ldr = N + 3;
    CAPTURE(M);
    const std::vector<float> A = random_values(M * K, 8), B = random_values(N * K, 9);
    const std::vector<float> bias = random_values(N, 10), residual = random_values(M * ldr, 11);
    for (int terms = 1; terms <= 3; ++terms) {
      CAPTURE(terms);
      const GemmEpilogue epilogue{terms & 1 ? bias.data() : nullptr, terms & 2 ? residual.data() : nullptr, ldr};
      for (const GemmKernel kernel : {GemmKernel::blas, GemmKernel::widest}) {
        // The definition: C filled with residual + bias, then the product with beta = 1.
        std::vector<float> filled(size_t(M * ldc), 0.0f);
        for (int64_t i = 0; i < M; ++i)
          for (int64_t j = 0; j < N; ++j) {
            const float* r = epilogue.residual;
            const float* b = epilogue.bias;
            filled[i * ldc + j] = !r ? b[j] : !b ? r[i * ldr + j] : r[i * ldr + j] + b[j];
          }
        set_num_threads(1);
        gemm(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, 1.0f, filled.data(), ldc, kernel);
        for (const int threads : {1, 2}) {
          set_num_threads(threads);
          std::vector<float> C(size_t(M * ldc), 0.0f);
          gemm_with_epilogue(false, true, M, N, K, 1.0f, A.data(), K, B.data(), K, epilogue, C.data(), ldc, kernel);
          CHECK(C == filled);
        }
        // And against the double product, within float rounding of a 300-term sum.
        double worst = 0;
        for (int64_t i = 0; i < M; i += 7)
          for (int64_t j = 0; j < N; j += 5) {
            double want = (epilogue.bias ? bias[j] : 0.0) + (epilogue.residual ? residual[i * ldr + j] : 0.0);
            for (int64_t k = 0; k < K; ++k) want += double(A[i * K + k]) * double(B[j * K + k]);
            worst = std::max(worst, std::abs(want - double(filled[i * ldc + j])));
          }
        CHECK(worst < 1e-5 * double(K + 1));
      }
    }
  }
  set_num_threads(saved);
}
