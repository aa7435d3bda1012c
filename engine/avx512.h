// What the engine's hand-written AVX-512 kernels share: the attribute that compiles a
// function for AVX-512 (the build targets plain x86-64, and each kernel runs only after a
// run-time check), lane masks, and a 16 × 16 transpose in registers. Used by the GEMM
// (engine/gemm_avx512.cpp), the direct convolutions (ops/conv/direct.cpp) and Winograd
// (ops/conv/winograd.cpp, ops/conv/winograd_avx512.cpp). Include only in x86-64 code.
#pragma once
#if defined(__x86_64__)
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#define ADJOINT_AVX512 [[gnu::target("avx512f")]]

namespace adjoint {

// The lanes j with lo ≤ j < hi (clipped to the 16 lanes).
ADJOINT_AVX512 inline __mmask16 lanes_between(int64_t lo, int64_t hi) {
  lo = std::max<int64_t>(lo, 0), hi = std::min<int64_t>(hi, 16);
  if (hi <= lo) return 0;
  return static_cast<__mmask16>(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

// The first n lanes (none for n ≤ 0, all for n ≥ 16).
ADJOINT_AVX512 inline __mmask16 first_lanes(int64_t n) { return lanes_between(0, n); }

// GCC 12's AVX-512 shuffle, align and max intrinsics pass an "undefined" vector made by
// self-initialisation to their masked builtins, and -Wuninitialized reports it wherever they
// are inlined. The value is never read (the mask is all ones). Silenced for every file that
// includes this one: they are the kernel files, and the warning fires in their own code.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// rows[i] = row i of a 16 × 16 block → rows[i] = column i, in 24 shuffles (unpack pairs
// of rows, then pairs of pairs, then gather 128-bit lanes across the four groups of rows).
ADJOINT_AVX512 inline void transpose16(__m512 rows[16]) {
  __m512 t[16];
  for (int i = 0; i < 8; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(rows[2 * i], rows[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(rows[2 * i], rows[2 * i + 1]);
  }
  // u[g][e]: in 128-bit lane L, column 4L + e of rows 4g .. 4g + 3.
  __m512 u[4][4];
  for (int g = 0; g < 4; ++g) {
    const __m512d lo = _mm512_castps_pd(t[4 * g]), lo2 = _mm512_castps_pd(t[4 * g + 2]);
    const __m512d hi = _mm512_castps_pd(t[4 * g + 1]), hi2 = _mm512_castps_pd(t[4 * g + 3]);
    u[g][0] = _mm512_castpd_ps(_mm512_unpacklo_pd(lo, lo2));
    u[g][1] = _mm512_castpd_ps(_mm512_unpackhi_pd(lo, lo2));
    u[g][2] = _mm512_castpd_ps(_mm512_unpacklo_pd(hi, hi2));
    u[g][3] = _mm512_castpd_ps(_mm512_unpackhi_pd(hi, hi2));
  }
  for (int e = 0; e < 4; ++e) {
    const __m512 v0 = _mm512_shuffle_f32x4(u[0][e], u[1][e], 0x88), v1 = _mm512_shuffle_f32x4(u[0][e], u[1][e], 0xdd);
    const __m512 w0 = _mm512_shuffle_f32x4(u[2][e], u[3][e], 0x88), w1 = _mm512_shuffle_f32x4(u[2][e], u[3][e], 0xdd);
    rows[e] = _mm512_shuffle_f32x4(v0, w0, 0x88);
    rows[e + 4] = _mm512_shuffle_f32x4(v1, w1, 0x88);
    rows[e + 8] = _mm512_shuffle_f32x4(v0, w0, 0xdd);
    rows[e + 12] = _mm512_shuffle_f32x4(v1, w1, 0xdd);
  }
}

}  // namespace adjoint

#endif
