#include "ops/conv/winograd_avx512.h"

#include <algorithm>

#include "engine/error.h"

#if defined(__x86_64__)
#include "engine/avx512.h"
#endif

namespace adjoint {

#if defined(__x86_64__)

namespace {

// Columns q .. q + 16 of a row W wide, zero outside it (those lanes are not read).
ADJOINT_AVX512 __m512 load_inside(const float* row, int64_t q, int64_t W) {
  return _mm512_maskz_loadu_ps(lanes_between(-q, W - q), row + q);
}

// Lane t of the result: lane 2t (even) or 2t + 1 (odd) of the 32 lanes lo, hi.
ADJOINT_AVX512 __m512 even_lanes(__m512 lo, __m512 hi) {
  return _mm512_permutex2var_ps(lo, _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30), hi);
}
ADJOINT_AVX512 __m512 odd_lanes(__m512 lo, __m512 hi) {
  return _mm512_permutex2var_ps(lo, _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31), hi);
}

// Lane 0 = lane 15 of `before`, lanes 1 .. 16 = lanes 0 .. 15 of `v`: v shifted up a lane.
ADJOINT_AVX512 __m512 shifted_up(__m512 v, __m512 before) {
  return _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(v), _mm512_castps_si512(before), 15));
}

// Lanes alternating from `even` and `odd` (lane t of each to 2t and 2t + 1): lanes 0 .. 16
// of the 32, or lanes 16 .. 32.
ADJOINT_AVX512 __m512 interleave_first(__m512 even, __m512 odd) {
  return _mm512_permutex2var_ps(even, _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), odd);
}
ADJOINT_AVX512 __m512 interleave_second(__m512 even, __m512 odd) {
  return _mm512_permutex2var_ps(even, _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
                                odd);
}

// The first `count` (≤ 32) of the values alternating from `even` and `odd`, to out.
ADJOINT_AVX512 void store_interleaved(__m512 even, __m512 odd, int64_t count, float* out) {
  _mm512_mask_storeu_ps(out, lanes_between(0, count), interleave_first(even, odd));
  _mm512_mask_storeu_ps(out + 16, lanes_between(0, count - 16), interleave_second(even, odd));
}

// Columns q .. q + 16 of a row W wide, those inside it and among the first `count`:
// written (`set`) or added to.
ADJOINT_AVX512 void put_inside(float* row, int64_t q, int64_t W, int64_t count, bool set, __m512 v) {
  const __mmask16 lanes = lanes_between(-q, std::min(W - q, count));
  if (!set) v = _mm512_maskz_loadu_ps(lanes, row + q) + v;
  _mm512_mask_storeu_ps(row + q, lanes, v);
}

}  // namespace

ADJOINT_AVX512 void winograd_input_tiles_avx512(const float* const rows[4], int64_t W, int64_t pw, int64_t s0,
                                                int64_t n, float* out, int64_t vs) {
  // Patch column j of tile s0 + t is input column q0 + 2t + j: per patch row, the four
  // columns of 16 tiles as four vectors, from two pairs of loads 2 columns apart.
  const int64_t q0 = 2 * s0 - pw;
  __m512 col[4][4];  // col[j][i]: patch row i, column j
  for (int i = 0; i < 4; ++i) {
    if (!rows[i]) {
      for (int j = 0; j < 4; ++j) col[j][i] = _mm512_setzero_ps();
      continue;
    }
    const __m512 lo = load_inside(rows[i], q0, W), hi = load_inside(rows[i], q0 + 16, W);
    const __m512 lo2 = load_inside(rows[i], q0 + 2, W), hi2 = load_inside(rows[i], q0 + 18, W);
    col[0][i] = even_lanes(lo, hi), col[1][i] = odd_lanes(lo, hi);
    col[2][i] = even_lanes(lo2, hi2), col[3][i] = odd_lanes(lo2, hi2);
  }
  // Bᵀ on the patch rows, every column: m[j][k] = (Bᵀ d)[k][j].
  __m512 m[4][4];
  for (int j = 0; j < 4; ++j) {
    const __m512 *p = col[j];
    m[j][0] = p[0] - p[2], m[j][1] = p[1] + p[2], m[j][2] = p[2] - p[1], m[j][3] = p[1] - p[3];
  }
  // Then B on the columns: V[4k + j] from row k of Bᵀ d.
  const __mmask16 tiles = lanes_between(0, n);
  for (int k = 0; k < 4; ++k) {
    const __m512 a = m[0][k], e = m[1][k], f = m[2][k], h = m[3][k];
    _mm512_mask_storeu_ps(out + (4 * k + 0) * vs, tiles, a - f);
    _mm512_mask_storeu_ps(out + (4 * k + 1) * vs, tiles, e + f);
    _mm512_mask_storeu_ps(out + (4 * k + 2) * vs, tiles, f - e);
    _mm512_mask_storeu_ps(out + (4 * k + 3) * vs, tiles, e - h);
  }
}

ADJOINT_AVX512 void winograd_input_adjoint_row_avx512(const float* in, int64_t vs, int64_t TW, float* const rows[4],
                                                      const bool set[4], int64_t W, int64_t pw) {
  // Entry k of a patch row (column 2k − pw even, 2k + 1 − pw odd) gathers tile k's share
  // and tile k − 1's (times_B_adjoint in ops/conv/winograd.cpp): per row of dV, lane t of `even`
  // (`odd`) is entry s0 + t, its tile k − 1 share shifted in from the previous lanes (and
  // the previous chunk). Chunks run while entries remain: entries 0 .. TW.
  __m512 carry_even[4], carry_odd[4];  // the previous chunk's shares for the entry after each tile
  for (int i = 0; i < 4; ++i) carry_even[i] = carry_odd[i] = _mm512_setzero_ps();
  for (int64_t s0 = 0; s0 <= TW; s0 += 16) {
    const __mmask16 tiles = lanes_between(0, TW - s0);
    const __mmask16 shifted = s0 > 0 ? 0xffff : 0xfffe;  // entry 0 has no tile before it
    __m512 even[4], odd[4];  // m = dV · Bᵀ per row of dV, spread over the entries
    for (int i = 0; i < 4; ++i) {
      const float* v = in + 4 * i * vs + s0;
      const __m512 v0 = _mm512_maskz_loadu_ps(tiles, v), v1 = _mm512_maskz_loadu_ps(tiles, v + vs),
                   v2 = _mm512_maskz_loadu_ps(tiles, v + 2 * vs), v3 = _mm512_maskz_loadu_ps(tiles, v + 3 * vs);
      const __m512 next_even = v1 + v2 - v0;  // tile s's share of entry s + 1
      even[i] = _mm512_mask_add_ps(v0, shifted, v0, shifted_up(next_even, carry_even[i]));
      odd[i] = _mm512_mask_sub_ps(v1 - v2 + v3, shifted, v1 - v2 + v3, shifted_up(v3, carry_odd[i]));
      carry_even[i] = next_even, carry_odd[i] = v3;
    }
    // B on the rows: patch row i of B m.
    const __m512 p_even[4] = {even[0], even[1] - even[2] + even[3], even[1] + even[2] - even[0], -even[3]};
    const __m512 p_odd[4] = {odd[0], odd[1] - odd[2] + odd[3], odd[1] + odd[2] - odd[0], -odd[3]};
    const int64_t count = 2 * std::min<int64_t>(16, TW + 1 - s0), q0 = 2 * s0 - pw;  // columns this chunk reaches
    for (int i = 0; i < 4; ++i) {
      if (!rows[i]) continue;
      put_inside(rows[i], q0, W, count, set[i], interleave_first(p_even[i], p_odd[i]));
      put_inside(rows[i], q0 + 16, W, count - 16, set[i], interleave_second(p_even[i], p_odd[i]));
    }
  }
}

ADJOINT_AVX512 void winograd_output_tiles_avx512(const float* in, int64_t ms, int64_t n, float add,
                                                 const WinogradEpilogue& finish, float* row0, float* row1,
                                                 int64_t width) {
  const __mmask16 tiles = lanes_between(0, n);
  __m512 top[4], bottom[4];  // Aᵀ on the rows of column j of the tiles, then on the columns
  for (int j = 0; j < 4; ++j) {
    const __m512 m0 = _mm512_maskz_loadu_ps(tiles, in + j * ms), m1 = _mm512_maskz_loadu_ps(tiles, in + (4 + j) * ms),
                 m2 = _mm512_maskz_loadu_ps(tiles, in + (8 + j) * ms),
                 m3 = _mm512_maskz_loadu_ps(tiles, in + (12 + j) * ms);
    top[j] = m0 + m1 + m2, bottom[j] = m1 - m2 - m3;
  }
  const __m512 b = _mm512_set1_ps(add);
  __m512 out[2][2] = {{top[0] + top[1] + top[2] + b, top[1] - top[2] - top[3] + b},
                      {bottom[0] + bottom[1] + bottom[2] + b, bottom[1] - bottom[2] - bottom[3] + b}};
  float* rows[2] = {row0, row1};
  const int64_t count = std::min<int64_t>(2 * n, width);
  for (int i = 0; i < 2; ++i) {
    if (!rows[i]) continue;
    for (__m512& v : out[i]) {
      if (finish.affine) v = v * _mm512_set1_ps(finish.scale) + _mm512_set1_ps(finish.shift);
      if (finish.relu) v = _mm512_max_ps(_mm512_setzero_ps(), v);  // as std::max(v, 0): NaN stays
    }
    store_interleaved(out[i][0], out[i][1], count, rows[i]);
  }
}

ADJOINT_AVX512 void winograd_output_adjoint_tiles_avx512(const float* y0, const float* y1, int64_t n, float* out,
                                                         int64_t ms) {
  const __mmask16 first = lanes_between(0, 2 * n), second = lanes_between(0, 2 * n - 16);
  const __m512 lo0 = _mm512_maskz_loadu_ps(first, y0), hi0 = _mm512_maskz_loadu_ps(second, y0 + 16);
  const __m512 lo1 = _mm512_maskz_loadu_ps(first, y1), hi1 = _mm512_maskz_loadu_ps(second, y1 + 16);
  const __m512 a0 = even_lanes(lo0, hi0), b0 = odd_lanes(lo0, hi0), a1 = even_lanes(lo1, hi1), b1 = odd_lanes(lo1, hi1);
  // A on the columns, c(y) = [a, a + b, a − b, −b] for a row (a, b) of a tile, then on the
  // rows, d = [c0, c0 + c1, c0 − c1, −c1]: dM[4k + j] = d_k of column entry j.
  const __m512 c0[4] = {a0, a0 + b0, a0 - b0, -b0}, c1[4] = {a1, a1 + b1, a1 - b1, -b1};
  const __mmask16 tiles = lanes_between(0, n);
  for (int j = 0; j < 4; ++j) {
    _mm512_mask_storeu_ps(out + j * ms, tiles, c0[j]);
    _mm512_mask_storeu_ps(out + (4 + j) * ms, tiles, c0[j] + c1[j]);
    _mm512_mask_storeu_ps(out + (8 + j) * ms, tiles, c0[j] - c1[j]);
    _mm512_mask_storeu_ps(out + (12 + j) * ms, tiles, -c1[j]);
  }
}

#else  // not x86-64: never called (ops/conv/winograd.cpp checks for AVX-512 first)

void winograd_input_tiles_avx512(const float* const*, int64_t, int64_t, int64_t, int64_t, float*, int64_t) {
  throw Error("winograd_input_tiles_avx512: not an x86-64 build");
}
void winograd_input_adjoint_row_avx512(const float*, int64_t, int64_t, float* const*, const bool*, int64_t, int64_t) {
  throw Error("winograd_input_adjoint_row_avx512: not an x86-64 build");
}
void winograd_output_tiles_avx512(const float*, int64_t, int64_t, float, const WinogradEpilogue&, float*, float*,
                                  int64_t) {
  throw Error("winograd_output_tiles_avx512: not an x86-64 build");
}
void winograd_output_adjoint_tiles_avx512(const float*, const float*, int64_t, float*, int64_t) {
  throw Error("winograd_output_adjoint_tiles_avx512: not an x86-64 build");
}

#endif

}  // namespace adjoint
