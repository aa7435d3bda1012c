#include "ops/conv.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/gemm.h"
#include "engine/threads.h"

namespace adjoint {

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

namespace {

// Output columns one GEMM should cover. A block of images is folded into one product of
// (O, C·kh·kw) · (C·kh·kw, images·OH·OW); about a thousand columns keep OpenBLAS near its
// peak while the column matrix stays a few megabytes.
constexpr int64_t kTargetColumns = 1024;
// The weight gradient is summed over image blocks in chunks of consecutive blocks, one
// partial sum per chunk, added in chunk order: deterministic, and parallel up to this many.
constexpr int64_t kMaxPartials = 8;
// Elements copied per task in the im2col/col2im/gather loops.
constexpr int64_t kCopyGrain = 1 << 15;

// Every extent of one convolution.
struct ConvGeometry {
  int64_t N, C, H, W;   // input
  int64_t O, KH, KW;    // weight (O, C/groups, KH, KW)
  int64_t OH, OW;       // output
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t groups, Cg, Og;  // groups, input and output channels per group
  int64_t P;               // OH·OW: output positions per image
  int64_t rows;            // C·KH·KW: rows of the column matrix
  int64_t rows_g;          // Cg·KH·KW: the GEMM reduction per group
  bool pointwise;          // 1×1, stride 1, no padding: an image is its own column matrix
  int64_t block;           // images folded into one GEMM

  int64_t blocks() const { return (N + block - 1) / block; }
  int64_t images_in(int64_t k) const { return std::min(block, N - k * block); }
};

ConvGeometry make_geometry(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o) {
  check(x.defined() && w.defined(), "conv2d: undefined input or weight");
  check(x.dim() == 4, "conv2d: input must be (N, C, H, W), got ", x.shape());
  check(w.dim() == 4, "conv2d: weight must be (O, C/groups, kh, kw), got ", w.shape());
  check(o.stride_h >= 1 && o.stride_w >= 1 && o.dilation_h >= 1 && o.dilation_w >= 1 && o.pad_h >= 0 &&
            o.pad_w >= 0 && o.groups >= 1,
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
  check(g.OH > 0 && g.OW > 0 && g.KH > 0 && g.KW > 0, "conv2d: kernel ", g.KH, "x", g.KW, " (dilation ", g.dh,
        "x", g.dw, ") does not fit input ", x.shape(), " padded by ", g.ph, "x", g.pw);
  g.P = g.OH * g.OW;
  g.rows = g.C * g.KH * g.KW;
  g.rows_g = g.Cg * g.KH * g.KW;
  g.pointwise = g.KH == 1 && g.KW == 1 && g.sh == 1 && g.sw == 1 && g.ph == 0 && g.pw == 0;
  g.block = std::clamp<int64_t>((kTargetColumns + g.P - 1) / g.P, 1, std::max<int64_t>(g.N, 1));
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
  static constexpr size_t kMaxPooled = 16;
  static std::mutex& mutex() {
    static std::mutex m;
    return m;
  }
  static std::vector<Buffer>& pool() {
    static std::vector<Buffer> p;
    return p;
  }
  // The smallest pooled buffer that fits, else the largest one grown, else a new one.
  static Buffer take(size_t n) {
    std::lock_guard<std::mutex> lock(mutex());
    auto& p = pool();
    auto best = p.end();
    for (auto it = p.begin(); it != p.end(); ++it)
      if ((*it)->size() >= n && (best == p.end() || (*it)->size() < (*best)->size())) best = it;
    if (best == p.end() && !p.empty())
      best = std::max_element(p.begin(), p.end(), [](const Buffer& a, const Buffer& b) { return a->size() < b->size(); });
    Buffer out = best != p.end() ? std::move(*best) : std::make_unique<std::vector<float>>();
    if (best != p.end()) p.erase(best);
    if (out->size() < n) out->resize(n);
    return out;
  }
  static void give(Buffer b) {
    std::lock_guard<std::mutex> lock(mutex());
    auto& p = pool();
    p.push_back(std::move(b));
    if (p.size() > kMaxPooled)  // drop the smallest
      p.erase(std::min_element(p.begin(), p.end(), [](const Buffer& a, const Buffer& b) { return a->size() < b->size(); }));
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

// `nb` images of `channels` planes of P values (image-major, as in NCHW) → the matrix
// (channels, nb·P) whose column b·P + p is position p of image b; and back, adding an
// optional per-channel bias. A block's GEMM operands and results take this layout.
void planes_to_matrix(const float* planes, int64_t nb, int64_t channels, int64_t P, float* matrix) {
  const int64_t grain = std::max<int64_t>(1, kCopyGrain / std::max<int64_t>(nb * P, 1));
  parallel_for(channels, grain, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t b = 0; b < nb; ++b)
        std::memcpy(matrix + c * nb * P + b * P, planes + (b * channels + c) * P, sizeof(float) * P);
  });
}
void matrix_to_planes(const float* matrix, int64_t nb, int64_t channels, int64_t P, const float* bias, float* planes) {
  const int64_t grain = std::max<int64_t>(1, kCopyGrain / std::max<int64_t>(nb * P, 1));
  parallel_for(channels, grain, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t b = 0; b < nb; ++b) {
        const float* src = matrix + c * nb * P + b * P;
        float* dst = planes + (b * channels + c) * P;
        if (!bias) std::memcpy(dst, src, sizeof(float) * P);
        else
          for (int64_t p = 0; p < P; ++p) dst[p] = src[p] + bias[c];
      }
  });
}

// The column matrix of `nb` images: row (c, i, j), column b·P + oh·OW + ow holds
// x[b, c, oh·sh − ph + i·dh, ow·sw − pw + j·dw], zero in the padding.
void im2col(const ConvGeometry& g, const float* x, int64_t nb, float* cols) {
  if (g.pointwise) return planes_to_matrix(x, nb, g.C, g.P, cols);
  const int64_t ld = nb * g.P;
  const int64_t grain = std::max<int64_t>(1, kCopyGrain / std::max<int64_t>(ld, 1));
  parallel_for(g.rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t c = r / (g.KH * g.KW), i = (r / g.KW) % g.KH, j = r % g.KW;
      const int64_t h_off = i * g.dh - g.ph, w_off = j * g.dw - g.pw;
      const Range rh = valid_outputs(g.OH, g.sh, h_off, g.H), rw = valid_outputs(g.OW, g.sw, w_off, g.W);
      for (int64_t b = 0; b < nb; ++b) {
        const float* plane = x + (b * g.C + c) * g.H * g.W;
        float* dst = cols + r * ld + b * g.P;
        std::fill(dst, dst + rh.lo * g.OW, 0.0f);
        std::fill(dst + rh.hi * g.OW, dst + g.P, 0.0f);
        for (int64_t oh = rh.lo; oh < rh.hi; ++oh) {
          float* d = dst + oh * g.OW;
          const float* src = plane + (oh * g.sh + h_off) * g.W + w_off;  // src[ow·sw] is input column ow
          std::fill(d, d + rw.lo, 0.0f);
          std::fill(d + rw.hi, d + g.OW, 0.0f);
          if (g.sw == 1) std::memcpy(d + rw.lo, src + rw.lo, sizeof(float) * (rw.hi - rw.lo));
          else
            for (int64_t ow = rw.lo; ow < rw.hi; ++ow) d[ow] = src[ow * g.sw];
        }
      }
    }
  });
}

// The adjoint of im2col: every column-matrix entry is added back onto the input position
// it was copied from. Parallel over channels, each plane summed in a fixed order.
void col2im(const ConvGeometry& g, const float* cols, int64_t nb, float* dx) {
  if (g.pointwise) return matrix_to_planes(cols, nb, g.C, g.P, nullptr, dx);
  const int64_t ld = nb * g.P;
  const int64_t grain = std::max<int64_t>(1, kCopyGrain / std::max<int64_t>(ld * g.KH * g.KW, 1));
  parallel_for(g.C, grain, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c)
      for (int64_t b = 0; b < nb; ++b) {
        float* plane = dx + (b * g.C + c) * g.H * g.W;
        std::fill(plane, plane + g.H * g.W, 0.0f);
        for (int64_t i = 0; i < g.KH; ++i)
          for (int64_t j = 0; j < g.KW; ++j) {
            const int64_t r = (c * g.KH + i) * g.KW + j;
            const int64_t h_off = i * g.dh - g.ph, w_off = j * g.dw - g.pw;
            const Range rh = valid_outputs(g.OH, g.sh, h_off, g.H), rw = valid_outputs(g.OW, g.sw, w_off, g.W);
            for (int64_t oh = rh.lo; oh < rh.hi; ++oh) {
              const float* src = cols + r * ld + b * g.P + oh * g.OW;
              float* d = plane + (oh * g.sh + h_off) * g.W + w_off;
              if (g.sw == 1)  // contiguous: the compiler vectorises this form
                for (int64_t ow = rw.lo; ow < rw.hi; ++ow) d[ow] += src[ow];
              else
                for (int64_t ow = rw.lo; ow < rw.hi; ++ow) d[ow * g.sw] += src[ow];
            }
          }
      }
  });
}

// y = conv(x, w) + bias, one GEMM per image block and group, blocks in parallel.
void conv_forward(const ConvGeometry& g, const float* x, const float* w, const float* bias, float* y) {
  parallel_for(g.blocks(), 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t n0 = k * g.block, nb = g.images_in(k), ncols = nb * g.P;
      const float* x_block = x + n0 * g.C * g.H * g.W;
      float* y_block = y + n0 * g.O * g.P;
      const bool one = nb == 1;  // one image: its planes are already the GEMM's layout
      Scratch cols_buffer(one && g.pointwise ? 0 : g.rows * ncols);
      const float* cols = x_block;
      if (!(one && g.pointwise)) {
        im2col(g, x_block, nb, cols_buffer.data());
        cols = cols_buffer.data();
      }
      Scratch staging(one ? 0 : g.O * ncols);
      float* product = one ? y_block : staging.data();
      for (int64_t gi = 0; gi < g.groups; ++gi)
        gemm(false, false, g.Og, ncols, g.rows_g, 1.0f, w + gi * g.Og * g.rows_g, g.rows_g,
             cols + gi * g.rows_g * ncols, ncols, 0.0f, product + gi * g.Og * ncols, ncols);
      if (!one) matrix_to_planes(product, nb, g.O, g.P, bias, y_block);
      else if (bias)
        for (int64_t o = 0; o < g.O; ++o)
          for (int64_t p = 0; p < g.P; ++p) y_block[o * g.P + p] += bias[o];
    }
  });
}

// dx = col2im(Wᵀ·dY) and dw = Σ_blocks dY·colsᵀ (either may be null: not wanted).
void conv_backward(const ConvGeometry& g, const float* x, const float* w, const float* dy, float* dx, float* dw) {
  const int64_t blocks = g.blocks();
  if (blocks == 0) {  // an empty batch: the weight gradient is zero
    if (dw) std::fill(dw, dw + g.O * g.rows_g, 0.0f);
    return;
  }
  const int64_t chunk = (blocks + kMaxPartials - 1) / kMaxPartials;  // blocks per partial sum
  const int64_t chunks = (blocks + chunk - 1) / chunk;
  const int64_t weight_size = g.O * g.rows_g;
  std::vector<float> partials(dw && chunks > 1 ? static_cast<size_t>(chunks * weight_size) : 0);

  parallel_for(blocks, chunk, [&](int64_t k0, int64_t k1) {
    float* dw_chunk = chunks > 1 ? partials.data() + (k0 / chunk) * weight_size : dw;
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t n0 = k * g.block, nb = g.images_in(k), ncols = nb * g.P;
      const bool one = nb == 1;
      const bool direct = one && g.pointwise;  // input and its gradient serve as column matrices
      Scratch dy_buffer(one ? 0 : g.O * ncols);
      const float* dy_block = dy + n0 * g.O * g.P;
      if (!one) {
        planes_to_matrix(dy_block, nb, g.O, g.P, dy_buffer.data());
        dy_block = dy_buffer.data();
      }
      Scratch cols_buffer(direct ? 0 : g.rows * ncols);  // the columns, then their gradient
      if (dw) {
        const float* cols = x + n0 * g.C * g.H * g.W;
        if (!direct) {
          im2col(g, cols, nb, cols_buffer.data());
          cols = cols_buffer.data();
        }
        const float beta = k == k0 ? 0.0f : 1.0f;
        for (int64_t gi = 0; gi < g.groups; ++gi)
          gemm(false, true, g.Og, g.rows_g, ncols, 1.0f, dy_block + gi * g.Og * ncols, ncols,
               cols + gi * g.rows_g * ncols, ncols, beta, dw_chunk + gi * g.Og * g.rows_g, g.rows_g);
      }
      if (dx) {
        float* dx_block = dx + n0 * g.C * g.H * g.W;
        float* dcols = direct ? dx_block : cols_buffer.data();
        for (int64_t gi = 0; gi < g.groups; ++gi)
          gemm(true, false, g.rows_g, ncols, g.Og, 1.0f, w + gi * g.Og * g.rows_g, g.rows_g,
               dy_block + gi * g.Og * ncols, ncols, 0.0f, dcols + gi * g.rows_g * ncols, ncols);
        if (!direct) col2im(g, dcols, nb, dx_block);
      }
    }
  });

  if (dw && chunks > 1)  // the partial sums in chunk order
    parallel_for(weight_size, 1 << 14, [&](int64_t e0, int64_t e1) {
      for (int64_t e = e0; e < e1; ++e) {
        float s = partials[e];
        for (int64_t c = 1; c < chunks; ++c) s += partials[c * weight_size + e];
        dw[e] = s;
      }
    });
}

// The sum of n floats: 16 running float sums (a form the compiler vectorises), combined
// in double. A fixed order, so the same bits at any thread count.
double sum(const float* v, int64_t n) {
  float lanes[16] = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int j = 0; j < 16; ++j) lanes[j] += v[i + j];
  double s = 0;
  for (int j = 0; j < 16; ++j) s += lanes[j];
  for (; i < n; ++i) s += v[i];
  return s;
}

// db[o] = Σ_n Σ_p dy[n, o, p]: per plane in float, across planes in double.
void bias_grad(const ConvGeometry& g, const float* dy, float* db) {
  parallel_for(g.O, 16, [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      double s = 0;
      for (int64_t n = 0; n < g.N; ++n) s += sum(dy + (n * g.O + o) * g.P, g.P);
      db[o] = static_cast<float>(s);
    }
  });
}

// Convolution is affine in x (and linear in w): one rule serves every transport.
class Conv2dNode : public Node {
 public:
  Conv2dNode(const ConvGeometry& g, Tensor x, Tensor w) : g_(g), x_(std::move(x)), w_(std::move(w)) {}
  std::string name() const override { return "conv2d"; }

  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override {
    Tensor dx, dw, db;
    if (needs[0]) dx = Tensor::empty(x_.shape());
    if (needs[1]) dw = Tensor::empty(w_.shape());
    if (dx.defined() || dw.defined())
      conv_backward(g_, x_.data(), w_.data(), u.data(), dx.defined() ? dx.data() : nullptr,
                    dw.defined() ? dw.data() : nullptr);
    if (needs.size() > 2 && needs[2]) {
      db = Tensor::empty({g_.O});
      bias_grad(g_, u.data(), db.data());
    }
    return {dx, dw, db};
  }

 private:
  ConvGeometry g_;
  Tensor x_, w_;
};

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Conv2dOptions& options) {
  const ConvGeometry g = make_geometry(x_in, weight_in, bias_in, options);
  Tensor x = x_in.contiguous(), w = weight_in.contiguous();
  Tensor bias = bias_in.defined() ? bias_in.contiguous() : Tensor();
  Tensor out = Tensor::empty({g.N, g.O, g.OH, g.OW});
  if (g.N > 0) conv_forward(g, x.data(), w.data(), bias.defined() ? bias.data() : nullptr, out.data());
  if (needs_grad({x, w, bias})) attach(out, std::make_shared<Conv2dNode>(g, x.detach(), w.detach()), {x, w, bias});
  return out;
}

}  // namespace adjoint
