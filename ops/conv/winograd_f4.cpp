#include "ops/conv/winograd_f4.h"

#include <algorithm>
#include <cstdint>
#include <limits>

#include "engine/error.h"
#include "engine/prefetch.h"
#include "engine/threads.h"
#include "engine/vectorize.h"
#include "ops/conv/winograd.h"
#include "ops/conv/winograd_common.h"
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

// Below this map size F(2×2) runs the layer: on a 7-wide map, 2 tiles of 4 across where 7
// outputs are wanted, the transformed weights (36·O·C floats, 2.25 times F(2×2)'s, written
// and read every call) cost more than the products save (ResNet-50's 512-channel layer at
// 7 × 7 runs a third slower by F(4×4); at 14 × 14 a quarter faster).
constexpr int64_t kWinogradF4MinMap = 14;
// Tiles per GEMM: V and M of a block within about kF4Bytes (they stay in L2 between the
// transforms and the products), but at least kF4MinTiles, so that each product is wide
// enough for the GEMM kernel's panels and the weights' slices are read for enough tiles.
constexpr int64_t kF4Bytes = 1 << 19;
constexpr int64_t kF4MinTiles = 32;

// The 1-D transforms, on values `step` apart. T is a float or a vector of floats (one tile
// or kernel per lane): the same operations in the same order, so the same bits.
//
// The interpolation points are 0, ±1, ½, −2 and ∞: against Lavin & Gray's 0, ±1, ±2, ∞ they
// shrink the largest entries of the transforms and, with them, the rounding error of the sums
// by about three times (Barabasz et al., "Error Analysis and Improving the Accuracy of
// Winograd Convolution for Deep Neural Networks", 2020). Rows of Bᵀ and G and columns of Aᵀ
// are scaled by powers of two and their inverses (exact in floating point) so that Bᵀ and Aᵀ
// hold small integers.
//
// Bᵀ = [[2, −3, −4, 3, 2, 0], [0, −2, 1, 5, 2, 0], [0, 2, −5, 1, 2, 0],
//       [0, −2, −1, 2, 1, 0], [0, 1, −2, −1, 2, 0], [0, 2, −3, −4, 3, 2]]
template <class T>
[[gnu::always_inline]] inline void times_Bt(const T* d, int step, T* v, int out_step) {
  const T d0 = d[0], d1 = d[step], d2 = d[2 * step], d3 = d[3 * step], d4 = d[4 * step], d5 = d[5 * step];
  const T e = d3 - d1, f = d4 - d2;
  v[0] = 2.0f * (d0 + d4 - 2.0f * d2) + 3.0f * e;
  v[out_step] = 2.0f * (e + d4) + d2 + 3.0f * d3;
  v[2 * out_step] = 2.0f * (d1 + d4) - 5.0f * d2 + d3;
  v[3 * out_step] = 2.0f * e + f;
  v[4 * out_step] = 2.0f * f - e;
  v[5 * out_step] = 2.0f * (d1 + d5 - 2.0f * d3) + 3.0f * f;
}

// Aᵀ = [[1, 1, 1, 8, 1, 0], [0, 1, −1, 4, −2, 0], [0, 1, 1, 2, 4, 0], [0, 1, −1, 1, −8, 1]]
template <class T>
[[gnu::always_inline]] inline void times_At(const T* m, int step, T* y, int out_step) {
  const T m3 = m[3 * step], m4 = m[4 * step];
  const T s = m[step] + m[2 * step], d = m[step] - m[2 * step];
  y[0] = m[0] + s + 8.0f * m3 + m4;
  y[out_step] = d + 4.0f * m3 - 2.0f * m4;
  y[2 * out_step] = s + 2.0f * m3 + 4.0f * m4;
  y[3 * out_step] = d + m3 - 8.0f * m4 + m[5 * step];
}

// G = [[½, 0, 0], [⅙, ⅙, ⅙], [−⅙, ⅙, −⅙], [−2/15, −1/15, −1/30], [1/30, −1/15, 2/15], [0, 0, ½]]
template <class T>
[[gnu::always_inline]] inline void times_G(const T* k, int step, T* u, int out_step) {
  const T k0 = k[0], k1 = k[step], k2 = k[2 * step];
  const T p = k0 + k2;
  u[0] = k0 * 0.5f;
  u[out_step] = (p + k1) * (1.0f / 6.0f), u[2 * out_step] = (k1 - p) * (1.0f / 6.0f);
  u[3 * out_step] = (2.0f * k0 + k1 + 0.5f * k2) * (-1.0f / 15.0f);
  u[4 * out_step] = (k0 - 2.0f * k1 + 4.0f * k2) * (1.0f / 30.0f);
  u[5 * out_step] = k2 * 0.5f;
}

// V = Bᵀ d B for a 6 × 6 patch d; position ξ = 6k + l (row k, column l), as in U and M.
template <class T>
[[gnu::always_inline]] inline void input_transform(const T d[36], T v[36]) {
  T m[36];
  for (int j = 0; j < 6; ++j) times_Bt(d + j, 6, m + j, 6);  // Bᵀ on each column
  for (int k = 0; k < 6; ++k) times_Bt(m + 6 * k, 1, v + 6 * k, 1);  // then B on each row
}

// The 4 × 4 outputs Aᵀ M A, y[4i + j].
template <class T>
[[gnu::always_inline]] inline void output_transform(const T m[36], T y[16]) {
  T t[24];  // Aᵀ M: 4 rows of 6
  for (int l = 0; l < 6; ++l) times_At(m + l, 6, t + l, 6);
  for (int i = 0; i < 4; ++i) times_At(t + 6 * i, 1, y + 4 * i, 1);
}

// U = G k Gᵀ for a 3 × 3 kernel k (row-major), for WinogradWeights.
struct WinogradF4Kernel {
  static constexpr int kSlices = 36;
  template <class T>
  [[gnu::always_inline]] static inline void apply(const T k[9], T u[36]) {
    T t[18];  // G k: 6 rows of 3
    for (int b = 0; b < 3; ++b) times_G(k + b, 3, t + b, 3);
    for (int a = 0; a < 6; ++a) times_G(t + 3 * a, 1, u + 6 * a, 1);
  }
};

// What follows the sum in output channel o (Epilogue, without a residual): + bias, then
// ·scale + shift, then max(·, 0), the operations of Epilogue::finish_row.
struct ChannelFinish {
  bool bias, affine, relu;
  float add, scale, shift;
  ChannelFinish(const Epilogue& e, int64_t o)
      : bias(e.bias != nullptr),
        affine(e.scale != nullptr),
        relu(e.relu),
        add(e.bias ? e.bias[o] : 0.0f),
        scale(e.scale ? e.scale[o] : 1.0f),
        shift(e.shift ? e.shift[o] : 0.0f) {}
  float operator()(float v) const {
    if (bias) v = v + add;
    if (affine) v = v * scale + shift;
    if (relu) v = std::max(v, 0.0f);
    return v;
  }
};

// The transforms work along one row of tiles, up to 16 tiles (lanes) at a time. Tile t's
// patch row i reads input row rows[i] (null: outside the input, all zero) at columns
// q0 + 4t .. q0 + 4t + 5 (zero outside 0 .. W); its output row i goes to y_rows[i] (null:
// past the outputs) at columns 4t .. 4t + 3 from `col0`, those below `width`.

// V[ξ] of tiles t < n of one row, to out[ξ·vs + t].
void input_row_tiles(const float* const rows[6], int64_t W, int64_t q0, int64_t n, float* out, int64_t vs) {
  for (int64_t t = 0; t < n; ++t) {
    float d[36], v[36];
    for (int i = 0; i < 6; ++i)
      for (int j = 0; j < 6; ++j) {
        const int64_t q = q0 + 4 * t + j;
        d[6 * i + j] = rows[i] && q >= 0 && q < W ? rows[i][q] : 0.0f;
      }
    input_transform(d, v);
    for (int xi = 0; xi < kSlices; ++xi) out[xi * vs + t] = v[xi];
  }
}

// finish(Aᵀ M A) of tiles t < n of one row, M[ξ] of tile t at in[ξ·ms + t].
void output_row_tiles(const float* in, int64_t ms, int64_t n, const ChannelFinish& finish, float* const y_rows[4],
                      int64_t col0, int64_t width) {
  for (int64_t t = 0; t < n; ++t) {
    float m[36], y[16];
    for (int xi = 0; xi < kSlices; ++xi) m[xi] = in[xi * ms + t];
    output_transform(m, y);
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j)
        if (const int64_t q = col0 + 4 * t + j; y_rows[i] && q < width) y_rows[i][q] = finish(y[4 * i + j]);
  }
}

#if defined(__x86_64__)
// input_row_tiles for k rows of n tiles in the lanes of vectors: tile t of row a in lane
// a·n + t (k > 1 where a row of tiles is at most half a vector: the rows' tiles lie one after
// the other in V, so their lanes store as one). rows[a] is row a's patch rows.
ADJOINT_AVX512 void input_tiles_avx512(const float* const rows[][6], int64_t k, int64_t W, int64_t q0, int64_t n,
                                       float* out, int64_t vs) {
  __m512 d[36], v[36];
  for (int64_t a = 0; a < k; ++a) {
    __m512 col[36];  // row a's patch values, its tiles in lanes 0 .. n
    for (int i = 0; i < 6; ++i) {
      if (rows[a][i]) {
        winograd_f4_patch_columns(rows[a][i], q0, W, col + 6 * i);
      } else {
        for (int j = 0; j < 6; ++j) col[6 * i + j] = _mm512_setzero_ps();
      }
    }
    if (a == 0) {
      std::copy(col, col + 36, d);
      continue;
    }
    const __mmask16 lanes = lanes_between(a * n, a * n + n);  // moved up by a·n lanes
    const __m512i from = _mm512_sub_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(int(a * n)));
    for (int e = 0; e < 36; ++e) d[e] = _mm512_mask_permutexvar_ps(d[e], lanes, from, col[e]);
  }
  input_transform(d, v);
  const __mmask16 tiles = first_lanes(k * n);
  for (int xi = 0; xi < kSlices; ++xi) _mm512_mask_storeu_ps(out + xi * vs, tiles, v[xi]);
}

// One output row of up to 16 tiles (y[j] lane t: column j of tile t) from `col0`, those
// below `width`: the four columns interleaved (a 4 × 4 transpose in each 128-bit lane, then
// the lanes regrouped), 64 consecutive outputs.
ADJOINT_AVX512 void store_output_row(const __m512 c[4], float* row, int64_t col0, int64_t width) {
  const int64_t count = std::min<int64_t>(64, width - col0);
  const __m512 t0 = _mm512_unpacklo_ps(c[0], c[1]), t1 = _mm512_unpackhi_ps(c[0], c[1]);
  const __m512 t2 = _mm512_unpacklo_ps(c[2], c[3]), t3 = _mm512_unpackhi_ps(c[2], c[3]);
  const __m512d p0 = _mm512_castps_pd(t0), p1 = _mm512_castps_pd(t1), p2 = _mm512_castps_pd(t2),
                p3 = _mm512_castps_pd(t3);
  // r_k: tiles k, k + 4, k + 8, k + 12, one per 128-bit lane, their four columns in order.
  const __m512 r0 = _mm512_castpd_ps(_mm512_unpacklo_pd(p0, p2)), r1 = _mm512_castpd_ps(_mm512_unpackhi_pd(p0, p2));
  const __m512 r2 = _mm512_castpd_ps(_mm512_unpacklo_pd(p1, p3)), r3 = _mm512_castpd_ps(_mm512_unpackhi_pd(p1, p3));
  const __m512 a = _mm512_shuffle_f32x4(r0, r1, 0x44), b = _mm512_shuffle_f32x4(r2, r3, 0x44);  // tiles 0 4 1 5, 2 6 3 7
  const __m512 e = _mm512_shuffle_f32x4(r0, r1, 0xee), f = _mm512_shuffle_f32x4(r2, r3, 0xee);  // 8 12 9 13, 10 14 11 15
  const __m512 out[4] = {_mm512_shuffle_f32x4(a, b, 0x88), _mm512_shuffle_f32x4(a, b, 0xdd),
                         _mm512_shuffle_f32x4(e, f, 0x88), _mm512_shuffle_f32x4(e, f, 0xdd)};
  for (int q = 0; q < 4; ++q) _mm512_mask_storeu_ps(row + col0 + 16 * q, lanes_between(0, count - 16 * q), out[q]);
}

// output_row_tiles for k rows of n tiles in the lanes of vectors, tile t of row a in lane
// a·n + t (as input_tiles_avx512); y_rows[a] is row a's output rows.
ADJOINT_AVX512 void output_tiles_avx512(const float* in, int64_t ms, int64_t k, int64_t n, const ChannelFinish& finish,
                                        float* const y_rows[][4], int64_t col0, int64_t width) {
  const __mmask16 tiles = first_lanes(k * n);
  __m512 m[36], y[16];
  for (int xi = 0; xi < kSlices; ++xi) m[xi] = _mm512_maskz_loadu_ps(tiles, in + xi * ms);
  output_transform(m, y);
  const __m512 add = _mm512_set1_ps(finish.add), scale = _mm512_set1_ps(finish.scale),
               shift = _mm512_set1_ps(finish.shift), zero = _mm512_setzero_ps();
  for (__m512& v : y) {
    if (finish.bias) v = v + add;
    if (finish.affine) v = v * scale + shift;
    if (finish.relu) v = _mm512_max_ps(zero, v);  // zero > v ? zero : v keeps a NaN and −0, as std::max(v, 0)
  }
  for (int64_t a = 0; a < k; ++a) {
    __m512 row_y[16];  // row a's tiles moved down to lanes 0 .. n
    const __m512i from = _mm512_add_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(int(a * n)));
    for (int e = 0; e < 16; ++e) row_y[e] = a == 0 ? y[e] : _mm512_permutexvar_ps(from, y[e]);
    for (int i = 0; i < 4; ++i)
      if (y_rows[a][i]) store_output_row(row_y + 4 * i, y_rows[a][i], col0, width);
  }
}
#else
void input_tiles_avx512(const float* const[][6], int64_t, int64_t, int64_t, int64_t, float*, int64_t) {
  throw Error("input_tiles_avx512: not an x86-64 build");  // never called: vector_isa() is below AVX-512
}
void output_tiles_avx512(const float*, int64_t, int64_t, int64_t, const ChannelFinish&, float* const[][4], int64_t,
                         int64_t) {
  throw Error("output_tiles_avx512: not an x86-64 build");
}
#endif

}  // namespace

void winograd_f4_input(const ConvGeometry& g, const float* x, const F4Band& band, float* V) {
  const int64_t T = band.tiles(), TW = band.TW, vs = winograd_slice_stride(g.C, T);
  const bool vectors = vector_isa() == VectorIsa::Avx512;
  const int64_t stack = tile_rows_a_vector(TW);
  // The input rows under the band, which plane after plane streams in from memory: the
  // rows two planes ahead are prefetched (as in winograd_input).
  const int64_t h0 = std::max<int64_t>(0, band.oh0 - g.ph), h1 = std::min(g.H, band.oh0 + kTile * band.rows - g.ph + 2);
  parallel_for(g.C, std::max<int64_t>(1, kCopyGrain / (kSlices * T)), [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t b = 0; b < band.nb; ++b)
        for (int64_t r = 0; r < band.rows; r += stack) {
          const float* plane = x + (b * g.C + c) * g.H * g.W;
          if (r == 0 && c + 2 < c1 && h1 > h0) prefetch(plane + (2 * g.H + h0) * g.W, (h1 - h0) * g.W);
          const int64_t k = std::min(stack, band.rows - r);
          const float* rows[kLanes][6];  // tile row r + a's patch rows
          for (int64_t a = 0; a < k; ++a)
            for (int i = 0; i < 6; ++i) {
              const int64_t h = band.oh0 + kTile * (r + a) - g.ph + i;
              rows[a][i] = h < 0 || h >= g.H ? nullptr : plane + h * g.W;
            }
          float* out = V + c * T + (b * band.rows + r) * TW;  // V[ξ] is out + ξ·vs
          for (int64_t s0 = 0; s0 < TW; s0 += kLanes) {
            const int64_t n = std::min<int64_t>(kLanes, TW - s0), q0 = kTile * s0 - g.pw;
            if (vectors)
              input_tiles_avx512(rows, k, g.W, q0, n, out + s0, vs);
            else
              for (int64_t a = 0; a < k; ++a) input_row_tiles(rows[a], g.W, q0, n, out + a * TW + s0, vs);
          }
        }
  });
}

namespace {

// y = epilogue(Aᵀ M A) for every tile of the band; y is the block's first value.
void winograd_f4_output(const ConvGeometry& g, const float* M, const F4Band& band, const Epilogue& epilogue,
                        float* y) {
  const int64_t T = band.tiles(), TW = band.TW, ms = winograd_slice_stride(g.O, T);
  const bool vectors = vector_isa() == VectorIsa::Avx512;
  const int64_t stack = tile_rows_a_vector(TW);
  parallel_for(g.O, std::max<int64_t>(1, kCopyGrain / (kSlices * T)), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      const ChannelFinish finish(epilogue, o);
      for (int64_t b = 0; b < band.nb; ++b)
        for (int64_t r = 0; r < band.rows; r += stack) {
          const int64_t k = std::min(stack, band.rows - r);
          float* y_rows[kLanes][4];  // tile row r + a's output rows
          for (int64_t a = 0; a < k; ++a)
            for (int i = 0; i < 4; ++i) {
              const int64_t oh = band.oh0 + kTile * (r + a) + i;
              y_rows[a][i] = oh < g.OH ? y + (b * g.O + o) * g.P + oh * g.OW : nullptr;
            }
          const float* in = M + o * T + (b * band.rows + r) * TW;  // M[ξ] is in + ξ·ms
          for (int64_t s0 = 0; s0 < TW; s0 += kLanes) {
            const int64_t n = std::min<int64_t>(kLanes, TW - s0);
            if (vectors)
              output_tiles_avx512(in + s0, ms, k, n, finish, y_rows, kTile * s0, g.OW);
            else
              for (int64_t a = 0; a < k; ++a)
                output_row_tiles(in + a * TW + s0, ms, n, finish, y_rows[a], kTile * s0, g.OW);
          }
        }
    }
  });
}

}  // namespace

bool winograd_f4_applies(const ConvGeometry& g) {
  // Lane offsets are 32-bit: every input and output value of the batch must be reachable.
  const int64_t limit = std::numeric_limits<int32_t>::max();
  return winograd_applies(g) && g.OH >= kWinogradF4MinMap && g.OW >= kWinogradF4MinMap && g.OW >= kWinogradF4MinMap && g.N * g.C * g.H * g.W < limit &&
         g.N * g.O * g.P < limit;
}

ConvGeometry winograd_f4_input_gradient_geometry(const ConvGeometry& g) {
  ConvGeometry t = g;
  t.C = t.Cg = g.O, t.O = t.Og = g.C;
  t.H = g.OH, t.W = g.OW, t.OH = g.H, t.OW = g.W;
  t.ph = g.KH - 1 - g.ph, t.pw = g.KW - 1 - g.pw;
  t.P = g.H * g.W;
  t.rows = t.rows_g = t.C * g.KH * g.KW;
  return t;
}

namespace {

using WinogradF4Weights = WinogradWeights<WinogradF4Kernel>;

// y = epilogue(conv(x, w)) for the weights' transform U.
void winograd_f4_products(const ConvGeometry& g, const float* x, const WinogradF4Weights& packed_u,
                          const Epilogue& epilogue, float* y) {
  check(epilogue.residual == nullptr, "winograd_f4_forward: a residual cannot be fused");
  const WinogradTiling tiling = winograd_tiling(g, kTile, kSlices, kF4Bytes, kF4MinTiles);
  const ConvGemm product(tiling.blocks());
  parallel_for(tiling.blocks(), 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t n0 = k * tiling.block, nb = tiling.images_in(k);
      const int64_t max_tiles = nb * tiling.band_rows * tiling.TW;
      Scratch V(kSlices * winograd_slice_stride(g.C, max_tiles)), M(kSlices * winograd_slice_stride(g.O, max_tiles));
      for (int64_t r0 = 0; r0 < tiling.TH; r0 += tiling.band_rows) {
        const F4Band band{nb, kTile * r0, std::min(tiling.band_rows, tiling.TH - r0), tiling.TW};
        const int64_t T = band.tiles();
        winograd_f4_input(g, x + n0 * g.C * g.H * g.W, band, V.data());
        for_each_slice(product, kSlices, [&](int xi) {
          product(packed_u[xi], false, T, 1.0f, V.data() + xi * winograd_slice_stride(g.C, T), T, 0.0f,
                  M.data() + xi * winograd_slice_stride(g.O, T), T);
        });
        winograd_f4_output(g, M.data(), band, epilogue, y + n0 * g.O * g.P);
      }
    }
  });
}

}  // namespace

void winograd_f4_forward(const ConvGeometry& g, const float* x, const float* w, const Epilogue& epilogue, float* y,
                         const PreparedWeights& kept) {
  winograd_f4_products(g, x, *winograd_weights<WinogradF4Kernel>(g, w, false, WeightForm::Winograd, kept), epilogue, y);
}

void winograd_f4_input_gradient(const ConvGeometry& g, const float* w, const float* dy, float* dx,
                                const PreparedWeights& kept) {
  const ConvGeometry t = winograd_f4_input_gradient_geometry(g);
  const auto packed_u = kept.get<WinogradF4Weights>(
      WeightForm::WinogradFlipped, {uint64_t(kSlices), uint64_t(avx512_gemm_available())}, [&] {
        // w̃[c][o] = w[o][c] with its nine taps reversed (both axes flipped).
        Scratch flipped(g.C * g.O * 9);
        float* wt = flipped.data();
        parallel_for(g.C, std::max<int64_t>(1, kCopyGrain / (9 * g.O)), [&](int64_t c0, int64_t c1) {
          for (int64_t c = c0; c < c1; ++c)
            for (int64_t o = 0; o < g.O; ++o)
              for (int tap = 0; tap < 9; ++tap) wt[(c * g.O + o) * 9 + 8 - tap] = w[(o * g.C + c) * 9 + tap];
        });
        auto u = std::make_shared<const WinogradF4Weights>(t, wt, false);
        return std::pair<std::shared_ptr<const WinogradF4Weights>, int64_t>{u, u->bytes()};
      });
  winograd_f4_products(t, dy, *packed_u, Epilogue{}, dx);
}

}  // namespace adjoint::conv
