// Winograd F(2×2, 3×3)'s transforms (ops/conv/winograd.cpp) for up to 16 tiles of one row
// of tiles at once, one tile per lane of an AVX-512 vector. ops/conv/winograd.cpp runs them
// where the CPU has AVX-512 and its portable loops elsewhere; both make the same operations in the same order,
// so they give the same bits. The portable loops work through the tiles one padded entry
// at a time (the even and odd columns of a patch row kept apart); here a patch row's even
// and odd columns are split by two permutes, and every transform-domain value of 16 tiles
// is one vector operation.
#pragma once
#include <cstdint>

namespace adjoint {

// The most tiles one call handles: the lanes of a vector.
constexpr int64_t kWinogradLanes = 16;

// V[ξ] = (Bᵀ d B)[ξ] for tiles s0 .. s0 + n (n ≤ kWinogradLanes) of one row of tiles of one
// channel: rows[i] is the input row under patch row i (null where that row lies outside the
// input), W wide; tile s's patch starts at column 2s − pw (zero outside the input). V[ξ] of
// tile s0 + t goes to out[ξ·vs + t].
void winograd_input_tiles_avx512(const float* const rows[4], int64_t W, int64_t pw, int64_t s0, int64_t n,
                                 float* out, int64_t vs);

// The adjoint of winograd_input_tiles_avx512 for a whole row of TW tiles of one channel:
// dV[ξ] of tile t at in[ξ·vs + t]; (B dV Bᵀ) over each tile's patch goes to the input rows
// under it, rows[i] for patch row i (null where outside the input), W wide, written where
// set[i] (the row's first contribution) and added to elsewhere. Patches overlap by two
// columns; every column gets its tiles' shares summed in the portable loops' order.
void winograd_input_adjoint_row_avx512(const float* in, int64_t vs, int64_t TW, float* const rows[4], const bool set[4],
                                       int64_t W, int64_t pw);

// What follows a convolution's sum in its output channel: v ↦ v·scale + shift (when
// `affine`, a folded BatchNorm), then max(v, 0) (when `relu`), as ops/conv/geometry.h's Epilogue.
struct WinogradEpilogue {
  bool affine;
  float scale, shift;
  bool relu;
};

// The tiles' two output rows, finish(Aᵀ M A + add), for n tiles: M[ξ] of tile t at
// in[ξ·ms + t]; output (i, j) of tile t goes to (i ? row1 : row0)[2t + j] for 2t + j < width
// (row1 null: past the outputs).
void winograd_output_tiles_avx512(const float* in, int64_t ms, int64_t n, float add, const WinogradEpilogue& finish,
                                  float* row0, float* row1, int64_t width);

// The adjoint of winograd_output_tiles_avx512 (without `add`): dM[ξ] = (A dY Aᵀ)[ξ] for n
// tiles whose output rows are y0 and y1 (2n values each); dM[ξ] of tile t to out[ξ·ms + t].
void winograd_output_adjoint_tiles_avx512(const float* y0, const float* y1, int64_t n, float* out, int64_t ms);

}  // namespace adjoint
