#include "ops/conv.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/flops.h"
#include "engine/gemm.h"
#include "engine/gemm_avx512.h"
#include "engine/prefetch.h"
#include "engine/threads.h"
#include "engine/vectorize.h"
#include "ops/activation.h"
#include "ops/conv_direct.h"
#include "ops/layout.h"
#include "ops/norm.h"
#include "ops/winograd_avx512.h"

#if defined(__x86_64__)
#include "engine/avx512.h"
#endif

namespace adjoint {

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

namespace {

// How many output columns (positions, of one or several images) one GEMM covers. The
// column matrix of a tile is written by im2col and read straight back by OpenBLAS's
// packing, so it should stay in the core's L2 cache: about kColumnBytes, but never fewer
// than kMinColumns columns (narrower products lose sgemm's rate) nor more than kMaxColumns.
// Measured on a 64→64 3×3 layer at 32×32: tiles of 256–512 columns run 10% faster than
// whole 1024-column images.
constexpr int64_t kColumnBytes = 1 << 20;
constexpr int64_t kMinColumns = 256;
constexpr int64_t kMaxColumns = 1024;
// The backward pass sums the weight gradient over tiles: a deep layer's (O, C·kh·kw) sum is
// megabytes, read and written once per tile, so its tiles are wider.
constexpr int64_t kMinColumnsBackward = 1024;
// A 1×1 stride-1 conv reads its input in place (no column matrix) when an image has at
// least this many positions; smaller images are gathered into one wider product. Measured
// (256 channels, 8×8): per-image products at 64 columns beat the gathered product plus
// its two copies; at 16 columns (512 channels, 4×4) they run at 60% and lose.
constexpr int64_t kPointwiseInPlace = 64;
// The weight gradient is summed over image blocks in chunks of consecutive blocks, one
// partial sum per chunk, added in chunk order: deterministic, and parallel up to this many.
constexpr int64_t kMaxPartials = 8;
// Elements copied per task in the im2col/col2im/gather loops.
constexpr int64_t kCopyGrain = 1 << 15;

// Every extent of one convolution.
struct ConvGeometry {
  int64_t N, C, H, W;  // input
  int64_t O, KH, KW;   // weight (O, C/groups, KH, KW)
  int64_t OH, OW;      // output
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t groups, Cg, Og;  // groups, input and output channels per group
  int64_t P;               // OH·OW: output positions per image
  int64_t rows;            // C·KH·KW: rows of the column matrix
  int64_t rows_g;          // Cg·KH·KW: the GEMM reduction per group
  bool pointwise;          // 1×1, stride 1, no padding: an image is its own column matrix
  bool flat;               // stride 1 and OW == W: an im2col row is one shifted copy of a plane
};

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
  t.block = std::clamp<int64_t>((target + g.P - 1) / g.P, 1, std::max<int64_t>(g.N, 1));
  return t;
}

ConvGeometry make_geometry(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o) {
  check(x.defined() && w.defined(), "conv2d: undefined input or weight");
  check(x.dim() == 4, "conv2d: input must be (N, C, H, W), got ", x.shape());
  check(w.dim() == 4, "conv2d: weight must be (O, C/groups, kh, kw), got ", w.shape());
  check(o.stride_h >= 1 && o.stride_w >= 1 && o.dilation_h >= 1 && o.dilation_w >= 1 && o.pad_h >= 0 && o.pad_w >= 0 &&
            o.groups >= 1,
        "conv2d: invalid options stride ", o.stride_h, "x", o.stride_w, ", padding ", o.pad_h, "x", o.pad_w,
        ", dilation ", o.dilation_h, "x", o.dilation_w, ", groups ", o.groups);
  ConvGeometry g{};
  g.N = x.size(0), g.C = x.size(1), g.H = x.size(2), g.W = x.size(3);
  g.O = w.size(0), g.KH = w.size(2), g.KW = w.size(3);
  g.groups = o.groups;
  check(g.C % g.groups == 0 && g.O % g.groups == 0, "conv2d: groups ", g.groups, " must divide the ", g.C,
        " input channels of input ", x.shape(), " and the ", g.O, " output channels of weight ", w.shape());
  g.Cg = g.C / g.groups, g.Og = g.O / g.groups;
  check(w.size(1) == g.Cg, "conv2d: weight ", w.shape(), " expects ", w.size(1) * g.groups,
        " input channels, input is ", x.shape());
  if (bias.defined())
    check(bias.shape() == Shape{g.O}, "conv2d: bias ", bias.shape(), " does not match weight ", w.shape(),
          " (expects [", g.O, "])");
  g.sh = o.stride_h, g.sw = o.stride_w, g.ph = o.pad_h, g.pw = o.pad_w, g.dh = o.dilation_h, g.dw = o.dilation_w;
  g.OH = conv_output_size(g.H, g.KH, g.sh, g.ph, g.dh);
  g.OW = conv_output_size(g.W, g.KW, g.sw, g.pw, g.dw);
  check(g.OH > 0 && g.OW > 0 && g.KH > 0 && g.KW > 0, "conv2d: kernel ", g.KH, "x", g.KW, " (dilation ", g.dh, "x",
        g.dw, ") does not fit input ", x.shape(), " padded by ", g.ph, "x", g.pw);
  g.P = g.OH * g.OW;
  g.rows = g.C * g.KH * g.KW;
  g.rows_g = g.Cg * g.KH * g.KW;
  g.pointwise = g.KH == 1 && g.KW == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
  g.flat = g.sh == 1 && g.sw == 1 && g.OW == g.W;
  return g;
}

// Scratch memory for column matrices, kept between calls: a fresh multi-megabyte buffer
// is page-faulted in on first touch, a sizeable cost next to a small layer's GEMM. Each
// buffer serves one image block at a time (not thread_local: a thread waiting in a nested
// parallel loop may start a second block).
class Scratch {
 public:
  explicit Scratch(int64_t n) {
    if (n > 0) buffer_ = take(static_cast<size_t>(n));
  }
  ~Scratch() {
    if (buffer_) give(std::move(buffer_));
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  float* data() { return buffer_ ? buffer_->data() : nullptr; }

 private:
  using Buffer = std::unique_ptr<std::vector<float>>;
  // What the pool may keep between calls.
  static constexpr size_t kMaxPooled = 16;
  static constexpr size_t kMaxPooledFloats = size_t(32) << 20;  // 128 MiB
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<Buffer>& pool() {
    static std::vector<Buffer> p;
    return p;
  }
  static bool smaller(const Buffer& a, const Buffer& b) { return a->size() < b->size(); }
  // The smallest pooled buffer that fits, else a new one.
  static Buffer take(size_t n) {
    std::lock_guard<std::mutex> lock(mutex());
    auto& p = pool();
    auto best = p.end();
    for (auto it = p.begin(); it != p.end(); ++it)
      if ((*it)->size() >= n && (best == p.end() || (*it)->size() < (*best)->size())) best = it;
    if (best == p.end()) return std::make_unique<std::vector<float>>(n);
    Buffer out = std::move(*best);
    p.erase(best);
    return out;
  }
  // Back to the pool; beyond its limits the smallest buffers go (too many) or the largest (too big).
  static void give(Buffer b) {
    std::lock_guard<std::mutex> lock(mutex());
    auto& p = pool();
    p.push_back(std::move(b));
    if (p.size() > kMaxPooled) p.erase(std::min_element(p.begin(), p.end(), smaller));
    size_t total = 0;
    for (const Buffer& q : p) total += q->size();
    while (total > kMaxPooledFloats) {
      auto largest = std::max_element(p.begin(), p.end(), smaller);
      total -= (*largest)->size();
      p.erase(largest);
    }
  }
  Buffer buffer_;
};

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

// What the forward pass does to each output value of channel o as it writes it: + bias[o];
// then, with eval-mode BatchNorm fused in (conv2d_batch_norm_eval), ·scale[o] + shift[o];
// then, with a fused ReLU, max(·, 0). These are the float operations of the separate ops
// in their order, so a fused output is bitwise the unfused one.
struct Epilogue {
  const float* bias = nullptr;
  const float* scale = nullptr;  // with shift, or neither
  const float* shift = nullptr;
  bool relu = false;

  // Anything beyond the bias (which the GEMMs may add themselves).
  bool after_bias() const { return scale != nullptr || relu; }
  // The steps after the bias on n values of channel o, in place. One branch-free loop per
  // case, so that each vectorises (std::max keeps a NaN, as ReLU does).
  void finish_row(float* __restrict row, int64_t n, int64_t o) const {
    if (scale) {
      const float k = scale[o], s = shift[o];
      if (relu)
        for (int64_t i = 0; i < n; ++i) row[i] = std::max(row[i] * k + s, 0.0f);
      else
        for (int64_t i = 0; i < n; ++i) row[i] = row[i] * k + s;
    } else if (relu) {
      for (int64_t i = 0; i < n; ++i) row[i] = std::max(row[i], 0.0f);
    }
  }
};

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
        for (int64_t i = 0; i < g.KH; ++i)
          for (int64_t j = 0; j < g.KW; ++j) {
            const int64_t r = (c * g.KH + i) * g.KW + j;
            const Tap& k = taps[i * g.KW + j];
            if (k.rh.lo == k.rh.hi) continue;
            float* src = cols + r * ld + b * T - t.oh0 * g.OW;  // src[oh·OW + ow] is output (oh, ow)
            if (g.flat) {  // one shifted add over the valid rows, the wrapped padding zeroed first
              for (int64_t oh = k.rh.lo; oh < k.rh.hi; ++oh) {
                std::fill(src + oh * g.OW, src + oh * g.OW + k.rw.lo, 0.0f);
                std::fill(src + oh * g.OW + k.rw.hi, src + (oh + 1) * g.OW, 0.0f);
              }
              const int64_t q0 = k.rh.lo * g.OW + k.rw.lo, q1 = (k.rh.hi - 1) * g.OW + k.rw.hi;
              float* d = plane + k.h_off * g.W + k.w_off;
              for (int64_t q = q0; q < q1; ++q) d[q] += src[q];
              continue;
            }
            for (int64_t oh = k.rh.lo; oh < k.rh.hi; ++oh) {
              const float* s = src + oh * g.OW;
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

// The GEMM for the products of `blocks` image blocks: with enough blocks to keep every thread
// busy, each product runs on its block's thread; with few, each is split across threads
// (gemm.h: the results are the same bits either way). The widest kernels the CPU has, as
// oneDNN's convolutions run (GemmKernel).
struct ConvGemm {
  bool serial;
  explicit ConvGemm(int64_t blocks) : serial(blocks >= 2 * num_threads()) {}
  void operator()(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const float* A, int64_t lda,
                  const float* B, int64_t ldb, float beta, float* C, int64_t ldc) const {
    if (serial)
      gemm_serial(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, GemmKernel::widest);
    else
      gemm(ta, tb, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, GemmKernel::widest);
  }
  void operator()(const PackedA& a, bool tb, int64_t N, float alpha, const float* B, int64_t ldb, float beta, float* C,
                  int64_t ldc) const {
    if (serial)
      gemm_serial(a, tb, N, alpha, B, ldb, beta, C, ldc);
    else
      gemm(a, tb, N, alpha, B, ldb, beta, C, ldc);
  }
};

// `count` matrices op(A_i) (M × K), A_i at A + i·stride, packed once for the products of a
// whole batch (every tile meets them).
std::vector<PackedA> pack_weights(int64_t count, bool ta, int64_t M, int64_t K, const float* A, int64_t lda,
                                  int64_t stride) {
  std::vector<PackedA> packed;
  packed.reserve(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) packed.emplace_back(ta, M, K, A + i * stride, lda, GemmKernel::widest);
  return packed;
}

// A GEMM operand or result: a row-major matrix at `data` with leading dimension `ld`.
struct Matrix {
  float* data;
  int64_t ld;
};

// y = epilogue(conv(x, w)): image blocks in parallel; per block, per tile, one GEMM per group.
void conv_forward(const ConvGeometry& g, const float* x, const float* w, const Epilogue& epilogue, float* y) {
  const float* bias = epilogue.bias;
  const Tiling tiling = choose_tiling(g, kMinColumns);
  const ConvGemm product(tiling.blocks());
  const std::vector<PackedA> weights = pack_weights(g.groups, false, g.Og, g.rows_g, w, g.rows_g, g.Og * g.rows_g);
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
        // The product: straight into y for one image (onto the bias), else staged and copied
        // out with the bias added.
        const Matrix out = nb == 1 ? Matrix{y_block + t.oh0 * g.OW, g.P} : Matrix{staging.data(), ncols};
        const float beta = nb == 1 && bias ? 1.0f : 0.0f;
        if (beta != 0.0f)
          for (int64_t o = 0; o < g.O; ++o) std::fill(out.data + o * out.ld, out.data + o * out.ld + ncols, bias[o]);
        for (int64_t gi = 0; gi < g.groups; ++gi)
          product(weights[gi], false, ncols, 1.0f, cols.data + gi * g.rows_g * cols.ld, cols.ld, beta,
                  out.data + gi * g.Og * out.ld, out.ld);
        if (nb > 1) {
          matrix_to_planes(staging.data(), nb, g.O, g.P, epilogue, y_block);
        } else if (epilogue.after_bias()) {  // the tile is still in cache
          for (int64_t o = 0; o < g.O; ++o) epilogue.finish_row(out.data + o * out.ld, ncols, o);
        }
      }
    }
  });
}

// Σ v[0..n) in double: eight running sums (element i to sum i mod 8, a form the compiler
// vectorises), added up at the end. A fixed order: the same bits at any thread count.
double row_sum(const float* v, int64_t n) {
  double lanes[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) lanes[j] += v[i + j];
  for (; i < n; ++i) lanes[i % 8] += v[i];
  double s = 0;
  for (double lane : lanes) s += lane;
  return s;
}

// dx = col2im(Wᵀ·dY), dw = Σ_tiles dY·colsᵀ and db = Σ_tiles Σ_columns dY, each skipped when
// its pointer is null; dx arrives zeroed (col2im adds). The bias sums read each tile of dY
// while the GEMMs have it in cache.
void conv_backward(const ConvGeometry& g, const float* x, const float* w, const float* dy, float* dx, float* dw,
                   float* db) {
  const Tiling tiling = choose_tiling(g, kMinColumnsBackward);
  const ConvGemm product(tiling.blocks());
  // Wᵀ per group, for the input gradient.
  const std::vector<PackedA> weights_t =
      dx ? pack_weights(g.groups, true, g.rows_g, g.Og, w, g.rows_g, g.Og * g.rows_g) : std::vector<PackedA>{};
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
            product(weights_t[gi], false, ncols, 1.0f, dy_tile.data + gi * g.Og * dy_tile.ld, dy_tile.ld, 0.0f,
                    dcols.data + gi * g.rows_g * dcols.ld, dcols.ld);
          if (!tiling.in_place(nb)) col2im_add(g, dcols.data, nb, t, dx_block);
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

// ---------------------------------------------------------------------------------------
// Winograd F(2×2, 3×3): 3×3 kernels at stride 1, without dilation or groups.
//
// A 2×2 tile of outputs is Aᵀ[(G w Gᵀ) ⊙ (Bᵀ d B)]A for its 4×4 input patch d (Lavin &
// Gray, "Fast Algorithms for Convolutional Neural Networks", 2016): per tile and pair of
// channels, 16 multiplications instead of 36. Summed over input channels, the 16
// transform-domain positions ξ are 16 GEMMs, M[ξ] (O × tiles) = U[ξ] (O × C) · V[ξ] (C × tiles).
// The backward pass runs the adjoints of the same linear maps: dM = A dY Aᵀ per tile, then
// dU[ξ] = dM[ξ]·V[ξ]ᵀ and dW = Gᵀ dU G for the weight, dV[ξ] = U[ξ]ᵀ·dM[ξ] and dx += B dV Bᵀ
// (patches overlap, so added in a fixed order) for the input. All of it is exact algebra;
// in float the results differ from im2col's by rounding only (about 1e-6 relative).

// Below this many channels the transforms cost more than the GEMMs save.
constexpr int64_t kWinogradMinChannels = 16;
// Tiles per GEMM: V and M of a block within about kWinogradBytes (they stay in L2 between
// the transforms and the GEMMs), but at least 128 tiles forward, 512 backward (where the
// weight gradient's 16·O·C sum is read and written once per block). Measured: 64→64 at
// 32×32 runs 13% faster forward with 128-tile blocks than with 256.
constexpr int64_t kWinogradBytes = 1 << 19;
constexpr int64_t kWinogradMinTiles = 128;
constexpr int64_t kWinogradMinTilesBackward = 512;
// With the engine's AVX-512 GEMM, the forward pass's blocks go down to 32 tiles (one panel
// of its kernel's columns), so that more of them keep V and M within L2. Measured on a Zen 5
// core, batch 64, against blocks of 128 (medians of 3 rounds): 64→64 at 32×32 3% faster,
// 128→128 at 16×16 6%, 256→256 at 8×8 6%; but 512→512 at 4×4 25% slower, since every
// block's products read the transformed weights (16 MB there) again. Weights above
// 256 × 256 keep 128.
constexpr int64_t kWinogradMinTilesSmallWeights = 32;
constexpr int64_t kWinogradSmallWeights = 256 * 256;
// Backward, where each block adds its share to the weight gradient's 16·O·C sum, blocks of
// 256 tiles for weights of up to 128 × 128 (measured as above, forward and both gradients,
// medians of 5 rounds: 64→64 at 32×32 10% faster than with 512, 128→128 at 16×16 6%;
// 256→256 at 8×8 slower).
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
// back from memory every call) then costs more than the products save. Measured on a Zen 5
// core, 512→512 (forward and input gradient): im2col ran 9–14% faster at 16 and 64 tiles,
// even at 128, Winograd 27% faster at 256; 256→256 at 128 tiles, Winograd 13% faster.
// Weights of up to 128 × 128 channels transform within the caches.
constexpr int64_t kWinogradMinTilesLargeWeights = 128;
constexpr int64_t kWinogradLargeWeights = 128 * 128;

bool winograd_applies(const ConvGeometry& g) {
  const int64_t tiles = g.N * ((g.OH + 1) / 2) * ((g.OW + 1) / 2);
  return g.KH == 3 && g.KW == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 && g.dw == 1 && g.groups == 1 && g.ph <= 2 &&
         g.pw <= 2 && g.C >= kWinogradMinChannels && g.O >= kWinogradMinChannels &&
         (g.O * g.C <= kWinogradLargeWeights || tiles >= kWinogradMinTilesLargeWeights);
}

// The 16 transform-domain matrices of U, V and M lie one after the other, `slice_stride`
// floats apart: padded by a cache line, since matrices a power of two apart would put the
// 16 write streams of a transform into one cache set, which thrashes.
int64_t slice_stride(int64_t rows, int64_t cols) { return rows * cols + 16; }

// (G k Gᵀ) for a 3×3 kernel k (row-major), its 16 values in ξ order, with
// G = [[1, 0, 0], [½, ½, ½], [½, −½, ½], [0, 0, 1]]. T is a float, or a vector of floats
// holding one kernel per lane (the same operations, so the same bits, lane by lane).
template <class T>
[[gnu::always_inline]] inline void winograd_kernel_transform(const T k[9], T u[16]) {
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

// Panels p0 .. p1 (rows p·kAvx512PanelRows onwards) at depths k0 .. k1 of the 16 slices of U
// (or Uᵀ) in the AVX-512 kernels' packed layout (slices `stride` floats apart), entry (i, k)
// from the kernel at w + i·row_step + k·depth_step. A panel's kernels at one depth are
// loaded a kernel a vector and transposed, so that tap t of every row lies in one vector
// (the panel's rows in its lanes); every slice's entries at that depth are then one store
// of consecutive floats. The pass is bound by memory: it writes 16/9 of the weights (at
// batch 1, 512 → 512 on a 4×4 map, it is most of the layer's time, about 2.8 ms on a Zen 5
// core). The loops run along w's memory: Uᵀ's rows are w's input
// channels, so its panels are the inner loop (panel by panel, each read 12 kernels of every
// output channel, and a 512-channel layer's weights passed through the cache 43 times).
#if defined(__x86_64__)
ADJOINT_AVX512 void winograd_transform_packed(const float* w, int64_t row_step, int64_t depth_step, int64_t M,
                                              int64_t K, int64_t p0, int64_t p1, int64_t k0, int64_t k1, float* u,
                                              int64_t stride) {
  const __mmask16 panel = first_lanes(kAvx512PanelRows), nine = first_lanes(9);
  const bool panels_inner = row_step < depth_step;
  const int64_t outer_end = panels_inner ? k1 : p1, inner_end = panels_inner ? p1 : k1;
  for (int64_t outer = panels_inner ? k0 : p0; outer < outer_end; ++outer)
    for (int64_t inner = panels_inner ? p0 : k0; inner < inner_end; ++inner) {
      const int64_t i0 = (panels_inner ? inner : outer) * kAvx512PanelRows, k = panels_inner ? outer : inner;
      const int64_t block = k / kAvx512DepthBlock * kAvx512DepthBlock;
      float* out = u + avx512_packed_a_panel(M, K, i0, block) + (k - block) * kAvx512PanelRows;
      const int64_t rows = std::min(kAvx512PanelRows, M - i0);
      const float* kernels = w + i0 * row_step + k * depth_step;
      __m512 taps[16], v[16];  // row r's kernel, then (transposed) tap t of every row; rows past M stay zero
      for (int64_t r = 0; r < 16; ++r)
        taps[r] = r < rows ? _mm512_maskz_loadu_ps(nine, kernels + r * row_step) : _mm512_setzero_ps();
      transpose16(taps);
      winograd_kernel_transform(taps, v);
      for (int xi = 0; xi < 16; ++xi) _mm512_mask_storeu_ps(out + xi * stride, panel, v[xi]);
    }
}
#else
void winograd_transform_packed(const float*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                               float*, int64_t) {
  throw Error("winograd_transform_packed: not an x86-64 build");  // never called: no AVX-512 kernels
}
#endif

// U[ξ] (O × C, U[ξ][o][c] = (G w[o][c] Gᵀ)[ξ]) for the forward products, or its transpose
// Uᵀ[ξ] (C × O) for the input gradient's, ready for the 16 products of a pass. Where the
// AVX-512 kernels run them, the transform writes their packed layout directly: one pass
// over memory, where a transform and then a pack made three (the weights of a VGG layer
// at 4×4 are read for only 256 tiles, and preparing them took a fifth of inference).
// Elsewhere it writes plain matrices for OpenBLAS.
class WinogradWeights {
 public:
  WinogradWeights(const ConvGeometry& g, const float* w, bool transposed)
      : M_(transposed ? g.C : g.O),
        K_(transposed ? g.O : g.C),
        packs_(avx512_gemm_available()),
        // The 16 slices one after the other, a cache line apart beyond their size (slice_stride).
        stride_((packs_ ? avx512_packed_a_size(M_, K_) : M_ * K_) + 16),
        storage_(16 * stride_) {
    float* u = storage_.data();
    // Entry (i, k) of a slice comes from kernel w[o][c]: (o, c) = (i, k), transposed (k, i).
    const int64_t row_step = 9 * (transposed ? 1 : g.C), depth_step = 9 * (transposed ? g.C : 1);
    if (packs_)
      transform_packed(w, row_step, depth_step, u);
    else
      transform_plain(w, row_step, depth_step, u);
    slices_.reserve(16);
    for (int64_t xi = 0; xi < 16; ++xi)
      slices_.push_back(packs_ ? PackedA(M_, K_, u + xi * stride_)
                               : PackedA(false, M_, K_, u + xi * stride_, K_, GemmKernel::blas));
  }
  const PackedA& operator[](int xi) const { return slices_[static_cast<size_t>(xi)]; }

 private:
  void transform_plain(const float* w, int64_t row_step, int64_t depth_step, float* u) const {
    parallel_for(M_, std::max<int64_t>(1, 1024 / K_), [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i)
        for (int64_t k = 0; k < K_; ++k) {
          float taps[9], v[16];
          std::copy(w + i * row_step + k * depth_step, w + i * row_step + k * depth_step + 9, taps);
          winograd_kernel_transform(taps, v);
          for (int64_t xi = 0; xi < 16; ++xi) u[xi * stride_ + i * K_ + k] = v[xi];
        }
    });
  }

  void transform_packed(const float* w, int64_t row_step, int64_t depth_step, float* u) const {
    const int64_t panels = avx512_padded_rows(M_) / kAvx512PanelRows;
    if (row_step < depth_step)  // split along the depth, the outer loop (winograd_transform_packed)
      parallel_for(K_, std::max<int64_t>(1, 256 / panels), [&](int64_t k0, int64_t k1) {
        winograd_transform_packed(w, row_step, depth_step, M_, K_, 0, panels, k0, k1, u, stride_);
      });
    else
      parallel_for(panels, std::max<int64_t>(1, 256 / K_), [&](int64_t p0, int64_t p1) {
        winograd_transform_packed(w, row_step, depth_step, M_, K_, p0, p1, 0, K_, u, stride_);
      });
  }
  int64_t M_, K_;
  bool packs_;
  int64_t stride_;
  Scratch storage_;
  std::vector<PackedA> slices_;
};

// dW[o][c] = Gᵀ dU[·][o][c] G, the adjoint of winograd_kernel_transform.
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
    // rows two planes ahead are prefetched (without, a ResNet's 64-channel layers spent 40%
    // of this transform waiting on its loads).
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

// How the batch is cut for Winograd: blocks of images of few tiles, or one image in bands
// of tile rows; about `target` tiles per GEMM.
struct WinogradTiling {
  int64_t N, block, band_rows, TH, TW;
  int64_t blocks() const { return (N + block - 1) / block; }
  int64_t images_in(int64_t k) const { return std::min(block, N - k * block); }
};
WinogradTiling winograd_tiling(const ConvGeometry& g, int64_t min_tiles) {
  WinogradTiling t{g.N, 1, 0, (g.OH + 1) / 2, (g.OW + 1) / 2};
  // A tile holds 16·C values of V and 16·O of M; keep a block's near kWinogradBytes.
  const int64_t target =
      std::clamp<int64_t>(kWinogradBytes / (16 * int64_t(sizeof(float)) * (g.C + g.O)), min_tiles, kMaxColumns);
  const int64_t per_image = t.TH * t.TW;
  t.band_rows = t.TH;
  if (per_image >= target) {
    const int64_t rows = std::clamp<int64_t>((target + t.TW / 2) / t.TW, 1, t.TH);
    const int64_t bands = (t.TH + rows - 1) / rows;
    t.band_rows = (t.TH + bands - 1) / bands;
  } else {
    t.block = std::clamp<int64_t>((target + per_image - 1) / per_image, 1, std::max<int64_t>(g.N, 1));
  }
  return t;
}

// y = epilogue(conv(x, w)).
void winograd_forward(const ConvGeometry& g, const float* x, const float* w, const Epilogue& epilogue, float* y) {
  const WinogradTiling tiling = winograd_tiling(g, winograd_min_tiles(g, false));
  const WinogradWeights packed_u(g, w, false);
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
        for (int xi = 0; xi < 16; ++xi)
          product(packed_u[xi], false, T, 1.0f, V.data() + xi * slice_stride(g.C, T), T, 0.0f,
                  M.data() + xi * slice_stride(g.O, T), T);
        winograd_output(g, M.data(), band, epilogue, y + n0 * g.O * g.P);
      }
    }
  });
}

// As conv_backward, through the transform domain, except that dx is overwritten (it need
// not arrive zeroed).
void winograd_backward(const ConvGeometry& g, const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db) {
  const WinogradTiling tiling = winograd_tiling(g, winograd_min_tiles(g, true));
  const int64_t blocks = tiling.blocks();
  if (blocks == 0) {  // an empty batch: the parameter gradients are zero
    if (dw) std::fill(dw, dw + g.O * g.rows_g, 0.0f);
    if (db) std::fill(db, db + g.O, 0.0f);
    return;
  }
  const ConvGemm product(blocks);
  const int64_t us = slice_stride(g.O, g.C), u_size = 16 * us;
  // The weights in the transform domain, transposed, for the input gradient.
  std::optional<WinogradWeights> packed_u_t;
  if (dx) packed_u_t.emplace(g, w, true);
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
          for (int xi = 0; xi < 16; ++xi)
            product(false, true, g.O, g.C, T, 1.0f, dM.data() + xi * ms, T, V.data() + xi * vs, T, beta,
                    dU_chunk + xi * us, g.C);
        }
        if (dx_block) {
          for (int xi = 0; xi < 16; ++xi)  // dV, in V's buffer
            product((*packed_u_t)[xi], false, T, 1.0f, dM.data() + xi * ms, T, 0.0f, V.data() + xi * vs, T);
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

// The direct kernels' view of a convolution (ops/conv_direct.h), forward or for its input
// gradient (the convolution of dY with the transposed, flipped kernel), when they run it.
std::optional<DirectConvShape> direct_shape(const ConvGeometry& g, bool input_gradient) {
  if (g.dh != 1 || g.dw != 1 || g.groups != 1) return std::nullopt;
  if (input_gradient && (g.sh != 1 || g.sw != 1)) return std::nullopt;  // a strided conv's adjoint is not one
  const DirectConvShape s =
      input_gradient
          ? DirectConvShape{g.N, g.O, g.OH, g.OW, g.C, g.KH, g.KW, g.KH - 1 - g.ph, g.KW - 1 - g.pw, g.H, g.W}
          : DirectConvShape{g.N, g.C, g.H, g.W, g.O, g.KH, g.KW, g.ph, g.pw, g.OH, g.OW, g.sh, g.sw};
  if (!direct_conv_runs(s)) return std::nullopt;
  return s;
}

// Convolution is affine in x (and linear in w): one rule serves every transport.
class Conv2dNode : public Node {
 public:
  Conv2dNode(const ConvGeometry& g, Tensor x, Tensor w) : g_(g), x_(std::move(x)), w_(std::move(w)) {}
  std::string name() const override { return "conv2d"; }

  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override {
    Tensor dx, dw, db;
    const bool winograd = winograd_applies(g_);
    const std::optional<DirectConvShape> direct = needs[0] ? direct_shape(g_, true) : std::nullopt;
    // conv_backward adds into dx; winograd_backward and direct_conv write every entry.
    if (needs[0]) dx = winograd || direct ? Tensor::empty(x_.shape()) : Tensor::zeros(x_.shape());
    if (needs[1]) dw = Tensor::empty(w_.shape());
    if (needs.size() > 2 && needs[2]) db = Tensor::empty({g_.O});
    if (direct) direct_conv(*direct, u.data(), w_.data(), true, dx.data(), [](float*, int64_t) {});
    auto pointer = [](Tensor& t) { return t.defined() ? t.data() : nullptr; };
    float* dx_left = direct ? nullptr : pointer(dx);  // what the GEMM paths still compute
    if (!dx_left && !dw.defined() && !db.defined()) return {dx, dw, db};
    if (winograd)
      winograd_backward(g_, x_.data(), w_.data(), u.data(), dx_left, pointer(dw), pointer(db));
    else
      conv_backward(g_, x_.data(), w_.data(), u.data(), dx_left, pointer(dw), pointer(db));
    return {dx, dw, db};
  }

 private:
  void release() override { x_ = w_ = Tensor(); }

  ConvGeometry g_;
  Tensor x_, w_;
};

// The output of a convolution with `epilogue` (its bias pointer is set here, from `bias`).
Tensor convolve(const ConvGeometry& g, const Tensor& x, const Tensor& w, const Tensor& bias, Epilogue epilogue) {
  Tensor out = Tensor::empty({g.N, g.O, g.OH, g.OW});
  count_multiply_adds(g.N * g.O * g.P * g.rows_g);
  epilogue.bias = bias.defined() ? bias.data() : nullptr;
  if (g.N == 0) return out;
  if (const std::optional<DirectConvShape> direct = direct_shape(g, false)) {
    direct_conv(*direct, x.data(), w.data(), false, out.data(), [&](float* plane, int64_t o) {
      run_widest([&] {
        if (epilogue.bias)
          for (int64_t p = 0; p < g.P; ++p) plane[p] += epilogue.bias[o];
        epilogue.finish_row(plane, g.P, o);
      });
    });
  } else if (winograd_applies(g))
    winograd_forward(g, x.data(), w.data(), epilogue, out.data());
  else
    conv_forward(g, x.data(), w.data(), epilogue, out.data());
  return out;
}

Tensor contiguous_or_undefined(const Tensor& t) { return t.defined() ? t.contiguous() : Tensor(); }

// How many kernel taps at each end of one axis read nothing but padding, for every output
// position (dilation 1). Cut symmetrically only, since the padding is symmetric.
int64_t dead_taps(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t pad) {
  const auto live = [&](int64_t k) {
    for (int64_t o = 0; o < out; ++o)
      if (const int64_t i = o * stride - pad + k; i >= 0 && i < in) return true;
    return false;
  };
  int64_t cut = 0;
  while (2 * (cut + 1) < kernel && cut < pad && !live(cut) && !live(kernel - 1 - cut)) ++cut;
  return cut;
}

// A convolution whose outer kernel taps meet only padding equals the one with those taps
// cut from the kernel and the padding cut to match: a 3×3 convolution with padding 1 over
// a 1×1 map (VGG's last blocks on 28×28 images) is its centre tap, one GEMM where im2col
// multiplies nine taps and Winograd sixteen transformed ones. The cut is a recorded slice
// of the weight, so the cut taps' gradient is zero under every transport. Returns false
// (and leaves the outputs alone) when no tap is dead.
bool cut_dead_taps(const ConvGeometry& g, const Tensor& w, const Conv2dOptions& o, Tensor* cut_w, Conv2dOptions* cut_o) {
  if (g.dh != 1 || g.dw != 1) return false;
  const int64_t ch = dead_taps(g.H, g.OH, g.KH, g.sh, g.ph), cw = dead_taps(g.W, g.OW, g.KW, g.sw, g.pw);
  if (ch == 0 && cw == 0) return false;
  *cut_w = slice(slice(w, 2, ch, g.KH - ch), 3, cw, g.KW - cw);
  *cut_o = o;
  cut_o->pad_h -= ch;
  cut_o->pad_w -= cw;
  return true;
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Conv2dOptions& options) {
  const ConvGeometry g = make_geometry(x_in, weight_in, bias_in, options);
  Tensor cut_w;
  Conv2dOptions cut_o;
  if (cut_dead_taps(g, weight_in, options, &cut_w, &cut_o)) return conv2d(x_in, cut_w, bias_in, cut_o);
  Tensor x = x_in.contiguous(), w = weight_in.contiguous(), bias = contiguous_or_undefined(bias_in);
  const bool record = needs_grad({x, w, bias});
  Tensor out = convolve(g, x, w, bias, Epilogue{});
  if (record) attach(out, std::make_shared<Conv2dNode>(g, x.detach(), w.detach()), {x, w, bias});
  return out;
}

Tensor conv2d_batch_norm_eval(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                              const Conv2dOptions& options, const EvalBatchNorm& bn, bool then_relu) {
  if (needs_grad({x_in, weight_in, bias_in, bn.weight, bn.bias})) {
    // Only the input in a graph (a stitch's frozen models, an explanation): the BatchNorm is
    // the map z ↦ scale·z + shift under every transport, so it folds into the convolution,
    // w·scale per output channel and b·scale + shift: one op, and a pass over memory each
    // way, less. The same values up to rounding (the products are scaled before summing).
    if (!needs_grad({weight_in, bias_in, bn.weight, bn.bias})) {
      const int64_t O = weight_in.size(0);
      const ChannelAffine affine =
          eval_batch_norm_affine(O, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps);
      Tensor w = weight_in.contiguous().clone(), b = Tensor::empty({O});
      const Tensor conv_bias = contiguous_or_undefined(bias_in);
      const int64_t per_channel = w.numel() / std::max<int64_t>(O, 1);
      for (int64_t o = 0; o < O; ++o) {
        float* row = w.data() + o * per_channel;
        for (int64_t k = 0; k < per_channel; ++k) row[k] *= affine.scale[o];
        b.data()[o] = (conv_bias.defined() ? conv_bias.data()[o] : 0.0f) * affine.scale[o] + affine.shift[o];
      }
      const Tensor y = conv2d(x_in, w, b, options);
      return then_relu ? relu(y) : y;
    }
    Tensor y = batch_norm(conv2d(x_in, weight_in, bias_in, options), bn.weight, bn.bias, bn.running_mean,
                          bn.running_var, false, 0.0f, bn.eps);
    return then_relu ? relu(y) : y;
  }
  const ConvGeometry g = make_geometry(x_in, weight_in, bias_in, options);
  Tensor cut_w;
  Conv2dOptions cut_o;
  if (cut_dead_taps(g, weight_in, options, &cut_w, &cut_o))
    return conv2d_batch_norm_eval(x_in, cut_w, bias_in, cut_o, bn, then_relu);
  const ChannelAffine affine = eval_batch_norm_affine(g.O, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps);
  return convolve(g, x_in.contiguous(), weight_in.contiguous(), contiguous_or_undefined(bias_in),
                  Epilogue{nullptr, affine.scale.data(), affine.shift.data(), then_relu});
}

}  // namespace adjoint
