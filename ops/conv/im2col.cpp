#include "ops/conv/im2col.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

#include "engine/gemm.h"
#include "engine/gemm_avx512.h"
#include "engine/threads.h"
#include "engine/vectorize.h"

namespace adjoint::conv {

namespace {

// How many output columns (positions, of one or several images) one GEMM covers. The
// column matrix of a tile is written by im2col and read straight back by OpenBLAS's
// packing, so it should stay in the core's L2 cache: about kColumnBytes, but never fewer
// than kMinColumns columns (narrower products lose sgemm's rate) nor more than kMaxColumns
// (geometry.h). Smaller tiles beat whole images where they keep the column matrix in L2.
constexpr int64_t kColumnBytes = 1 << 20;
constexpr int64_t kMinColumns = 256;
// The backward pass sums the weight gradient over tiles: a deep layer's (O, C·kh·kw) sum is
// megabytes, read and written once per tile, so its tiles are wider.
constexpr int64_t kMinColumnsBackward = 1024;
// A 1×1 stride-1 conv reads its input in place (no column matrix) when an image has at
// least this many positions; smaller images are gathered into one wider product: a
// product this wide still beats gathering (which costs two copies), a much narrower one
// runs too far below the GEMM's rate.
constexpr int64_t kPointwiseInPlace = 64;

// The output columns of one product that the epilogue then finishes in place: `rows`
// outputs of each about kEpilogueBytes in all (in the L2 cache), a multiple of the GEMM's
// 32-column register tile, at least kMinColumns.
constexpr int64_t kEpilogueBytes = 512 << 10;
int64_t epilogue_columns(int64_t rows, int64_t ncols) {
  const int64_t fit = kEpilogueBytes / (int64_t(sizeof(float)) * std::max<int64_t>(rows, 1)) / 32 * 32;
  return std::min(ncols, std::max(kMinColumns, fit));
}

// How the batch is cut into GEMMs: blocks of images, each in tiles of output rows.
struct Tiling {
  int64_t N;          // images
  int64_t block;      // images folded into one GEMM
  int64_t tile_rows;  // output rows per GEMM (all of them when block > 1)
  bool pointwise;     // with block == 1: the input is read in place

  int64_t blocks() const { return (N + block - 1) / block; }
  int64_t images_in(int64_t k) const { return std::min(block, N - k * block); }
  // A 1×1 conv of one image reads its input and writes its input gradient in place.
  bool in_place(int64_t nb) const { return pointwise && nb == 1; }
};

// Images and output rows per GEMM, for tiles of at least `min_columns` (see kColumnBytes).
Tiling choose_tiling(const ConvGeometry& g, int64_t min_columns) {
  const int64_t target = std::clamp<int64_t>(kColumnBytes / (int64_t(sizeof(float)) * std::max<int64_t>(g.rows, 1)),
                                             min_columns, std::max(min_columns, kMaxColumns));
  Tiling t{g.N, 1, g.OH, g.pointwise};
  if (g.pointwise && g.P >= kPointwiseInPlace) return t;  // whole images, read in place
  if (g.P >= target) {  // one image per GEMM, in tiles of whole output rows, as equal as can be
    const int64_t rows = std::clamp<int64_t>((target + g.OW / 2) / g.OW, 1, g.OH);
    const int64_t tiles = (g.OH + rows - 1) / rows;
    t.tile_rows = (g.OH + tiles - 1) / tiles;
    return t;
  }
  t.block = balanced_block(g.N, std::clamp<int64_t>((target + g.P - 1) / g.P, 1, std::max<int64_t>(g.N, 1)));
  return t;
}

// The outputs o in [0, out) whose input o·stride + offset lies in [0, extent): [lo, hi).
struct Range {
  int64_t lo, hi;
};
Range valid_outputs(int64_t out, int64_t stride, int64_t offset, int64_t extent) {
  int64_t lo = offset >= 0 ? 0 : (-offset + stride - 1) / stride;
  const int64_t top = extent - 1 - offset;
  int64_t hi = top < 0 ? 0 : top / stride + 1;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
  return {lo, hi};
}

// `nb` images of `channels` planes of P values (image-major, as in NCHW) → the matrix
// (channels, nb·P) whose column b·P + p is position p of image b; and back, through an
// optional epilogue. The GEMMs of a block of several images take this layout.
void planes_to_matrix(const float* planes, int64_t nb, int64_t channels, int64_t P, float* matrix) {
  const int64_t grain = std::max<int64_t>(1, kCopyGrain / std::max<int64_t>(nb * P, 1));
  parallel_for(channels, grain, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t b = 0; b < nb; ++b)
        std::memcpy(matrix + c * nb * P + b * P, planes + (b * channels + c) * P, sizeof(float) * P);
  });
}
void matrix_to_planes(const float* matrix, int64_t nb, int64_t channels, int64_t P, const Epilogue& epilogue,
                      float* planes) {
  const int64_t grain = std::max<int64_t>(1, kCopyGrain / std::max<int64_t>(nb * P, 1));
  parallel_for(channels, grain, [&](int64_t c0, int64_t c1) {
    run_widest([&] {  // the epilogue in the widest vectors, as conv_forward's pieces
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t b = 0; b < nb; ++b) {
          const float* src = matrix + c * nb * P + b * P;
          float* dst = planes + (b * channels + c) * P;
          if (!epilogue.bias)
            std::memcpy(dst, src, sizeof(float) * P);
          else
            for (int64_t p = 0; p < P; ++p) dst[p] = src[p] + epilogue.bias[c];
          epilogue.finish_row(dst, P, c);
        }
    });
  });
}

// A tile: output rows [oh0, oh1) of every image of a block. Its matrices have one column
// per image and position: column b·T + (oh − oh0)·OW + ow, with T = (oh1 − oh0)·OW.
struct Tile {
  int64_t oh0, oh1;
  int64_t positions(const ConvGeometry& g) const { return (oh1 - oh0) * g.OW; }
};

// Kernel tap (i, j) over a tile: output (oh, ow) reads input (oh·sh + h_off, ow·sw + w_off),
// inside the input for rows [rh.lo, rh.hi) (within the tile) and columns [rw.lo, rw.hi).
struct Tap {
  int64_t h_off, w_off;
  Range rh, rw;
};
Tap tap(const ConvGeometry& g, int64_t i, int64_t j, const Tile& t) {
  Tap k;
  k.h_off = i * g.dh - g.ph, k.w_off = j * g.dw - g.pw;
  k.rh = valid_outputs(g.OH, g.sh, k.h_off, g.H), k.rw = valid_outputs(g.OW, g.sw, k.w_off, g.W);
  k.rh.lo = std::clamp(k.rh.lo, t.oh0, t.oh1), k.rh.hi = std::clamp(k.rh.hi, k.rh.lo, t.oh1);
  return k;
}

// The column matrix of a tile: row (c, i, j), column (b, oh, ow) holds
// x[b, c, oh·sh − ph + i·dh, ow·sw − pw + j·dw], zero in the padding.
void im2col(const ConvGeometry& g, const float* x, int64_t nb, const Tile& t, float* cols) {
  if (g.pointwise) return planes_to_matrix(x, nb, g.C, g.P, cols);  // tiles are whole images
  const int64_t T = t.positions(g), ld = nb * T;
  const int64_t grain = std::max<int64_t>(1, kCopyGrain / std::max<int64_t>(ld, 1));
  parallel_for(g.rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c = r / (g.KH * g.KW);
      const Tap k = tap(g, (r / g.KW) % g.KH, r % g.KW, t);
      for (int64_t b = 0; b < nb; ++b) {
        const float* plane = x + (b * g.C + c) * g.H * g.W;
        float* dst = cols + r * ld + b * T - t.oh0 * g.OW;  // dst[oh·OW + ow] is output (oh, ow)
        std::fill(dst + t.oh0 * g.OW, dst + k.rh.lo * g.OW, 0.0f);
        std::fill(dst + k.rh.hi * g.OW, dst + t.oh1 * g.OW, 0.0f);
        if (k.rh.lo == k.rh.hi) continue;
        if (g.flat) {
          // Output (oh, ow) reads plane[(oh + h_off)·W + ow + w_off]: one shifted copy covers
          // every valid row; the columns that wrapped into a neighbouring row are padding,
          // zeroed after.
          const int64_t q0 = k.rh.lo * g.OW + k.rw.lo, q1 = (k.rh.hi - 1) * g.OW + k.rw.hi;
          if (q1 > q0) std::memcpy(dst + q0, plane + q0 + k.h_off * g.W + k.w_off, sizeof(float) * (q1 - q0));
          for (int64_t oh = k.rh.lo; oh < k.rh.hi; ++oh) {
            std::fill(dst + oh * g.OW, dst + oh * g.OW + k.rw.lo, 0.0f);
            std::fill(dst + oh * g.OW + k.rw.hi, dst + (oh + 1) * g.OW, 0.0f);
          }
          continue;
        }
        for (int64_t oh = k.rh.lo; oh < k.rh.hi; ++oh) {
          float* d = dst + oh * g.OW;
          const float* src = plane + (oh * g.sh + k.h_off) * g.W + k.w_off;  // src[ow·sw] is column ow
          std::fill(d, d + k.rw.lo, 0.0f);
          std::fill(d + k.rw.hi, d + g.OW, 0.0f);
          if (g.sw == 1)
            std::memcpy(d + k.rw.lo, src + k.rw.lo, sizeof(float) * (k.rw.hi - k.rw.lo));
          else
            for (int64_t ow = k.rw.lo; ow < k.rw.hi; ++ow) d[ow] = src[ow * g.sw];
        }
      }
    }
  });
}

// The adjoint of im2col, accumulated: every entry of a tile's column matrix is added onto
// the input position it was copied from; padding entries are dropped. `cols` is scratch
// and gets overwritten. Parallel over channels; every input plane sums in a fixed order.
void col2im_add(const ConvGeometry& g, float* cols, int64_t nb, const Tile& t, float* dx) {
  if (g.pointwise) return matrix_to_planes(cols, nb, g.C, g.P, Epilogue{}, dx);  // one tile per image
  const int64_t T = t.positions(g), ld = nb * T;
  const int64_t grain = std::max<int64_t>(1, kCopyGrain / std::max<int64_t>(ld * g.KH * g.KW, 1));
  std::vector<Tap> taps;
  for (int64_t i = 0; i < g.KH; ++i)
    for (int64_t j = 0; j < g.KW; ++j) taps.push_back(tap(g, i, j, t));
  parallel_for(g.C, grain, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t b = 0; b < nb; ++b) {
        float* plane = dx + (b * g.C + c) * g.H * g.W;
        // src(i, j)[oh·OW + ow] is tap (i, j)'s entry for output (oh, ow).
        const auto src = [&](int64_t i, int64_t j) { return cols + ((c * g.KH + i) * g.KW + j) * ld + b * T - t.oh0 * g.OW; };
        for (int64_t i = 0; i < g.KH; ++i) {
          const Range rh = taps[i * g.KW].rh;  // the same for every tap of kernel row i
          if (rh.lo == rh.hi) continue;
          if (g.flat) {
            for (int64_t j = 0; j < g.KW; ++j) {
              const Tap& k = taps[i * g.KW + j];
              float* s = src(i, j);
              // One shifted add over the valid rows, the wrapped padding zeroed first.
              for (int64_t oh = k.rh.lo; oh < k.rh.hi; ++oh) {
                std::fill(s + oh * g.OW, s + oh * g.OW + k.rw.lo, 0.0f);
                std::fill(s + oh * g.OW + k.rw.hi, s + (oh + 1) * g.OW, 0.0f);
              }
              const int64_t q0 = k.rh.lo * g.OW + k.rw.lo, q1 = (k.rh.hi - 1) * g.OW + k.rw.hi;
              float* d = plane + k.h_off * g.W + k.w_off;
              for (int64_t q = q0; q < q1; ++q) d[q] += s[q];
            }
            continue;
          }
          // Row by row: the kernel row's taps add into one input row while it is in cache.
          // Output row oh is the only one of kernel row i to reach its input row, so each
          // input value still takes its taps in (i, j) order: a tap-by-tap pass's sums.
          for (int64_t oh = rh.lo; oh < rh.hi; ++oh)
            for (int64_t j = 0; j < g.KW; ++j) {
              const Tap& k = taps[i * g.KW + j];
              const float* s = src(i, j) + oh * g.OW;
              float* d = plane + (oh * g.sh + k.h_off) * g.W + k.w_off;
              if (g.sw == 1)  // contiguous: the compiler vectorises this form
                for (int64_t ow = k.rw.lo; ow < k.rw.hi; ++ow) d[ow] += s[ow];
              else
                for (int64_t ow = k.rw.lo; ow < k.rw.hi; ++ow) d[ow * g.sw] += s[ow];
            }
        }
      }
  });
}

// col2im for a 1×1 kernel without padding (col2im_writes_every_entry), strided: the tile's
// rows of dx are written whole, the gradient where an output position read the input and
// zero between the strides, with no zero-fill before and no read-back. Output rows
// [oh0, oh1) read input rows oh·sh, so the tiles' input rows [oh0·sh, oh1·sh) cover every
// row (OH·sh ≥ H when the kernel is 1×1 and there is no padding).
void col2im_scatter(const ConvGeometry& g, const float* cols, int64_t nb, const Tile& t, float* dx) {
  const int64_t T = t.positions(g), ld = nb * T;
  const int64_t h0 = t.oh0 * g.sh, h1 = std::min(g.H, t.oh1 * g.sh);
  const int64_t grain = std::max<int64_t>(1, kCopyGrain / std::max<int64_t>(nb * (h1 - h0) * g.W, 1));
  parallel_for(g.C, grain, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t b = 0; b < nb; ++b) {
        const float* src = cols + c * ld + b * T - t.oh0 * g.OW;  // src[oh·OW + ow] is output (oh, ow)
        float* plane = dx + (b * g.C + c) * g.H * g.W;
        for (int64_t h = h0; h < h1; ++h) {
          float* d = plane + h * g.W;
          std::fill(d, d + g.W, 0.0f);
          if (h % g.sh != 0) continue;
          const float* s = src + (h / g.sh) * g.OW;
          for (int64_t ow = 0; ow < g.OW; ++ow) d[ow * g.sw] = s[ow];
        }
      }
  });
}

// `count` matrices op(A_i) (M × K), A_i at A + i·stride, packed once for the products of a
// whole batch (every tile meets them).
std::vector<PackedA> pack_weights(int64_t count, bool ta, int64_t M, int64_t K, const float* A, int64_t lda,
                                  int64_t stride) {
  std::vector<PackedA> packed;
  packed.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) packed.emplace_back(ta, M, K, A + i * stride, lda, GemmKernel::widest);
  return packed;
}

// The weights per group (or their transposes, `ta`) packed, kept by `kept` where it keeps forms
// (one weight tensor serves different group counts on inputs of different widths).
std::shared_ptr<const std::vector<PackedA>> packed_weights(const ConvGeometry& g, bool ta, const float* w,
                                                           const PreparedWeights& kept) {
  using Packed = std::vector<PackedA>;
  const bool packs = avx512_gemm_available();
  return kept.get<Packed>(WeightForm::Im2colPacked, {uint64_t(ta), uint64_t(packs), uint64_t(g.groups)}, [&] {
    const int64_t M = ta ? g.rows_g : g.Og, K = ta ? g.Og : g.rows_g;
    auto packed = std::make_shared<const Packed>(pack_weights(g.groups, ta, M, K, w, g.rows_g, g.Og * g.rows_g));
    // Without the AVX-512 kernels a PackedA only points at the weights.
    const int64_t bytes = packs ? g.groups * avx512_packed_a_size(M, K) * int64_t(sizeof(float)) : 0;
    return std::pair<std::shared_ptr<const Packed>, int64_t>{packed, bytes};
  });
}

// A GEMM operand or result: a row-major matrix at `data` with leading dimension `ld`.
struct Matrix {
  float* data;
  int64_t ld;
};

}  // namespace

// Image blocks in parallel; per block, per tile, one GEMM per group.
void conv_forward(const ConvGeometry& g, const float* x, const float* w, const Epilogue& epilogue, float* y,
                  const PreparedWeights& kept) {
  const float* bias = epilogue.bias;
  const Tiling tiling = choose_tiling(g, kMinColumns);
  const ConvGemm product(tiling.blocks());
  const auto kept_weights = packed_weights(g, false, w, kept);
  const std::vector<PackedA>& weights = *kept_weights;
  parallel_for(tiling.blocks(), 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t n0 = k * tiling.block, nb = tiling.images_in(k);
      float* x_block = const_cast<float*>(x) + n0 * g.C * g.H * g.W;
      float* y_block = y + n0 * g.O * g.P;
      const int64_t max_cols = nb * tiling.tile_rows * g.OW;
      Scratch cols_buffer(tiling.in_place(nb) ? 0 : g.rows * max_cols);
      Scratch staging(nb == 1 ? 0 : g.O * max_cols);
      for (int64_t oh0 = 0; oh0 < g.OH; oh0 += tiling.tile_rows) {
        const Tile t{oh0, std::min(g.OH, oh0 + tiling.tile_rows)};
        const int64_t ncols = nb * t.positions(g);
        // The columns: the input itself (1×1, one image), else im2col's matrix.
        Matrix cols{x_block + t.oh0 * g.OW, g.P};
        if (!tiling.in_place(nb)) {
          im2col(g, x_block, nb, t, cols_buffer.data());
          cols = {cols_buffer.data(), ncols};
        }
        // The product: straight into y for one image, else staged and copied out with the
        // bias added.
        const Matrix out = nb == 1 ? Matrix{y_block + t.oh0 * g.OW, g.P} : Matrix{staging.data(), ncols};
        // Written straight into y, the product runs in column pieces, each given its bias and
        // finished by the epilogue while it is still in cache (the same bits as one product:
        // gemm.h), rather than y filled with the bias first (a pass over y) and added onto.
        const bool finish_pieces = nb == 1 && (bias || epilogue.after_bias());
        const int64_t piece = finish_pieces ? epilogue_columns(g.O, ncols) : ncols;
        for (int64_t j0 = 0; j0 < ncols; j0 += piece) {
          const int64_t width = std::min(piece, ncols - j0);
          for (int64_t gi = 0; gi < g.groups; ++gi)
            product(weights[gi], false, width, 1.0f, cols.data + gi * g.rows_g * cols.ld + j0, cols.ld, 0.0f,
                    out.data + gi * g.Og * out.ld + j0, out.ld);
          // The finishing pass reads the piece back from L2 and, with a residual, the residual
          // from memory: one load, a multiply-add and a store a value, as many instructions as a
          // shallow product's; the widest vectors take a quarter of SSE's.
          if (finish_pieces)
            run_widest([&] {
              for (int64_t o = 0; o < g.O; ++o) {
                float* __restrict row = out.data + o * out.ld + j0;
                if (bias)
                  for (int64_t j = 0; j < width; ++j) row[j] += bias[o];
                epilogue.finish_row(row, width, o);
              }
            });
        }
        if (nb > 1) matrix_to_planes(staging.data(), nb, g.O, g.P, epilogue, y_block);
      }
    }
  });
}

bool col2im_writes_every_entry(const ConvGeometry& g) {
  return g.pointwise || (g.KH == 1 && g.KW == 1 && g.ph == 0 && g.pw == 0 && g.dh == 1 && g.dw == 1);
}

// The bias sums read each tile of dY while the GEMMs have it in cache.
void conv_backward(const ConvGeometry& g, const float* x, const float* w, const float* dy, float* dx, float* dw,
                   float* db, const PreparedWeights& kept) {
  const Tiling tiling = choose_tiling(g, kMinColumnsBackward);
  const ConvGemm product(tiling.blocks());
  // Wᵀ per group, for the input gradient.
  const auto kept_weights_t = dx ? packed_weights(g, true, w, kept) : nullptr;
  const int64_t blocks = tiling.blocks();
  if (blocks == 0) {  // an empty batch: the parameter gradients are zero
    if (dw) std::fill(dw, dw + g.O * g.rows_g, 0.0f);
    if (db) std::fill(db, db + g.O, 0.0f);
    return;
  }
  const int64_t chunk = (blocks + kMaxPartials - 1) / kMaxPartials;  // blocks per partial sum
  const int64_t chunks = (blocks + chunk - 1) / chunk;
  const int64_t weight_size = g.O * g.rows_g;
  Scratch partials(dw && chunks > 1 ? chunks * weight_size : 0);
  std::vector<double> bias_sums(db ? static_cast<size_t>(chunks * g.O) : 0, 0.0);  // per chunk

  parallel_for(blocks, chunk, [&](int64_t k0, int64_t k1) {
    float* dw_chunk = chunks > 1 ? partials.data() + (k0 / chunk) * weight_size : dw;
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t n0 = k * tiling.block, nb = tiling.images_in(k);
      float* x_block = const_cast<float*>(x) + n0 * g.C * g.H * g.W;
      float* dy_block = const_cast<float*>(dy) + n0 * g.O * g.P;
      float* dx_block = dx ? dx + n0 * g.C * g.H * g.W : nullptr;
      const int64_t max_cols = nb * tiling.tile_rows * g.OW;
      Scratch dy_buffer(nb == 1 ? 0 : g.O * max_cols);
      // The columns, then their gradient.
      Scratch cols_buffer(tiling.in_place(nb) || !(dw || dx) ? 0 : g.rows * max_cols);
      for (int64_t oh0 = 0; oh0 < g.OH; oh0 += tiling.tile_rows) {
        const Tile t{oh0, std::min(g.OH, oh0 + tiling.tile_rows)};
        const int64_t ncols = nb * t.positions(g);
        // dY of the tile: in place for one image, else gathered into the columns' layout.
        Matrix dy_tile{dy_block + t.oh0 * g.OW, g.P};
        if (nb > 1) {
          planes_to_matrix(dy_block, nb, g.O, g.P, dy_buffer.data());
          dy_tile = {dy_buffer.data(), ncols};
        }
        if (db)
          for (int64_t o = 0; o < g.O; ++o)
            bias_sums[(k0 / chunk) * g.O + o] += row_sum(dy_tile.data + o * dy_tile.ld, ncols);
        if (dw) {
          Matrix cols{x_block + t.oh0 * g.OW, g.P};
          if (!tiling.in_place(nb)) {
            im2col(g, x_block, nb, t, cols_buffer.data());
            cols = {cols_buffer.data(), ncols};
          }
          const float beta = k == k0 && oh0 == 0 ? 0.0f : 1.0f;  // the chunk's first tile starts its sum
          for (int64_t gi = 0; gi < g.groups; ++gi)
            product(false, true, g.Og, g.rows_g, ncols, 1.0f, dy_tile.data + gi * g.Og * dy_tile.ld, dy_tile.ld,
                    cols.data + gi * g.rows_g * cols.ld, cols.ld, beta, dw_chunk + gi * g.Og * g.rows_g, g.rows_g);
        }
        if (dx_block) {
          const Matrix dcols =
              tiling.in_place(nb) ? Matrix{dx_block + t.oh0 * g.OW, g.P} : Matrix{cols_buffer.data(), ncols};
          for (int64_t gi = 0; gi < g.groups; ++gi)
            product((*kept_weights_t)[gi], false, ncols, 1.0f, dy_tile.data + gi * g.Og * dy_tile.ld, dy_tile.ld, 0.0f,
                    dcols.data + gi * g.rows_g * dcols.ld, dcols.ld);
          if (tiling.in_place(nb)) continue;
          if (col2im_writes_every_entry(g) && !g.pointwise)
            col2im_scatter(g, dcols.data, nb, t, dx_block);
          else
            col2im_add(g, dcols.data, nb, t, dx_block);
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
  if (dw && chunks > 1)  // the partial sums, in chunk order
    parallel_for(weight_size, 1 << 14, [&](int64_t e0, int64_t e1) {
      const float* sums = partials.data();
      for (int64_t e = e0; e < e1; ++e) {
        float s = sums[e];
        for (int64_t c = 1; c < chunks; ++c) s += sums[c * weight_size + e];
        dw[e] = s;
      }
    });
}

}  // namespace adjoint::conv
