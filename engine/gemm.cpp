#include "engine/gemm.h"

#include <cblas.h>
#include <sys/mman.h>

#include <time.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "engine/error.h"
#include "engine/gemm_avx512.h"
#include "engine/threads.h"

// OpenBLAS built with DYNAMIC_ARCH (Debian's) picks its kernels from the CPU model when
// the library loads. Models newer than the library (e.g. Emerald Rapids, family 6 model
// 207, with OpenBLAS 0.3.21) fall back to the generic "Prescott" SSE3 kernels, five times
// slower than the AVX-512 ones on the same chip. These two entry points re-run that choice;
// they are weak so that an OpenBLAS built for one fixed CPU (without them) still links.
extern "C" {
void gotoblas_dynamic_init(void) __attribute__((weak));
void gotoblas_dynamic_quit(void) __attribute__((weak));
char* openblas_get_corename(void) __attribute__((weak));
}

namespace adjoint {

namespace {

// Re-selects OpenBLAS's kernels once, before the first product, when it fell back to a
// generic core on a CPU that has AVX-512 or AVX2. A user's OPENBLAS_CORETYPE is respected.
void select_blas_kernels() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit || !openblas_get_corename) return;
    if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return;
    const char* core = openblas_get_corename();
    const bool generic = core == nullptr || std::strcmp(core, "Prescott") == 0 || std::strcmp(core, "Core2") == 0 ||
                         std::strcmp(core, "Nehalem") == 0 || std::strcmp(core, "Sandybridge") == 0;
    if (!generic) return;
    __builtin_cpu_init();
    const char* wanted = nullptr;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl"))
      wanted = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      wanted = "Haswell";
    if (wanted == nullptr || std::strcmp(core, wanted) == 0) return;
    // The library reads the variable only inside gotoblas_dynamic_init; unset it after so
    // that child processes choose for themselves.
    setenv("OPENBLAS_CORETYPE", wanted, 1);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");
  });
}

// OpenBLAS maps a work buffer (128 MiB in Debian's build, plus guard pages) on a thread's
// first product, and when that mapping fails (the address space is exhausted, ulimit -v)
// blas_memory_alloc retries it forever at 100% CPU. So a thread's first product first
// maps and unmaps a region of that size itself, and fails with "out of memory" if it
// cannot; later products reuse the buffer OpenBLAS keeps.
constexpr size_t kBlasBufferBytes = (size_t(128) << 20) + (size_t(1) << 20);

void check_blas_buffer() {
  thread_local bool mapped_once = false;
  if (mapped_once) return;
  void* region = ::mmap(nullptr, kBlasBufferBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (region == MAP_FAILED)
    throw Error(cat("out of memory: cannot map the ", kBlasBufferBytes >> 20,
                    " MiB work buffer of a matrix product (OpenBLAS); is the address space limited (ulimit -v)?"));
  ::munmap(region, kBlasBufferBytes);
  mapped_once = true;
}

// Whether a BlasTime meter runs, and its tally in nanoseconds. Atomic: products run on any
// thread, and the check costs one load per product when nothing is measured.
std::atomic<bool> timing_blas{false};
std::atomic<int64_t> blas_nanoseconds{0};

int64_t thread_cpu_nanoseconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return int64_t(t.tv_sec) * 1000000000 + int64_t(t.tv_nsec);
}

// One single-threaded sgemm (OpenBLAS is pinned to one thread by engine/threads.cpp).
void sgemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
           int64_t ldb, float beta, float* C, int64_t ldc) {
  check_blas_buffer();
  const bool timed = timing_blas.load(std::memory_order_relaxed);
  const int64_t start = timed ? thread_cpu_nanoseconds() : 0;
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, static_cast<int>(M),
              static_cast<int>(N), static_cast<int>(K), alpha, A, static_cast<int>(lda), B, static_cast<int>(ldb), beta,
              C, static_cast<int>(ldc));
  if (timed) blas_nanoseconds.fetch_add(thread_cpu_nanoseconds() - start, std::memory_order_relaxed);
}

// One product on the calling thread, by the kernels asked for (see GemmKernel). An
// epilogue only reaches the AVX-512 kernels (gemm_with_epilogue fills C for OpenBLAS).
void product(GemmKernel kernel, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
             int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
             const GemmEpilogue& epilogue = {}) {
  if (kernel == GemmKernel::widest && avx512_gemm_available())
    return avx512_gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, nullptr, epilogue);
  check(epilogue.empty(), "gemm: an epilogue on OpenBLAS's kernels (fill C first)");
  sgemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

// Work below which a product is not worth splitting (flops): too little to pay for handing
// it to other threads.
constexpr double kSplitFlops = 1.6e7;
// Target panel extent. Every panel repacks the operand that all panels share, so narrower
// panels lose part of sgemm's rate (docs/benchmarks.md); the thread count sets how few
// there may be (panel_width).
constexpr int64_t kPanel = 1024;
// No panel narrower than this (the packing of the other operand would dominate).
constexpr int64_t kMinPanel = 128;
// Panels are multiples of the kernels' register tile, so that every element of C is
// computed by the same kernel path, with the same summation order, split or not.
constexpr int64_t kTile = 16;
// OpenBLAS runs products with M·N·K below about 100³ through separate small-matrix
// kernels that sum in another order; no panel may fall below that.
constexpr double kSmallMatrix = 1.0e6;

// Splits `extent` into panels of about kPanel, as equal as the tile allows, and into a
// multiple of the thread count of them (at least one each, so that the cores share evenly),
// none narrower than the floor. `other` is the product's other output extent and K its
// depth. The bits do not depend on the split (see the top of gemm.h).
int64_t panel_width(int64_t extent, int64_t other, int64_t K) {
  const int64_t floor_width = std::max<int64_t>(kMinPanel, static_cast<int64_t>(kSmallMatrix / double(other * K)) + 1);
  const int64_t threads = std::max(1, num_threads());
  int64_t count = std::max<int64_t>(1, (extent + kPanel / 2) / kPanel);
  count = (count + threads - 1) / threads * threads;
  count = std::max<int64_t>(1, std::min(count, extent / floor_width));
  const int64_t width = (extent + count - 1) / count;
  return (width + kTile - 1) / kTile * kTile;
}

// C = beta · C, the whole product when K = 0 (BLAS rejects a zero leading dimension).
void scale(int64_t M, int64_t N, float beta, float* C, int64_t ldc) {
  for (int64_t i = 0; i < M; ++i) {
    float* row = C + i * ldc;
    if (beta == 0.0f)
      std::fill(row, row + N, 0.0f);
    else
      for (int64_t j = 0; j < N; ++j) row[j] *= beta;
  }
}

// A product of K > 0, split into panels across threads where it is large enough.
void split_product(GemmKernel kernel, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                   int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                   const GemmEpilogue& epilogue) {
  select_blas_kernels();
  const double flops = 2.0 * double(M) * double(N) * double(K);
  if (flops < kSplitFlops || num_threads() == 1)
    return product(kernel, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, epilogue);
  if (N >= M) {  // column panels: C[:, j0:j1] = op(A) · op(B)[:, j0:j1]
    const int64_t width = panel_width(N, M, K);
    if (width >= N) return product(kernel, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, epilogue);
    parallel_for(N, width, [&](int64_t j0, int64_t j1) {
      const float* Bj = tb ? B + j0 * ldb : B + j0;
      product(kernel, ta, tb, M, j1 - j0, K, alpha, A, lda, Bj, ldb, beta, C + j0, ldc, epilogue.at(0, j0));
    });
  } else {  // row panels: C[i0:i1, :] = op(A)[i0:i1, :] · op(B)
    const int64_t width = panel_width(M, N, K);
    if (width >= M) return product(kernel, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, epilogue);
    parallel_for(M, width, [&](int64_t i0, int64_t i1) {
      const float* Ai = ta ? A + i0 : A + i0 * lda;
      product(kernel, ta, tb, i1 - i0, N, K, alpha, Ai, lda, B, ldb, beta, C + i0 * ldc, ldc, epilogue.at(i0, 0));
    });
  }
}

// C = residual + bias, row by row (either may be absent, not both).
void fill_from(const GemmEpilogue& e, int64_t M, int64_t N, float* C, int64_t ldc) {
  parallel_for(M, 1024, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* row = C + r * ldc;
      const float* residual = e.residual ? e.residual + r * e.ldr : nullptr;
      if (!residual) std::copy(e.bias, e.bias + N, row);
      else if (!e.bias) std::copy(residual, residual + N, row);
      else
        for (int64_t c = 0; c < N; ++c) row[c] = residual[c] + e.bias[c];
    }
  });
}

// C = map(C) where the epilogue has a map, row by row (the kernels that cannot fold it).
void map_after(const GemmEpilogue& e, int64_t M, int64_t N, float* C, int64_t ldc) {
  if (!e.map) return;
  parallel_for(M, std::max<int64_t>(1, 16384 / N), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) e.map(C + r * ldc, e.mapped + r * e.ldm, N);
  });
}

}  // namespace

void gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda, const float* B,
          int64_t ldb, float beta, float* C, int64_t ldc, GemmKernel kernel) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale(M, N, beta, C, ldc);
  split_product(kernel, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, {});
}

void gemm_with_epilogue(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                        const float* B, int64_t ldb, const GemmEpilogue& epilogue, float* C, int64_t ldc,
                        GemmKernel kernel) {
  if (M == 0 || N == 0) return;
  if (kernel != GemmKernel::widest || !avx512_gemm_available() || K == 0) {
    if (epilogue.empty()) {
      gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, 0.0f, C, ldc, kernel);
    } else {
      fill_from(epilogue, M, N, C, ldc);
      gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, 1.0f, C, ldc, kernel);
    }
    return map_after(epilogue, M, N, C, ldc);
  }
  split_product(kernel, ta, tb, M, N, K, alpha, A, lda, B, ldb, 0.0f, C, ldc, epilogue);
}

void PackedB::Free::operator()(float* p) const { std::free(p); }

PackedB::PackedB(bool trans_b, int64_t K, int64_t N, const float* B, int64_t ldb) : K_(K), N_(N) {
  check(avx512_gemm_available(), "PackedB: the packed layout is read only by the AVX-512 kernels, absent here");
  check(K > 0 && N > 0, "PackedB: empty op(B) (", K, " × ", N, ")");
  const int64_t size = (avx512_packed_b_size(N, K) + 15) / 16 * 16;  // whole 64-byte lines
  packed_.reset(static_cast<float*>(std::aligned_alloc(64, size_t(size) * sizeof(float))));
  if (!packed_) throw Error(cat("out of memory: the packed weights of a product (", K, " × ", N, ")"));
  avx512_pack_b(trans_b, N, K, B, ldb, packed_.get());
}

int64_t PackedB::bytes() const { return avx512_packed_b_size(N_, K_) * int64_t(sizeof(float)); }

void gemm_with_epilogue(int64_t M, float alpha, const float* A, int64_t lda, const PackedB& b,
                        const GemmEpilogue& epilogue, float* C, int64_t ldc) {
  if (M == 0) return;
  const int64_t N = b.N_, K = b.K_;
  const auto rows = [&](int64_t i0, int64_t i1) {
    avx512_gemm(false, false, i1 - i0, N, K, alpha, A + i0 * lda, lda, nullptr, 0, 0.0f, C + i0 * ldc, ldc, nullptr,
                epilogue.at(i0, 0), b.packed_.get());
  };
  const double flops = 2.0 * double(M) * double(N) * double(K);
  if (flops < kSplitFlops || num_threads() == 1) return rows(0, M);
  parallel_for(M, panel_width(M, N, K), rows);
}

void gemm_serial(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc, GemmKernel kernel) {
  if (M == 0 || N == 0) return;
  if (K == 0) return scale(M, N, beta, C, ldc);
  select_blas_kernels();
  product(kernel, ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

PackedA::PackedA(bool trans_a, int64_t M, int64_t K, const float* A, int64_t lda, GemmKernel kernel)
    : trans_a_(trans_a), M_(M), K_(K), A_(A), lda_(lda) {
  if (kernel != GemmKernel::widest || !avx512_gemm_available() || M == 0 || K == 0) return;
  owned_.reset(new float[static_cast<size_t>(avx512_packed_a_size(M, K))]);
  avx512_pack_a(trans_a, M, K, A, lda, owned_.get());
  packed_ = owned_.get();
}

PackedA::PackedA(int64_t M, int64_t K, const float* packed) : M_(M), K_(K), packed_(packed) {
  check(avx512_gemm_available(), "PackedA: a packed layout without the AVX-512 kernels that read it");
}

void gemm_serial(const PackedA& a, bool tb, int64_t N, float alpha, const float* B, int64_t ldb, float beta, float* C,
                 int64_t ldc) {
  if (!a.packed_ || N == 0) return gemm_serial(a.trans_a_, tb, a.M_, N, a.K_, alpha, a.A_, a.lda_, B, ldb, beta, C, ldc);
  avx512_gemm(a.trans_a_, tb, a.M_, N, a.K_, alpha, a.A_, a.lda_, B, ldb, beta, C, ldc, a.packed_);
}

void gemm(const PackedA& a, bool tb, int64_t N, float alpha, const float* B, int64_t ldb, float beta, float* C,
          int64_t ldc) {
  // Unpacked (OpenBLAS's kernels): the plain product, which may split by rows as well.
  if (!a.packed_) return gemm(a.trans_a_, tb, a.M_, N, a.K_, alpha, a.A_, a.lda_, B, ldb, beta, C, ldc);
  const int64_t M = a.rows(), K = a.depth();
  const double flops = 2.0 * double(M) * double(N) * double(K);
  if (N == 0 || flops < kSplitFlops || num_threads() == 1)
    return gemm_serial(a, tb, N, alpha, B, ldb, beta, C, ldc);
  const int64_t width = panel_width(N, M, K);  // column panels: A is shared
  parallel_for(N, width, [&](int64_t j0, int64_t j1) {
    gemm_serial(a, tb, j1 - j0, alpha, tb ? B + j0 * ldb : B + j0, ldb, beta, C + j0, ldc);
  });
}

void gemm_batched(int64_t count, bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                  int64_t lda, BatchStrides stride_a, const float* B, int64_t ldb, BatchStrides stride_b, float beta,
                  float* C, int64_t ldc, BatchStrides stride_c) {
  if (count == 0 || M == 0 || N == 0) return;
  const double flops = 2.0 * double(M) * double(N) * double(K);
  if (flops >= kSplitFlops || count == 1) {  // each product is big: split inside it
    for (int64_t b = 0; b < count; ++b)
      gemm(ta, tb, M, N, K, alpha, A + stride_a.at(b), lda, B + stride_b.at(b), ldb, beta, C + stride_c.at(b), ldc);
    return;
  }
  // Small products: several per task, about kSplitFlops of work each.
  const int64_t grain = std::max<int64_t>(1, static_cast<int64_t>(kSplitFlops / std::max(flops, 1.0)));
  parallel_for(count, grain, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      gemm_serial(ta, tb, M, N, K, alpha, A + stride_a.at(b), lda, B + stride_b.at(b), ldb, beta, C + stride_c.at(b),
                  ldc);
  });
}

BlasTime::BlasTime() {
  check(!timing_blas.exchange(true), "BlasTime: another meter is already running");
  blas_nanoseconds = 0;
}

BlasTime::~BlasTime() { timing_blas = false; }

double BlasTime::seconds() const { return 1e-9 * double(blas_nanoseconds.load()); }

const char* widest_gemm_kernels() { return avx512_gemm_available() ? "adjoint AVX-512" : blas_kernels(); }

const char* blas_kernels() {
  select_blas_kernels();
  return openblas_get_corename ? openblas_get_corename() : "unknown";
}

}  // namespace adjoint
