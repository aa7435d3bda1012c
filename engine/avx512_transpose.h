// A 16 × 16 block of floats transposed in AVX-512 registers: the packing of the engine's GEMM
// (engine/gemm_avx512.cpp) and Winograd's weight transform (ops/conv.cpp) turn rows into
// columns with it. Include only where AVX-512 code is compiled for x86-64.
#pragma once
#if defined(__x86_64__)
#include <immintrin.h>

namespace adjoint {

// GCC 12's AVX-512 shuffle intrinsics pass an "undefined" vector made by self-initialisation
// to their masked builtins, and -Wuninitialized reports it wherever they are inlined. The
// value is never read (the mask is all ones).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// rows[i] = row i of a 16 × 16 block → rows[i] = column i, in 24 shuffles (unpack pairs
// of rows, then pairs of pairs, then gather 128-bit lanes across the four groups of rows).
[[gnu::target("avx512f")]] inline void transpose16(__m512 rows[16]) {
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

#pragma GCC diagnostic pop

}  // namespace adjoint

#endif
