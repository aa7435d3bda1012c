#include "ops/conv/winograd.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <vector>

#include "engine/error.h"
#include "engine/gemm.h"
#include "engine/gemm_avx512.h"
#include "engine/prefetch.h"
#include "engine/threads.h"
#include "engine/vectorize.h"
#include "ops/conv/winograd_avx512.h"
#include "ops/conv/winograd_common.h"

#if defined(__x86_64__)
#include "engine/avx512.h"
#endif

namespace adjoint::conv {

namespace {

// Below this many channels the transforms cost more than the GEMMs save.
constexpr int64_t kWinogradMinChannels = 16;
// Tiles per GEMM: V and M of a block within about kWinogradBytes (they stay in L2 between
// the transforms and the GEMMs), but at least 128 tiles forward, 512 backward (where the
// weight gradient's 16·O·C sum is read and written once per block).
constexpr int64_t kWinogradBytes = 1 << 19;
constexpr int64_t kWinogradMinTiles = 128;
constexpr int64_t kWinogradMinTilesBackward = 512;
// With the engine's AVX-512 GEMM, the forward pass's blocks go down to 32 tiles (one panel
// of its kernel's columns), so that more of them keep V and M within L2; but with large
// weights every block's products read the transformed weights (16·O·C floats) again, so
// weights above 256 × 256 keep 128.
constexpr int64_t kWinogradMinTilesSmallWeights = 32;
constexpr int64_t kWinogradSmallWeights = 256 * 256;
// Backward, where each block adds its share to the weight gradient's 16·O·C sum, blocks of
// 256 tiles for weights of up to 128 × 128: smaller blocks keep more in L2 while that sum
// is small; larger weights keep 512.
constexpr int64_t kWinogradMinTilesBackwardSmallWeights = 256;
constexpr int64_t kWinogradSmallWeightsBackward = 128 * 128;

// The fewest tiles per GEMM for this layer, forward or backward, by the rules above (blocks
// of OpenBLAS's products, which pack the weights in every call, keep the larger minimum).
int64_t winograd_min_tiles(const ConvGeometry& g, bool backward) {
  const bool engine_gemm = avx512_gemm_available();
  if (backward)
    return engine_gemm && g.O * g.C <= kWinogradSmallWeightsBackward ? kWinogradMinTilesBackwardSmallWeights
                                                                       : kWinogradMinTilesBackward;
  return engine_gemm && g.O * g.C <= kWinogradSmallWeights ? kWinogradMinTilesSmallWeights : kWinogradMinTiles;
}

// Few tiles against large weights: the weights' transform (16·O·C floats, written and read
// back from memory every call) then costs more than the products save, and im2col runs
// the layer. Weights of up to 128 × 128 channels transform within the caches.
constexpr int64_t kWinogradMinTilesLargeWeights = 128;
constexpr int64_t kWinogradLargeWeights = 128 * 128;

}  // namespace

bool winograd_applies(const ConvGeometry& g) {
  const int64_t tiles = g.N * ((g.OH + 1) / 2) * ((g.OW + 1) / 2);
  return g.KH == 3 && g.KW == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 && g.groups == 1 && g.ph <= 2 &&
         g.pw <= 2 && g.C >= kWinogradMinChannels && g.O >= kWinogradMinChannels &&
         (g.O * g.C <= kWinogradLargeWeights || tiles >= kWinogradMinTilesLargeWeights);
}

namespace {


// (G k Gᵀ) for a 3×3 kernel k (row-major), its 16 values in ξ order, with
// G = [[1, 0, 0], [½, ½, ½], [½, −½, ½], [0, 0, 1]] (ops/conv/winograd_common.h).
struct WinogradF2Kernel {
  static constexpr int kSlices = 16;
  template <class T>
  [[gnu::always_inline]] static inline void apply(const T k[9], T u[16]) {
    T t[4][3];  // G · k
    for (int j = 0; j < 3; ++j) {
      t[0][j] = k[j], t[3][j] = k[6 + j];
      t[1][j] = 0.5f * (k[j] + k[3 + j] + k[6 + j]), t[2][j] = 0.5f * (k[j] - k[3 + j] + k[6 + j]);
    }
    for (int i = 0; i < 4; ++i) {  // (G · k) · Gᵀ
      u[4 * i + 0] = t[i][0];
      u[4 * i + 1] = 0.5f * (t[i][0] + t[i][1] + t[i][2]);
      u[4 * i + 2] = 0.5f * (t[i][0] - t[i][1] + t[i][2]);
      u[4 * i + 3] = t[i][2];
    }
  }
};
using WinogradF2Weights = WinogradWeights<WinogradF2Kernel>;

int64_t slice_stride(int64_t rows, int64_t cols) { return winograd_slice_stride(rows, cols); }

// dW[o][c] = Gᵀ dU[·][o][c] G, the adjoint of WinogradF2Kernel.
void winograd_weight_grad(const ConvGeometry& g, const float* dU, float* dw) {
  const int64_t count = g.O * g.C, stride = slice_stride(g.O, g.C);
  parallel_for(count, 1024, [&](int64_t e0, int64_t e1) {
    for (int64_t e = e0; e < e1; ++e) {
      float t[4][3];  // dU · G
      for (int i = 0; i < 4; ++i) {
        const float u0 = dU[(4 * i + 0) * stride + e], u1 = dU[(4 * i + 1) * stride + e],
                    u2 = dU[(4 * i + 2) * stride + e], u3 = dU[(4 * i + 3) * stride + e];
        t[i][0] = u0 + 0.5f * (u1 + u2), t[i][1] = 0.5f * (u1 - u2), t[i][2] = 0.5f * (u1 + u2) + u3;
      }
      float* k = dw + 9 * e;
      for (int j = 0; j < 3; ++j) {  // Gᵀ · (dU · G)
        k[j] = t[0][j] + 0.5f * (t[1][j] + t[2][j]);
        k[3 + j] = 0.5f * (t[1][j] - t[2][j]);
        k[6 + j] = 0.5f * (t[1][j] + t[2][j]) + t[3][j];
      }
    }
  });
}

// Where the tiles of a band lie: output rows [oh0, oh0 + 2·rows) of `nb` images (oh0 even),
// TW tiles across; tile t = (b·rows + r)·TW + s has its top-left output at (oh0 + 2r, 2s)
// and its 4×4 input patch at (oh0 + 2r − ph, 2s − pw).
struct WinogradBand {
  int64_t nb, oh0, rows, TW;
  int64_t tiles() const { return nb * rows * TW; }
};

// The transforms below run along a whole row of tiles at once: each of the 16 values of a
// tile is a few additions of neighbouring entries of zero-padded rows, so the loops over
// the tiles of a row are plain array arithmetic. In a padded row, entry q is input column
// q − pw (zero outside the input), q < 2·TW + 2; tile s covers entries 2s .. 2s + 3. Each
// padded row is kept as its even and its odd entries (TW + 1 each): tile s then reads even
// and odd entries s and s + 1, so every loop runs at unit stride and vectorises.
struct PaddedRows {
  int64_t half;                    // TW + 1 entries per parity
  std::vector<float> storage;      // 4 rows × {even, odd}
  explicit PaddedRows(int64_t TW) : half(TW + 1), storage(static_cast<size_t>(8 * (TW + 1))) {}
  float* even(int i) { return storage.data() + (2 * i) * half; }
  float* odd(int i) { return storage.data() + (2 * i + 1) * half; }
};

// The entries k of one parity (entry q = 2k + parity) that lie inside the input:
// 0 ≤ 2k + parity − pw < W, for first ≤ k < last.
struct EntryRange {
  int64_t first, last;
};
EntryRange inside_entries(const ConvGeometry& g, int64_t half, int64_t parity) {
  const int64_t lo = g.pw - parity;                     // 2k ≥ lo
  const int64_t hi = g.W - 1 + g.pw - parity;           // 2k ≤ hi
  const int64_t first = lo <= 0 ? 0 : (lo + 1) / 2;
  const int64_t last = hi < 0 ? 0 : std::min(half, hi / 2 + 1);
  return {first, std::max(first, last)};
}

// One row of TW tiles times B: v_j[s] from even and odd entries s and s + 1 of a row.
// The outputs are separate matrices of V; restrict says so, and the loop vectorises.
void times_B(const float* __restrict me, const float* __restrict mo, int64_t TW, float* __restrict v0,
             float* __restrict v1, float* __restrict v2, float* __restrict v3) {
  for (int64_t s = 0; s < TW; ++s) {
    const float a = me[s], e = mo[s], f = me[s + 1], h = mo[s + 1];
    v0[s] = a - f, v1[s] = e + f, v2[s] = f - e, v3[s] = e - h;
  }
}

// Its adjoint, into even and odd entries (TW + 1 each). Tile s adds to entries s and
// s + 1 of each parity: first what lands on entry s, then what lands on s + 1, so that
// no loop adds twice to one entry.
void times_B_adjoint(const float* __restrict v0, const float* __restrict v1, const float* __restrict v2,
                     const float* __restrict v3, int64_t TW, float* __restrict me, float* __restrict mo) {
  me[TW] = mo[TW] = 0.0f;
  for (int64_t s = 0; s < TW; ++s) me[s] = v0[s], mo[s] = v1[s] - v2[s] + v3[s];
  for (int64_t s = 0; s < TW; ++s) me[s + 1] += v1[s] + v2[s] - v0[s], mo[s + 1] -= v3[s];
}

// V[ξ][c][t] = (Bᵀ d B)[ξ] for the input patch d of tile t (zero outside the input).
void winograd_input(const ConvGeometry& g, const float* x, const WinogradBand& band, float* V) {
  const int64_t T = band.tiles(), TW = band.TW, vs = slice_stride(g.C, T);
  parallel_for(g.C, std::max<int64_t>(1, kCopyGrain / (16 * T)), [&](int64_t c0, int64_t c1) {
    PaddedRows p(TW), m(TW);  // the patch rows, then Bᵀ · rows
    const int64_t half = p.half;
    const EntryRange even = inside_entries(g, half, 0), odd = inside_entries(g, half, 1);
    const bool vectors = vector_isa() == VectorIsa::Avx512;
    // The input rows under the band, which plane after plane streams in from memory: the
    // rows two planes ahead are prefetched (without, this transform spends much of its
    // time waiting on its loads).
    const int64_t h0 = std::max<int64_t>(0, band.oh0 - g.ph), h1 = std::min(g.H, band.oh0 + 2 * band.rows - g.ph + 2);
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t b = 0; b < band.nb; ++b)
        for (int64_t r = 0; r < band.rows; ++r) {
          const float* plane = x + (b * g.C + c) * g.H * g.W;
          if (r == 0 && c + 2 < c1 && h1 > h0) prefetch(plane + (2 * g.H + h0) * g.W, (h1 - h0) * g.W);
          if (vectors) {  // the same operations, 16 tiles at a time (ops/winograd_avx512.h)
            const float* rows[4];
            for (int i = 0; i < 4; ++i) {
              const int64_t h = band.oh0 + 2 * r - g.ph + i;
              rows[i] = h < 0 || h >= g.H ? nullptr : plane + h * g.W;
            }
            float* out = V + c * T + (b * band.rows + r) * TW;
            for (int64_t s0 = 0; s0 < TW; s0 += kWinogradLanes)
              winograd_input_tiles_avx512(rows, g.W, g.pw, s0, std::min(kWinogradLanes, TW - s0), out + s0, vs);
            continue;
          }
          for (int i = 0; i < 4; ++i) {
            float *pe = p.even(i), *po = p.odd(i);
            std::fill(pe, pe + half, 0.0f);
            std::fill(po, po + half, 0.0f);
            const int64_t h = band.oh0 + 2 * r - g.ph + i;
            if (h < 0 || h >= g.H) continue;
            const float* row = plane + h * g.W;
            for (int64_t k = even.first; k < even.last; ++k) pe[k] = row[2 * k - g.pw];
            for (int64_t k = odd.first; k < odd.last; ++k) po[k] = row[2 * k + 1 - g.pw];
          }
          for (int parity = 0; parity < 2; ++parity) {
            auto row = [&](PaddedRows& rows, int i) { return parity ? rows.odd(i) : rows.even(i); };
            const float *p0 = row(p, 0), *p1 = row(p, 1), *p2 = row(p, 2), *p3 = row(p, 3);
            float *m0 = row(m, 0), *m1 = row(m, 1), *m2 = row(m, 2), *m3 = row(m, 3);
            for (int64_t k = 0; k < half; ++k) {
              m0[k] = p0[k] - p2[k], m1[k] = p1[k] + p2[k];
              m2[k] = p2[k] - p1[k], m3[k] = p1[k] - p3[k];
            }
          }
          float* out = V + c * T + (b * band.rows + r) * TW;  // V[ξ] is out + ξ·vs
          for (int i = 0; i < 4; ++i) {                       // · B: tile s reads entries 2s .. 2s + 3
            const float *me = m.even(i), *mo = m.odd(i);
            float* v0 = out + (4 * i + 0) * vs;
            float* v1 = out + (4 * i + 1) * vs;
            float* v2 = out + (4 * i + 2) * vs;
            float* v3 = out + (4 * i + 3) * vs;
            times_B(me, mo, TW, v0, v1, v2, v3);
          }
        }
  });
}

// The adjoint of winograd_input: dx = Σ_tiles B dV Bᵀ on each tile's patch (inside the
// input). Patches overlap by two rows; every plane adds its contributions in a fixed order.
// The bands of an image must come in order from its top: a tile row writes the rows it is
// the first to reach (all four for an image's first tile row, else its last two) and adds
// onto the two its predecessor reached, so dx needs no zeroing beforehand (a pass over
// memory saved); every row and column of the input lies in some patch.
void winograd_input_adjoint(const ConvGeometry& g, const float* dV, const WinogradBand& band, float* dx) {
  const int64_t T = band.tiles(), TW = band.TW, vs = slice_stride(g.C, T);
  parallel_for(g.C, std::max<int64_t>(1, kCopyGrain / (16 * T)), [&](int64_t c0, int64_t c1) {
    PaddedRows m(TW), p(TW);  // rows of dV · Bᵀ spread back over the padded entries, then B · rows
    const int64_t half = m.half;
    const EntryRange even = inside_entries(g, half, 0), odd = inside_entries(g, half, 1);
    const bool vectors = vector_isa() == VectorIsa::Avx512;
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t b = 0; b < band.nb; ++b)
        for (int64_t r = 0; r < band.rows; ++r) {
          const float* in = dV + c * T + (b * band.rows + r) * TW;
          if (vectors) {  // the same operations, 16 tiles at a time (ops/winograd_avx512.h)
            float* rows[4];
            bool set[4];
            for (int i = 0; i < 4; ++i) {
              const int64_t h = band.oh0 + 2 * r - g.ph + i;
              rows[i] = h < 0 || h >= g.H ? nullptr : dx + (b * g.C + c) * g.H * g.W + h * g.W;
              set[i] = i >= 2 || (band.oh0 == 0 && r == 0);  // the row's first contribution
            }
            winograd_input_adjoint_row_avx512(in, vs, TW, rows, set, g.W, g.pw);
            continue;
          }
          for (int i = 0; i < 4; ++i) {
            float *me = m.even(i), *mo = m.odd(i);
            const float* v0 = in + (4 * i + 0) * vs;
            const float* v1 = in + (4 * i + 1) * vs;
            const float* v2 = in + (4 * i + 2) * vs;
            const float* v3 = in + (4 * i + 3) * vs;
            times_B_adjoint(v0, v1, v2, v3, TW, me, mo);
          }
          for (int parity = 0; parity < 2; ++parity) {
            auto row = [&](PaddedRows& rows, int i) { return parity ? rows.odd(i) : rows.even(i); };
            const float *m0 = row(m, 0), *m1 = row(m, 1), *m2 = row(m, 2), *m3 = row(m, 3);
            float *p0 = row(p, 0), *p1 = row(p, 1), *p2 = row(p, 2), *p3 = row(p, 3);
            for (int64_t k = 0; k < half; ++k) {
              p0[k] = m0[k], p1[k] = m1[k] - m2[k] + m3[k];
              p2[k] = m1[k] + m2[k] - m0[k], p3[k] = -m3[k];
            }
          }
          float* plane = dx + (b * g.C + c) * g.H * g.W;
          for (int i = 0; i < 4; ++i) {
            const int64_t h = band.oh0 + 2 * r - g.ph + i;
            if (h < 0 || h >= g.H) continue;
            const float *pe = p.even(i), *po = p.odd(i);
            float* row = plane + h * g.W;
            if (i >= 2 || (band.oh0 == 0 && r == 0)) {  // the row's first contribution
              for (int64_t k = even.first; k < even.last; ++k) row[2 * k - g.pw] = pe[k];
              for (int64_t k = odd.first; k < odd.last; ++k) row[2 * k + 1 - g.pw] = po[k];
            } else {
              for (int64_t k = even.first; k < even.last; ++k) row[2 * k - g.pw] += pe[k];
              for (int64_t k = odd.first; k < odd.last; ++k) row[2 * k + 1 - g.pw] += po[k];
            }
          }
        }
  });
}

// y = epilogue(Aᵀ M A) for every tile, the outputs past the last row or column dropped.
void winograd_output(const ConvGeometry& g, const float* M, const WinogradBand& band, const Epilogue& epilogue,
                     float* y) {
  const int64_t T = band.tiles(), TW = band.TW, ms = slice_stride(g.O, T);
  parallel_for(g.O, std::max<int64_t>(1, kCopyGrain / (16 * T)), [&](int64_t o0, int64_t o1) {
    std::vector<float> rows(static_cast<size_t>(2 * 2 * TW));
    const bool vectors = vector_isa() == VectorIsa::Avx512;
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t b = 0; b < band.nb; ++b)
        for (int64_t r = 0; r < band.rows; ++r) {
          const float* in = M + o * T + (b * band.rows + r) * TW;
          const float add = epilogue.bias ? epilogue.bias[o] : 0.0f;
          if (vectors) {  // as below, 16 tiles at a time, the epilogue applied and y written in place
            const WinogradEpilogue finish{epilogue.scale != nullptr, epilogue.scale ? epilogue.scale[o] : 1.0f,
                                          epilogue.shift ? epilogue.shift[o] : 0.0f, epilogue.relu};
            float* y_rows[2];
            for (int i = 0; i < 2; ++i) {
              const int64_t oh = band.oh0 + 2 * r + i;
              y_rows[i] = oh < g.OH ? y + (b * g.O + o) * g.P + oh * g.OW : nullptr;
            }
            for (int64_t s = 0; s < TW; s += kWinogradLanes)
              winograd_output_tiles_avx512(in + s, ms, std::min(kWinogradLanes, TW - s), add, finish,
                                           y_rows[0] + 2 * s, y_rows[1] ? y_rows[1] + 2 * s : nullptr, g.OW - 2 * s);
            continue;
          }
          float* out0 = rows.data();  // the tiles' two output rows
          float* out1 = rows.data() + 2 * TW;
          for (int64_t s = 0; s < TW; ++s) {
            float top[4], bottom[4];  // Aᵀ on the rows of column j of the tile, then on the columns
            for (int j = 0; j < 4; ++j) {
              const float* col = in + j * ms;  // M[4k + j] is col + 4k·ms
              const float m0 = col[s], m1 = col[4 * ms + s], m2 = col[8 * ms + s], m3 = col[12 * ms + s];
              top[j] = m0 + m1 + m2, bottom[j] = m1 - m2 - m3;
            }
            out0[2 * s] = top[0] + top[1] + top[2] + add;
            out0[2 * s + 1] = top[1] - top[2] - top[3] + add;
            out1[2 * s] = bottom[0] + bottom[1] + bottom[2] + add;
            out1[2 * s + 1] = bottom[1] - bottom[2] - bottom[3] + add;
          }
          epilogue.finish_row(rows.data(), 4 * TW, o);
          for (int i = 0; i < 2; ++i) {
            const int64_t oh = band.oh0 + 2 * r + i;
            if (oh < g.OH) std::copy(rows.data() + i * 2 * TW, rows.data() + i * 2 * TW + g.OW, y + (b * g.O + o) * g.P + oh * g.OW);
          }
        }
  });
}

// The adjoint of winograd_output: dM[ξ][o][t] = (A dY Aᵀ)[ξ], dY zero past the outputs.
void winograd_output_adjoint(const ConvGeometry& g, const float* dy, const WinogradBand& band, float* dM) {
  const int64_t T = band.tiles(), TW = band.TW, ms = slice_stride(g.O, T);
  parallel_for(g.O, std::max<int64_t>(1, kCopyGrain / (16 * T)), [&](int64_t o0, int64_t o1) {
    std::vector<float> rows(static_cast<size_t>(2 * 2 * TW));
    const bool vectors = vector_isa() == VectorIsa::Avx512;
    for (int64_t o = o0; o < o1; ++o)
      for (int64_t b = 0; b < band.nb; ++b)
        for (int64_t r = 0; r < band.rows; ++r) {
          for (int i = 0; i < 2; ++i) {  // the tile rows of dY, zero past the outputs
            float* row = rows.data() + i * 2 * TW;
            std::fill(row, row + 2 * TW, 0.0f);
            const int64_t oh = band.oh0 + 2 * r + i;
            if (oh < g.OH)
              std::copy(dy + (b * g.O + o) * g.P + oh * g.OW, dy + (b * g.O + o) * g.P + (oh + 1) * g.OW, row);
          }
          float* out = dM + o * T + (b * band.rows + r) * TW;  // dM[ξ] is out + ξ·ms
          const float* y0 = rows.data();
          const float* y1 = rows.data() + 2 * TW;
          // A on the columns, c(y) = [a, a + b, a − b, −b] for a row (a, b) of a tile, then
          // on the rows, d = [c0, c0 + c1, c0 − c1, −c1]: dM[4k + j] = d_k of column entry j.
          for (int64_t s = 0; vectors && s < TW; s += kWinogradLanes)  // as below, 16 tiles at a time
            winograd_output_adjoint_tiles_avx512(y0 + 2 * s, y1 + 2 * s, std::min(kWinogradLanes, TW - s), out + s, ms);
          float* d[16];
          for (int xi = 0; xi < 16; ++xi) d[xi] = out + xi * ms;
          for (int64_t s = 0; !vectors && s < TW; ++s) {
            const float a0 = y0[2 * s], b0 = y0[2 * s + 1], a1 = y1[2 * s], b1 = y1[2 * s + 1];
            const float c0[4] = {a0, a0 + b0, a0 - b0, -b0};
            const float c1[4] = {a1, a1 + b1, a1 - b1, -b1};
            for (int j = 0; j < 4; ++j) {
              d[j][s] = c0[j], d[4 + j][s] = c0[j] + c1[j];
              d[8 + j][s] = c0[j] - c1[j], d[12 + j][s] = -c1[j];
            }
          }
        }
  });
}

}  // namespace

// y = epilogue(conv(x, w)).
void winograd_forward(const ConvGeometry& g, const float* x, const float* w, const Epilogue& epilogue, float* y,
                      const PreparedWeights& kept) {
  check(epilogue.residual == nullptr, "winograd_forward: a residual cannot be fused (rows finish in a staging copy)");
  const WinogradTiling tiling = winograd_tiling(g, 2, 16, kWinogradBytes, winograd_min_tiles(g, false));
  const auto kept_u = winograd_weights<WinogradF2Kernel>(g, w, false, WeightForm::Winograd, kept);
  const WinogradF2Weights& packed_u = *kept_u;
  const ConvGemm product(tiling.blocks());
  parallel_for(tiling.blocks(), 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t n0 = k * tiling.block, nb = tiling.images_in(k);
      const int64_t max_tiles = nb * tiling.band_rows * tiling.TW;
      Scratch V(16 * slice_stride(g.C, max_tiles)), M(16 * slice_stride(g.O, max_tiles));
      for (int64_t r0 = 0; r0 < tiling.TH; r0 += tiling.band_rows) {
        const WinogradBand band{nb, 2 * r0, std::min(tiling.band_rows, tiling.TH - r0), tiling.TW};
        const int64_t T = band.tiles();
        winograd_input(g, x + n0 * g.C * g.H * g.W, band, V.data());
        for_each_slice(product, 16, [&](int xi) {
          product(packed_u[xi], false, T, 1.0f, V.data() + xi * slice_stride(g.C, T), T, 0.0f,
                  M.data() + xi * slice_stride(g.O, T), T);
        });
        winograd_output(g, M.data(), band, epilogue, y + n0 * g.O * g.P);
      }
    }
  });
}

// As conv_backward, through the transform domain, except that dx is overwritten (it need
// not arrive zeroed).
void winograd_backward(const ConvGeometry& g, const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db, const PreparedWeights& kept) {
  const WinogradTiling tiling = winograd_tiling(g, 2, 16, kWinogradBytes, winograd_min_tiles(g, true));
  const int64_t blocks = tiling.blocks();
  if (blocks == 0) {  // an empty batch: the parameter gradients are zero
    if (dw) std::fill(dw, dw + g.O * g.rows_g, 0.0f);
    if (db) std::fill(db, db + g.O, 0.0f);
    return;
  }
  const ConvGemm product(blocks);
  const int64_t us = slice_stride(g.O, g.C), u_size = 16 * us;
  // The weights in the transform domain, transposed, for the input gradient.
  std::shared_ptr<const WinogradF2Weights> packed_u_t;
  if (dx) packed_u_t = winograd_weights<WinogradF2Kernel>(g, w, true, WeightForm::Winograd, kept);
  const int64_t chunk = (blocks + kMaxPartials - 1) / kMaxPartials;  // blocks per partial sum
  const int64_t chunks = (blocks + chunk - 1) / chunk;
  Scratch dU(dw ? chunks * u_size : 0);  // the weight gradient in the transform domain, per chunk
  std::vector<double> bias_sums(db ? static_cast<size_t>(chunks * g.O) : 0, 0.0);

  parallel_for(blocks, chunk, [&](int64_t k0, int64_t k1) {
    float* dU_chunk = dw ? dU.data() + (k0 / chunk) * u_size : nullptr;
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t n0 = k * tiling.block, nb = tiling.images_in(k);
      const float* dy_block = dy + n0 * g.O * g.P;
      float* dx_block = dx ? dx + n0 * g.C * g.H * g.W : nullptr;
      const int64_t max_tiles = nb * tiling.band_rows * tiling.TW;
      const bool transforms = dw || dx;
      Scratch V(transforms ? 16 * slice_stride(g.C, max_tiles) : 0);
      Scratch dM(transforms ? 16 * slice_stride(g.O, max_tiles) : 0);
      for (int64_t r0 = 0; r0 < tiling.TH; r0 += tiling.band_rows) {
        const WinogradBand band{nb, 2 * r0, std::min(tiling.band_rows, tiling.TH - r0), tiling.TW};
        const int64_t T = band.tiles(), oh1 = std::min(g.OH, band.oh0 + 2 * band.rows);
        const int64_t vs = slice_stride(g.C, T), ms = slice_stride(g.O, T);
        if (db)
          for (int64_t b = 0; b < nb; ++b)
            for (int64_t o = 0; o < g.O; ++o)
              bias_sums[(k0 / chunk) * g.O + o] +=
                  row_sum(dy_block + (b * g.O + o) * g.P + band.oh0 * g.OW, (oh1 - band.oh0) * g.OW);
        if (!transforms) continue;
        winograd_output_adjoint(g, dy_block, band, dM.data());
        if (dw) {
          winograd_input(g, x + n0 * g.C * g.H * g.W, band, V.data());
          const float beta = k == k0 && r0 == 0 ? 0.0f : 1.0f;  // the chunk's first band starts its sum
          for_each_slice(product, 16, [&](int xi) {
            product(false, true, g.O, g.C, T, 1.0f, dM.data() + xi * ms, T, V.data() + xi * vs, T, beta,
                    dU_chunk + xi * us, g.C);
          });
        }
        if (dx_block) {
          for_each_slice(product, 16, [&](int xi) {  // dV, in V's buffer
            product((*packed_u_t)[xi], false, T, 1.0f, dM.data() + xi * ms, T, 0.0f, V.data() + xi * vs, T);
          });
          winograd_input_adjoint(g, V.data(), band, dx_block);
        }
      }
    }
  });

  if (db)
    for (int64_t o = 0; o < g.O; ++o) {
      double s = 0;
      for (int64_t c = 0; c < chunks; ++c) s += bias_sums[c * g.O + o];
      db[o] = static_cast<float>(s);
    }
  if (dw) {
    float* sums = dU.data();
    const int64_t count = g.O * g.C;
    if (chunks > 1)  // the partial sums, in chunk order, into the first (the slices' padding left out)
      parallel_for(16 * count, 1 << 14, [&](int64_t e0, int64_t e1) {
        for (int64_t e = e0; e < e1; ++e) {
          const int64_t at = (e / count) * us + e % count;
          for (int64_t c = 1; c < chunks; ++c) sums[at] += sums[c * u_size + at];
        }
      });
    winograd_weight_grad(g, sums, dw);
  }
}

}  // namespace adjoint::conv
