// What Winograd F(4×4, 3×3)'s forward pass (ops/conv/winograd_f4.cpp) shares with its weight
// gradient (ops/conv/winograd_f4_weight_grad.cpp): the tile geometry, the input transform
// of a band, and the AVX-512 load of a row of tiles.
#pragma once
#include <cstdint>

#include "ops/conv/geometry.h"

#if defined(__x86_64__)
#include "engine/avx512.h"
#endif

namespace adjoint::conv {

namespace winograd_f4 {
constexpr int kSlices = 36;   // transform positions: a 6 × 6 patch
constexpr int64_t kTile = 4;  // outputs per tile side
constexpr int kLanes = 16;    // tiles per transform call

// How many rows of TW tiles the vector transforms take at once: one where a row fills more
// than half a vector (in pieces of 16 tiles), else as many whole rows as fit (a 28-wide map's
// 7 tiles a row run two rows a vector, a 14-wide map's 4 tiles four).
inline int64_t tile_rows_a_vector(int64_t TW) { return TW <= kLanes / 2 ? kLanes / TW : 1; }
}  // namespace winograd_f4

// Where the tiles of a band lie: output rows [oh0, oh0 + 4·rows) of `nb` images, TW tiles
// across; tile t = (b·rows + r)·TW + s has its top-left output at (oh0 + 4r, 4s) and its
// 6 × 6 input patch at (oh0 + 4r − ph, 4s − pw).
struct F4Band {
  int64_t nb, oh0, rows, TW;
  int64_t tiles() const { return nb * rows * TW; }
};

// V[ξ][c][t] = (Bᵀ d B)[ξ] for the input patch d of each tile t of the band (zero outside
// the input), V[ξ] `winograd_slice_stride(g.C, band.tiles())` floats apart; x is the block's
// first value.
void winograd_f4_input(const ConvGeometry& g, const float* x, const F4Band& band, float* V);

#if defined(__x86_64__)
namespace winograd_f4 {
// Columns q .. q + 16 of a row W wide, zero outside it (those lanes are not read).
ADJOINT_AVX512 inline __m512 load_inside(const float* row, int64_t q, int64_t W) {
  return _mm512_maskz_loadu_ps(lanes_between(-q, W - q), row + q);
}

// Lanes 1–15 of v, then lane 0 of `last`.
ADJOINT_AVX512 inline __m512 next_tile(__m512 v, __m512 last) {
  return _mm512_castsi512_ps(_mm512_alignr_epi32(_mm512_castps_si512(last), _mm512_castps_si512(v), 1));
}
}  // namespace winograd_f4

// The six patch columns of 16 tiles along one row: col[j] lane t = column q0 + 4t + j of
// `row` (W wide, zero outside it). Five loads of 16 columns; columns 4t + p (p < 4) are
// picked from each pair of loads by one permute and joined by a shuffle; columns 4t + 4 and
// 4t + 5 are those of tile t + 1.
ADJOINT_AVX512 inline void winograd_f4_patch_columns(const float* row, int64_t q0, int64_t W, __m512 col[6]) {
  using winograd_f4::load_inside, winograd_f4::next_tile;
  const __m512 v0 = load_inside(row, q0, W), v1 = load_inside(row, q0 + 16, W), v2 = load_inside(row, q0 + 32, W),
               v3 = load_inside(row, q0 + 48, W), v4 = load_inside(row, q0 + 64, W);
  for (int p = 0; p < 4; ++p) {
    const __m512i every_fourth =
        _mm512_setr_epi32(p, p + 4, p + 8, p + 12, p + 16, p + 20, p + 24, p + 28, 0, 0, 0, 0, 0, 0, 0, 0);
    const __m512 low = _mm512_permutex2var_ps(v0, every_fourth, v1), high = _mm512_permutex2var_ps(v2, every_fourth, v3);
    col[p] = _mm512_shuffle_f32x4(low, high, 0x44);  // lanes 0–7 of each
  }
  col[4] = next_tile(col[0], v4);
  col[5] = next_tile(col[1], next_tile(v4, v4));
}
#endif

}  // namespace adjoint::conv
