#include "ops/conv/winograd_f4_weight_grad.h"

#include <algorithm>
#include <cstdint>

#include "engine/threads.h"
#include "engine/vectorize.h"
#include "ops/conv/winograd_common.h"
#include "ops/conv/winograd_f4.h"
#include "ops/conv/winograd_f4_transforms.h"

#if defined(__x86_64__)
#include "engine/avx512.h"
#endif

namespace adjoint::conv {

using winograd_f4::kLanes;
using winograd_f4::kSlices;
using winograd_f4::kTile;
using winograd_f4::tile_rows_a_vector;

namespace {

// Tiles per product. Each band's 36 products add into the 36·O·C sum of the chunk, which
// they read and write once a band: deeper products than the forward pass's read it for more
// tiles, while V and dM of a block stay within about kF4WeightGradBytes where the layer is
// narrow.
constexpr int64_t kF4WeightGradBytes = 1 << 19;
constexpr int64_t kF4WeightGradMinTiles = 256;
// The fewest tiles in the batch for which this runs (the header says why).
constexpr int64_t kF4WeightGradMinBatchTiles = 256;

// The adjoints of F(4×4)'s output and kernel transforms (the matrices Aᵀ and G are in
// ops/conv/winograd_f4.cpp), on values `step` apart. T is a float or a vector of floats (one
// tile or kernel a lane): the same operations in the same order, so the same bits.

// A = (Aᵀ)ᵀ, 6 × 4, with Aᵀ = [[1, 1, 1, 8, 1, 0], [0, 1, −1, 4, −2, 0], [0, 1, 1, 2, 4, 0],
// [0, 1, −1, 1, −8, 1]].
template <class T>
[[gnu::always_inline]] inline void times_A(const T* y, int step, T* m, int out_step) {
  const T y0 = y[0], y1 = y[step], y2 = y[2 * step], y3 = y[3 * step];
  const T even = y0 + y2, odd = y1 + y3;
  m[0] = y0;
  m[out_step] = even + odd;
  m[2 * out_step] = even - odd;
  m[3 * out_step] = 8.0f * y0 + 4.0f * y1 + 2.0f * y2 + y3;
  m[4 * out_step] = y0 - 2.0f * y1 + 4.0f * y2 - 8.0f * y3;
  m[5 * out_step] = y3;
}

// Gᵀ, 3 × 6, with G = [[½, 0, 0], [⅙, ⅙, ⅙], [−⅙, ⅙, −⅙], [−2/15, −1/15, −1/30],
// [1/30, −1/15, 2/15], [0, 0, ½]].
template <class T>
[[gnu::always_inline]] inline void times_Gt(const T* u, int step, T* k, int out_step) {
  const T u0 = u[0], u1 = u[step], u2 = u[2 * step], u3 = u[3 * step], u4 = u[4 * step], u5 = u[5 * step];
  const T plus = (u1 + u2) * (1.0f / 6.0f), minus = (u1 - u2) * (1.0f / 6.0f);
  k[0] = u0 * 0.5f + minus + (u4 - 4.0f * u3) * (1.0f / 30.0f);
  k[out_step] = plus - (u3 + u4) * (1.0f / 15.0f);
  k[2 * out_step] = minus + (4.0f * u4 - u3) * (1.0f / 30.0f) + u5 * 0.5f;
}

// dM = A dY Aᵀ for a 4 × 4 tile y (y[4i + j]); position ξ = 6k + l as in the forward pass.
template <class T>
[[gnu::always_inline]] inline void output_adjoint_transform(const T y[16], T m[36]) {
  T t[24];  // A dY: 6 rows of 4
  for (int j = 0; j < 4; ++j) times_A(y + j, 4, t + j, 4);
  for (int k = 0; k < 6; ++k) times_A(t + 4 * k, 1, m + 6 * k, 1);
}

// dW = Gᵀ dU G for one pair of channels, the 3 × 3 kernel row-major.
template <class T>
[[gnu::always_inline]] inline void kernel_adjoint(const T u[36], T k[9]) {
  T t[18];  // Gᵀ dU: 3 rows of 6
  for (int l = 0; l < 6; ++l) times_Gt(u + l, 6, t + l, 6);
  for (int a = 0; a < 3; ++a) times_Gt(t + 6 * a, 1, k + 3 * a, 1);
}

// The transforms of dY work along one row of tiles, up to 16 tiles (lanes) at a time: tile
// t's row i reads rows[i] (null: past the outputs, all zero) at columns q0 + 4t .. q0 + 4t + 3
// (zero from OW on).

// dM[ξ] of tiles t < n of one row, to out[ξ·ms + t].
void output_adjoint_row_tiles(const float* const rows[4], int64_t OW, int64_t q0, int64_t n, float* out, int64_t ms) {
  for (int64_t t = 0; t < n; ++t) {
    float y[16], m[36];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) {
        const int64_t q = q0 + kTile * t + j;
        y[4 * i + j] = rows[i] && q < OW ? rows[i][q] : 0.0f;
      }
    output_adjoint_transform(y, m);
    for (int xi = 0; xi < kSlices; ++xi) out[xi * ms + t] = m[xi];
  }
}

#if defined(__x86_64__)
// output_adjoint_row_tiles for k rows of n tiles in the lanes of vectors, tile t of row a in
// lane a·n + t (k > 1 where a row of tiles is at most half a vector, as in the input
// transform: the rows' tiles lie one after the other in dM, so their lanes store as one).
ADJOINT_AVX512 void output_adjoint_tiles_avx512(const float* const rows[][4], int64_t k, int64_t OW, int64_t q0,
                                                int64_t n, float* out, int64_t ms) {
  __m512 y[16], m[36];
  for (int64_t a = 0; a < k; ++a) {
    __m512 tile_y[16];  // row a's values, its tiles in lanes 0 .. n
    for (int i = 0; i < 4; ++i) {
      if (rows[a][i]) {
        __m512 col[6];  // the patch loader's six columns; a tile of dY is the first four
        winograd_f4_patch_columns(rows[a][i], q0, OW, col);
        std::copy(col, col + 4, tile_y + 4 * i);
      } else {
        std::fill(tile_y + 4 * i, tile_y + 4 * i + 4, _mm512_setzero_ps());
      }
    }
    if (a == 0) {
      std::copy(tile_y, tile_y + 16, y);
      continue;
    }
    const __mmask16 lanes = lanes_between(a * n, a * n + n);  // moved up by a·n lanes
    const __m512i from = _mm512_sub_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(int(a * n)));
    for (int e = 0; e < 16; ++e) y[e] = _mm512_mask_permutexvar_ps(y[e], lanes, from, tile_y[e]);
  }
  output_adjoint_transform(y, m);
  const __mmask16 tiles = first_lanes(k * n);
  for (int xi = 0; xi < kSlices; ++xi) _mm512_mask_storeu_ps(out + xi * ms, tiles, m[xi]);
}

// kernel_adjoint for the 16 pairs of channels e .. e + 15 (dU[ξ] of pair e at u[ξ·stride + e]),
// written to dw[9e ..].
ADJOINT_AVX512 void kernel_adjoint_avx512(const float* u, int64_t stride, float* dw) {
  __m512 v[36], k[9];
  for (int xi = 0; xi < kSlices; ++xi) v[xi] = _mm512_loadu_ps(u + xi * stride);
  kernel_adjoint(v, k);
  alignas(64) float taps[9][16];
  for (int tap = 0; tap < 9; ++tap) _mm512_store_ps(taps[tap], k[tap]);
  for (int pair = 0; pair < 16; ++pair)
    for (int tap = 0; tap < 9; ++tap) dw[9 * pair + tap] = taps[tap][pair];
}
#else
void output_adjoint_tiles_avx512(const float* const[][4], int64_t, int64_t, int64_t, int64_t, float*, int64_t) {
  throw Error("output_adjoint_tiles_avx512: not an x86-64 build");  // never called: vector_isa() is below AVX-512
}
void kernel_adjoint_avx512(const float*, int64_t, float*) {
  throw Error("kernel_adjoint_avx512: not an x86-64 build");
}
#endif

// dM[ξ][o][t] = (A dY Aᵀ)[ξ] for the 4 × 4 tile of dY of each tile t of the band (zero past
// the outputs); dy is the block's first value.
void output_adjoint(const ConvGeometry& g, const float* dy, const F4Band& band, float* dM) {
  const int64_t T = band.tiles(), TW = band.TW, ms = winograd_slice_stride(g.O, T);
  const bool vectors = vector_isa() == VectorIsa::Avx512;
  const int64_t stack = tile_rows_a_vector(TW);
  parallel_for(g.O, std::max<int64_t>(1, kCopyGrain / (kSlices * T)), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t b = 0; b < band.nb; ++b)
        for (int64_t r = 0; r < band.rows; r += stack) {
          const int64_t k = std::min(stack, band.rows - r);
          const float* rows[kLanes][4];  // tile row r + a's rows of dY
          for (int64_t a = 0; a < k; ++a)
            for (int i = 0; i < 4; ++i) {
              const int64_t oh = band.oh0 + kTile * (r + a) + i;
              rows[a][i] = oh < g.OH ? dy + (b * g.O + o) * g.P + oh * g.OW : nullptr;
            }
          float* out = dM + o * T + (b * band.rows + r) * TW;  // dM[ξ] is out + ξ·ms
          for (int64_t s0 = 0; s0 < TW; s0 += kLanes) {
            const int64_t n = std::min<int64_t>(kLanes, TW - s0), q0 = kTile * s0;
            if (vectors)
              output_adjoint_tiles_avx512(rows, k, g.OW, q0, n, out + s0, ms);
            else
              for (int64_t a = 0; a < k; ++a) output_adjoint_row_tiles(rows[a], g.OW, q0, n, out + a * TW + s0, ms);
          }
        }
  });
}

// dw = Gᵀ dU G for every pair of channels, dU[ξ] (O × C) `stride` floats apart.
void weights_from_transform_domain(const ConvGeometry& g, const float* dU, int64_t stride, float* dw) {
  const bool vectors = vector_isa() == VectorIsa::Avx512;
  parallel_for(g.O * g.C, 1024, [&](int64_t e0, int64_t e1) {
    int64_t e = e0;
    for (; vectors && e + 16 <= e1; e += 16) kernel_adjoint_avx512(dU + e, stride, dw + 9 * e);
    for (; e < e1; ++e) {
      float u[36];
      for (int xi = 0; xi < kSlices; ++xi) u[xi] = dU[xi * stride + e];
      kernel_adjoint(u, dw + 9 * e);
    }
  });
}

}  // namespace

bool winograd_f4_weight_gradient_applies(const ConvGeometry& g) {
  const int64_t tiles = g.N * ((g.OH + kTile - 1) / kTile) * ((g.OW + kTile - 1) / kTile);
  return winograd_f4_applies(g) && tiles >= kF4WeightGradMinBatchTiles;
}

void winograd_f4_weight_gradient(const ConvGeometry& g, const float* x, const float* dy, float* dw) {
  const WinogradTiling tiling = winograd_tiling(g, kTile, kSlices, kF4WeightGradBytes, kF4WeightGradMinTiles);
  const int64_t blocks = tiling.blocks();
  if (blocks == 0) {  // an empty batch: the gradient is zero
    std::fill(dw, dw + g.O * g.C * 9, 0.0f);
    return;
  }
  const ConvGemm product(blocks);
  const int64_t us = winograd_slice_stride(g.O, g.C), u_size = kSlices * us;
  const int64_t chunk = (blocks + kMaxPartials - 1) / kMaxPartials;  // blocks per partial sum
  const int64_t chunks = (blocks + chunk - 1) / chunk;
  Scratch dU(chunks * u_size);  // the gradient in the transform domain, per chunk

  parallel_for(blocks, chunk, [&](int64_t k0, int64_t k1) {
    float* dU_chunk = dU.data() + (k0 / chunk) * u_size;
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t n0 = k * tiling.block, nb = tiling.images_in(k);
      const int64_t max_tiles = nb * tiling.band_rows * tiling.TW;
      Scratch V(kSlices * winograd_slice_stride(g.C, max_tiles)), dM(kSlices * winograd_slice_stride(g.O, max_tiles));
      for (int64_t r0 = 0; r0 < tiling.TH; r0 += tiling.band_rows) {
        const F4Band band{nb, kTile * r0, std::min(tiling.band_rows, tiling.TH - r0), tiling.TW};
        const int64_t T = band.tiles(), vs = winograd_slice_stride(g.C, T), ms = winograd_slice_stride(g.O, T);
        output_adjoint(g, dy + n0 * g.O * g.P, band, dM.data());
        winograd_f4_input(g, x + n0 * g.C * g.H * g.W, band, V.data());
        const float beta = k == k0 && r0 == 0 ? 0.0f : 1.0f;  // the chunk's first band starts its sum
        for_each_slice(product, kSlices, [&](int xi) {
          product(false, true, g.O, g.C, T, 1.0f, dM.data() + xi * ms, T, V.data() + xi * vs, T, beta,
                  dU_chunk + xi * us, g.C);
        });
      }
    }
  });

  float* sums = dU.data();
  const int64_t count = g.O * g.C;
  if (chunks > 1)  // the partial sums, in chunk order, into the first (the slices' padding left out)
    parallel_for(kSlices * count, 1 << 14, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1;) {  // entries e .. end of slice xi
        const int64_t xi = e / count, end = std::min(e1, (xi + 1) * count);
        float* sum = sums + xi * us - xi * count;  // entry e of slice xi is sum[e]
        for (int64_t c = 1; c < chunks; ++c)
          for (int64_t i = e; i < end; ++i) sum[i] += sum[c * u_size + i];
        e = end;
      }
    });
  weights_from_transform_domain(g, sums, us, dw);
}

}  // namespace adjoint::conv
