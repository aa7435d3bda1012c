#include "engine/gemm_avx512.h"

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "engine/error.h"
#include "engine/threads.h"
#include "engine/vectorize.h"

#if defined(__x86_64__)
#include "engine/avx512.h"
#endif

namespace adjoint {

#if defined(__x86_64__)

namespace {

// The register tile: kMr rows × kNr columns of C, as kMr × 2 vectors of 16 floats.
constexpr int64_t kMr = kAvx512PanelRows;
constexpr int64_t kNr = kAvx512PanelCols;
// Blocks: op(B) kKc × kNc (about 1 MiB, in L2), op(A) kMc × kKc (240 KiB, in L2 or L1),
// a panel of op(A) kMr × kKc (12 KiB, in L1 while the block's kNc / kNr panels of op(B)
// pass over it).
// kKc and the 12-row tile were chosen on the shapes of ResNet's and VGG's convolutions
// (docs/benchmarks.md).
constexpr int64_t kKc = kAvx512DepthBlock;
constexpr int64_t kMc = 240;
constexpr int64_t kNc = 1024;

// The packed blocks of one thread, allocated on its first product. Products never nest on
// a thread (they start no tasks), so one pair of buffers per thread is enough.
struct PackBuffers {
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  std::unique_ptr<float, Free> a{static_cast<float*>(std::aligned_alloc(64, kMc * kKc * sizeof(float)))};
  std::unique_ptr<float, Free> b{static_cast<float*>(std::aligned_alloc(64, kKc * kNc * sizeof(float)))};
};
PackBuffers& pack_buffers() {
  thread_local PackBuffers buffers;
  if (!buffers.a || !buffers.b) throw Error("out of memory: the packing buffers of a matrix product");
  return buffers;
}

// A row-major matrix read along its rows, packed along its columns: for `count` ≤ 16 of
// its rows (the rest zero) and depth k in [0, kc), out[k·stride + r] = src[r·ld + k], written
// for r < width. One transpose per 16 values of depth.
ADJOINT_AVX512 void pack_transposed(const float* src, int64_t ld, int64_t count, int64_t kc, int64_t width,
                                    int64_t stride, float* out) {
  const __mmask16 store = first_lanes(width);
  for (int64_t k = 0; k < kc; k += 16) {
    const int64_t depth = std::min<int64_t>(16, kc - k);
    const __mmask16 load = first_lanes(depth);
    __m512 block[16];
    for (int64_t r = 0; r < 16; ++r)
      block[r] = r < count ? _mm512_maskz_loadu_ps(load, src + r * ld + k) : _mm512_setzero_ps();
    transpose16(block);
    for (int64_t i = 0; i < depth; ++i) _mm512_mask_storeu_ps(out + (k + i) * stride, store, block[i]);
  }
}

// A row-major matrix read across its rows: out[k·width + j] = src[k·ld + j] for j < count
// (zero for count ≤ j < width), width = 16 or 32.
ADJOINT_AVX512 void pack_straight(const float* src, int64_t ld, int64_t count, int64_t kc, int64_t width,
                                  float* out) {
  const __mmask16 first = first_lanes(std::min<int64_t>(count, 16));
  const __mmask16 second = first_lanes(std::clamp<int64_t>(count - 16, 0, 16));
  for (int64_t k = 0; k < kc; ++k) {
    const float* row = src + k * ld;
    float* to = out + k * width;
    if (width == 32) {
      _mm512_storeu_ps(to, _mm512_maskz_loadu_ps(first, row));
      _mm512_storeu_ps(to + 16, _mm512_maskz_loadu_ps(second, row + 16));
    } else {  // the 12-row panels of A (width 12 ≤ 16)
      _mm512_mask_storeu_ps(to, first_lanes(width), _mm512_maskz_loadu_ps(first, row));
    }
  }
}

// Panel p of the packed block of op(B): rows k0 .. k0 + kc, columns n0 .. n0 + count of
// op(B), as out[k·kNr + j].
ADJOINT_AVX512 void pack_b(bool tb, const float* B, int64_t ldb, int64_t k0, int64_t kc, int64_t n0, int64_t count,
                           float* out) {
  if (!tb) return pack_straight(B + k0 * ldb + n0, ldb, count, kc, kNr, out);
  // op(B)[k][j] = B[j][k]: two transposed halves of 16 columns each.
  pack_transposed(B + n0 * ldb + k0, ldb, std::min<int64_t>(count, 16), kc, 16, kNr, out);
  pack_transposed(B + (n0 + 16) * ldb + k0, ldb, std::max<int64_t>(count - 16, 0), kc, 16, kNr, out + 16);
}

// Panel of op(A): rows m0 .. m0 + count, depth k0 .. k0 + kc, as out[k·kMr + r].
ADJOINT_AVX512 void pack_a(bool ta, const float* A, int64_t lda, int64_t k0, int64_t kc, int64_t m0, int64_t count,
                           float* out) {
  if (ta) return pack_straight(A + k0 * lda + m0, lda, count, kc, kMr, out);
  pack_transposed(A + m0 * lda + k0, lda, count, kc, kMr, kMr, out);
}

// C tile (rows × cols ≤ kMr × kNr) = alpha · a·b + (first block ? start : C), with a and b
// packed panels of depth kc, and start = beta · C, or with an epilogue residual + bias
// (the tile's own corner of each). Edge tiles go through a full-size copy of C, so that
// every element of C meets the same operations wherever its tile lies.
ADJOINT_AVX512 void micro_kernel(int64_t kc, const float* __restrict a, const float* __restrict b, float* c,
                                 int64_t ldc, int64_t rows, int64_t cols, float alpha, float beta, bool first,
                                 const GemmEpilogue& epilogue) {
  __m512 acc[kMr][2];
  for (int64_t r = 0; r < kMr; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  for (int64_t k = 0; k < kc; ++k) {
    const __m512 b0 = _mm512_load_ps(b + k * kNr), b1 = _mm512_load_ps(b + k * kNr + 16);
#pragma GCC unroll 12
    for (int64_t r = 0; r < kMr; ++r) {
      const __m512 ar = _mm512_set1_ps(a[k * kMr + r]);
      acc[r][0] = _mm512_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(ar, b1, acc[r][1]);
    }
  }
  const bool full = rows == kMr && cols == kNr;
  alignas(64) float edge[kMr][kNr];
  float* out = full ? c : &edge[0][0];
  const int64_t ld = full ? ldc : kNr;
  // The first depth block starts from the epilogue's terms where there are any (C is not read).
  const bool starts_from_epilogue = first && !epilogue.empty();
  const bool reads_c = !starts_from_epilogue && (!first || beta != 0.0f);
  if (!full) {
    std::fill(&edge[0][0], &edge[0][0] + kMr * kNr, 0.0f);
    if (reads_c)
      for (int64_t r = 0; r < rows; ++r) std::copy(c + r * ldc, c + r * ldc + cols, edge[r]);
  }
  // Residual + bias, summed as a separate pass that fills C with them would (the same bits).
  alignas(64) float edge_start[kMr][kNr];
  const float* start_residual = epilogue.residual;
  const float* start_bias = epilogue.bias;
  int64_t ldr = epilogue.ldr;
  if (starts_from_epilogue && !full) {  // the edge tile's terms, as one residual of its size
    std::fill(&edge_start[0][0], &edge_start[0][0] + kMr * kNr, 0.0f);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < cols; ++j)
        edge_start[r][j] = !start_residual ? start_bias[j]
                           : !start_bias   ? start_residual[r * ldr + j]
                                           : start_residual[r * ldr + j] + start_bias[j];
    start_residual = &edge_start[0][0], start_bias = nullptr, ldr = kNr;
  }
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  for (int64_t r = 0; r < kMr; ++r)
    for (int h = 0; h < 2; ++h) {
      float* at = out + r * ld + 16 * h;
      __m512 v = _mm512_mul_ps(va, acc[r][h]);
      if (starts_from_epilogue) {
        __m512 start;
        if (!start_residual) start = _mm512_loadu_ps(start_bias + 16 * h);
        else if (!start_bias) start = _mm512_loadu_ps(start_residual + r * ldr + 16 * h);
        else start = _mm512_add_ps(_mm512_loadu_ps(start_residual + r * ldr + 16 * h), _mm512_loadu_ps(start_bias + 16 * h));
        v = _mm512_add_ps(v, start);
      } else if (reads_c) {
        const __m512 old = _mm512_loadu_ps(at);
        v = _mm512_add_ps(v, first ? _mm512_mul_ps(vb, old) : old);
      }
      _mm512_storeu_ps(at, v);
    }
  if (!full)
    for (int64_t r = 0; r < rows; ++r) std::copy(edge[r], edge[r] + cols, c + r * ldc);
}

// op(A) packed whole, in the layout of avx512_packed_a_panel (a depth block's panels lie as
// in the per-block buffer below).
ADJOINT_AVX512 void pack_all_of_a(bool ta, int64_t M, int64_t K, const float* A, int64_t lda, float* out) {
  // Row panels in parallel (a deep layer's weights are megabytes): a copy, the same at any
  // thread count.
  parallel_for(avx512_padded_rows(M) / kMr, std::max<int64_t>(1, 8192 / std::max<int64_t>(K, 1)), [&](int64_t p0, int64_t p1) {
    for (int64_t pc = 0; pc < K; pc += kKc) {
      const int64_t kc = std::min(kKc, K - pc);
      for (int64_t i = p0 * kMr; i < std::min(M, p1 * kMr); i += kMr)
        pack_a(ta, A, lda, pc, kc, i, std::min(kMr, M - i), out + avx512_packed_a_panel(M, K, i, pc));
    }
  });
}

// op(B) packed whole, in the layout of avx512_packed_b_panel (a depth block's column panels
// lie as in the per-block buffer below).
ADJOINT_AVX512 void pack_all_of_b(bool tb, int64_t N, int64_t K, const float* B, int64_t ldb, float* out) {
  const int64_t grain = std::max<int64_t>(1, 8192 / std::max<int64_t>(K, 1));
  parallel_for(avx512_padded_cols(N) / kNr, grain, [&](int64_t p0, int64_t p1) {
    for (int64_t pc = 0; pc < K; pc += kKc) {
      const int64_t kc = std::min(kKc, K - pc);
      for (int64_t j = p0 * kNr; j < std::min(N, p1 * kNr); j += kNr)
        pack_b(tb, B, ldb, pc, kc, j, std::min(kNr, N - j), out + avx512_packed_b_panel(N, K, j, pc));
    }
  });
}

// The epilogue's map over rows i .. i + count, columns j .. j + width of C (finished).
void map_rows(const GemmEpilogue& epilogue, float* C, int64_t ldc, int64_t i, int64_t count, int64_t j,
              int64_t width) {
  for (int64_t r = i; r < i + count; ++r)
    epilogue.map(C + r * ldc + j, epilogue.mapped + r * epilogue.ldm + j, width);
}

ADJOINT_AVX512 void product(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A,
                            int64_t lda, const float* B, int64_t ldb, float beta, float* C, int64_t ldc,
                            const float* packed_a, const GemmEpilogue& epilogue, const float* packed_b) {
  PackBuffers& buffers = pack_buffers();
  for (int64_t jc = 0; jc < N; jc += kNc) {
    const int64_t nc = std::min(kNc, N - jc);
    for (int64_t pc = 0; pc < K; pc += kKc) {
      const int64_t kc = std::min(kKc, K - pc);
      const bool last = pc + kc == K;
      const float* pb = buffers.b.get();
      if (packed_b) {
        pb = packed_b + avx512_packed_b_panel(N, K, jc, pc);
      } else {
        for (int64_t jr = 0; jr < nc; jr += kNr)
          pack_b(tb, B, ldb, pc, kc, jc + jr, std::min(kNr, nc - jr), buffers.b.get() + jr * kc);
      }
      for (int64_t ic = 0; ic < M; ic += kMc) {
        const int64_t mc = std::min(kMc, M - ic);
        const float* pa = buffers.a.get();
        if (packed_a) {
          pa = packed_a + avx512_packed_a_panel(M, K, ic, pc);
        } else {
          for (int64_t ir = 0; ir < mc; ir += kMr)
            pack_a(ta, A, lda, pc, kc, ic + ir, std::min(kMr, mc - ir), buffers.a.get() + ir * kc);
        }
        // A row panel (12 KiB) stays in L1 while the block's column panels of op(B) pass
        // from L2, so successive tiles of C lie side by side in the same 12 rows. Walking
        // down a column of tiles instead jumps 12 rows of C from tile to tile, which lost
        // to OpenBLAS where C is wide (docs/benchmarks.md, "The engine's GEMM on ViT-B/16's
        // linear layers").
        // After the last depth block, the map runs over a row panel's finished rows while
        // they are still in cache.
        for (int64_t ir = 0; ir < mc; ir += kMr) {
          for (int64_t jr = 0; jr < nc; jr += kNr)
            micro_kernel(kc, pa + ir * kc, pb + jr * kc, C + (ic + ir) * ldc + jc + jr, ldc, std::min(kMr, mc - ir),
                         std::min(kNr, nc - jr), alpha, beta, pc == 0, epilogue.at(ic + ir, jc + jr));
          if (last && epilogue.map) map_rows(epilogue, C, ldc, ic + ir, std::min(kMr, mc - ir), jc, nc);
        }
      }
    }
  }
}

}  // namespace

bool avx512_gemm_available() { return vector_isa() == VectorIsa::Avx512; }

void avx512_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                 const float* B, int64_t ldb, float beta, float* C, int64_t ldc, const float* packed_a,
                 const GemmEpilogue& epilogue, const float* packed_b) {
  check(avx512_gemm_available(), "avx512_gemm: this CPU has no AVX-512 (or run_widest is capped below it)");
  if (M == 0 || N == 0 || K == 0) throw Error("avx512_gemm: empty product (gemm handles those)");
  product(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, packed_a, epilogue, packed_b);
}

void avx512_pack_a(bool ta, int64_t M, int64_t K, const float* A, int64_t lda, float* out) {
  check(avx512_gemm_available(), "avx512_pack_a: this CPU has no AVX-512 (or run_widest is capped below it)");
  pack_all_of_a(ta, M, K, A, lda, out);
}

void avx512_pack_b(bool tb, int64_t N, int64_t K, const float* B, int64_t ldb, float* out) {
  check(avx512_gemm_available(), "avx512_pack_b: this CPU has no AVX-512 (or run_widest is capped below it)");
  pack_all_of_b(tb, N, K, B, ldb, out);
}

#else  // not x86-64: never available

bool avx512_gemm_available() { return false; }
void avx512_gemm(bool, bool, int64_t, int64_t, int64_t, float, const float*, int64_t, const float*, int64_t, float,
                 float*, int64_t, const float*, const GemmEpilogue&, const float*) {
  throw Error("avx512_gemm: not an x86-64 build");
}
void avx512_pack_b(bool, int64_t, int64_t, const float*, int64_t, float*) {
  throw Error("avx512_pack_b: not an x86-64 build");
}
void avx512_pack_a(bool, int64_t, int64_t, const float*, int64_t, float*) {
  throw Error("avx512_pack_a: not an x86-64 build");
}

#endif

}  // namespace adjoint
