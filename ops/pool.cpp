#include "ops/pool.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <type_traits>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/fast_exp.h"
#include "engine/threads.h"
#include "engine/vectorize.h"

namespace adjoint {

namespace {

// The input rectangle [h0, h1) × [w0, w1) one output reads, clipped to the input.
struct Window {
  int64_t h0, h1, w0, w1;
};

// Where every output of a pooling reads. Fixed windows (kernel, stride, padding) or, when
// `adaptive`, PyTorch's adaptive windows of varying size.
struct PoolGeometry {
  int64_t N = 0, C = 0, H = 0, W = 0, OH = 0, OW = 0;
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, ph = 0, pw = 0;
  bool adaptive = false;

  int64_t planes() const { return N * C; }
  Window window(int64_t oh, int64_t ow) const {
    if (adaptive) return {oh * H / OH, ((oh + 1) * H + OH - 1) / OH, ow * W / OW, ((ow + 1) * W + OW - 1) / OW};
    const int64_t h0 = oh * sh - ph, w0 = ow * sw - pw;
    return {std::max<int64_t>(h0, 0), std::min(h0 + kh, H), std::max<int64_t>(w0, 0), std::min(w0 + kw, W)};
  }
  // Average pooling's divisor: the whole kernel, padding included (count_include_pad), or
  // the adaptive window's area.
  float divisor(const Window& win) const {
    return adaptive ? static_cast<float>((win.h1 - win.h0) * (win.w1 - win.w0)) : static_cast<float>(kh * kw);
  }
  // The most entries a window holds (adaptive windows span at most ⌈H/OH⌉ + 1 rows).
  int64_t max_window_area() const {
    if (!adaptive) return kh * kw;
    return ((H + OH - 1) / OH + 1) * ((W + OW - 1) / OW + 1);
  }
  // The outputs ow of a row whose kernel tap j lies inside the input row, 0 ≤ ow·sw − pw + j
  // < W, as [lo, hi) (fixed windows).
  std::pair<int64_t, int64_t> outputs_inside(int64_t j) const {
    const int64_t last = W - 1 + pw - j;  // ow·sw ≤ last
    const int64_t lo = std::max<int64_t>(0, (pw - j + sw - 1) / sw);
    const int64_t hi = last < 0 ? 0 : std::min<int64_t>(OW, last / sw + 1);
    return {std::min(lo, hi), hi};
  }
  // Planes per task: about 16K window reads each.
  int64_t grain() const {
    const int64_t per_plane = std::max<int64_t>(1, OH * OW * (adaptive ? (H / OH + 1) * (W / OW + 1) : kh * kw));
    return std::max<int64_t>(1, (1 << 14) / per_plane);
  }
};

PoolGeometry fixed_geometry(const char* op, const Tensor& x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph,
                            int64_t pw) {
  check(x.defined(), op, ": undefined input");
  check(x.dim() == 4, op, ": input must be (N, C, H, W), got ", x.shape());
  check(kh >= 1 && kw >= 1 && sh >= 1 && sw >= 1 && ph >= 0 && pw >= 0, op, ": invalid kernel ", kh, "x", kw,
        ", stride ", sh, "x", sw, ", padding ", ph, "x", pw, " for input ", x.shape());
  check(2 * ph <= kh && 2 * pw <= kw, op, ": padding ", ph, "x", pw, " must be at most half the kernel ", kh, "x", kw);
  PoolGeometry g;
  g.N = x.size(0), g.C = x.size(1), g.H = x.size(2), g.W = x.size(3);
  g.kh = kh, g.kw = kw, g.sh = sh, g.sw = sw, g.ph = ph, g.pw = pw;
  check(g.H + 2 * ph >= kh && g.W + 2 * pw >= kw, op, ": kernel ", kh, "x", kw, " does not fit input ", x.shape(),
        " padded by ", ph, "x", pw);
  g.OH = (g.H + 2 * ph - kh) / sh + 1;
  g.OW = (g.W + 2 * pw - kw) / sw + 1;
  return g;
}

// One output row of a 2×2 stride-2 max-pool: out[j] is the maximum of rows[2j], rows[2j+1],
// rows[W+2j], rows[W+2j+1] (input offsets from `first`), the first strict maximum in
// row-major order, NaN winning, as the general loop and PyTorch choose. With kArgmax the
// place of each maximum goes to argmax too (for the backward pass; inference skips it).
template <bool kArgmax>
void max_of_pairs(const float* __restrict rows, int64_t W, int64_t OW, int32_t first, float* __restrict out,
                  int32_t* __restrict argmax) {
  const float* below = rows + W;
  for (int64_t j = 0; j < OW; ++j) {
    float best = rows[2 * j];
    int32_t at = first + static_cast<int32_t>(2 * j);
    const float candidates[3] = {rows[2 * j + 1], below[2 * j], below[2 * j + 1]};
    const int32_t offsets[3] = {1, static_cast<int32_t>(W), static_cast<int32_t>(W + 1)};
    for (int k = 0; k < 3; ++k) {
      const float v = candidates[k];
      const bool take = v > best || v != v;
      best = take ? v : best;
      at = take ? first + static_cast<int32_t>(2 * j) + offsets[k] : at;
    }
    out[j] = best;
    if constexpr (kArgmax) argmax[j] = at;
  }
}

// One output row oh of any fixed-window max-pool, kernel tap by kernel tap in the window's
// row-major order, each tap a pass along the row (which vectorises): per output the same
// comparisons in the same order as a window at a time (the first strict maximum, NaN
// winning, padding never), so the same values and arg-maxes (kArgmax: as max_of_pairs).
template <bool kArgmax>
void max_of_taps(const PoolGeometry& g, const float* __restrict plane, int64_t oh, float* __restrict out,
                 int32_t* __restrict argmax) {
  const int64_t top = oh * g.sh - g.ph;
  const int64_t h0 = std::max<int64_t>(top, 0), h1 = std::min(top + g.kh, g.H);
  for (int64_t ow = 0; ow < g.OW; ++ow) {
    out[ow] = -std::numeric_limits<float>::infinity();
    if constexpr (kArgmax) argmax[ow] = static_cast<int32_t>(h0 * g.W + std::max<int64_t>(ow * g.sw - g.pw, 0));
  }
  for (int64_t h = h0; h < h1; ++h)
    for (int64_t j = 0; j < g.kw; ++j) {
      const auto [lo, hi] = g.outputs_inside(j);
      const int64_t offset = h * g.W - g.pw + j;  // input index of tap j of output ow: offset + ow·sw
      const float* row = plane + offset;
      for (int64_t ow = lo; ow < hi; ++ow) {
        const float v = row[ow * g.sw];
        const bool take = v > out[ow] || v != v;
        out[ow] = take ? v : out[ow];
        if constexpr (kArgmax) argmax[ow] = take ? static_cast<int32_t>(offset + ow * g.sw) : argmax[ow];
      }
    }
}

// Under Gradient and Pullback the cotangent goes to the saved arg-max; under SoftPullback
// it is spread with softmax(window/τ) weights computed from the saved input.
class MaxPoolNode : public Node {
 public:
  MaxPoolNode(const PoolGeometry& g, Tensor x, std::vector<int32_t> argmax)
      : g_(g), x_(std::move(x)), argmax_(std::move(argmax)) {}
  std::string name() const override { return "max_pool2d"; }

  std::vector<Tensor> vjp(const Tensor& u, const Transport& t) override {
    if (!needs[0]) return {Tensor()};
    Tensor dx = Tensor::zeros(x_.shape());
    const int64_t in_plane = g_.H * g_.W, out_plane = g_.OH * g_.OW;
    const float* du = u.data();
    float* d = dx.data();
    if (!t.is_soft()) {
      parallel_for(g_.planes(), g_.grain(), [&](int64_t q0, int64_t q1) {
        for (int64_t q = q0; q < q1; ++q)
          for (int64_t o = 0; o < out_plane; ++o) d[q * in_plane + argmax_[q * out_plane + o]] += du[q * out_plane + o];
      });
      return {dx};
    }
    const float tau = t.tau.max_pool;
    check(tau > 0, "max_pool2d: soft pullback temperature must be positive, got ", tau);
    const float* x = x_.data();
    parallel_for(g_.planes(), g_.grain(), [&](int64_t q0, int64_t q1) {
      run_widest([&] {  // the exp is compute-bound: wider vectors pay
        if (tiles_exactly()) return spread_tiled(x, q0, q1, du, tau, d);
        for (int64_t q = q0; q < q1; ++q) spread(x + q * in_plane, q, du, tau, d + q * in_plane);
      });
    });
    return {dx};
  }

 private:
  void release() override {
    x_ = Tensor();
    argmax_ = {};
  }

  // Soft pullback of plane q (max-pool windows are fixed, never adaptive): each output's
  // cotangent spread over its window with weights softmax(window/τ), shifted by the window's
  // maximum for range (top). Per row of outputs, kernel tap by kernel tap, each a pass along
  // the row (tap (i, j) of output ow reads input (oh·sh − ph + i, ow·sw − pw + j) when
  // inside). These loops vectorise, where a window at a time with a libm exp would not. A
  // window's weights are summed in row-major order.
  void spread(const float* xp, int64_t q, const float* du, float tau, float* dp) const {
    const int64_t OW = g_.OW, W = g_.W, out_plane = g_.OH * OW;
    std::vector<float> weights(static_cast<size_t>(g_.kh * g_.kw * OW)), top(static_cast<size_t>(OW)),
        total(static_cast<size_t>(OW));
    for (int64_t oh = 0; oh < g_.OH; ++oh) {
      const int32_t* at = argmax_.data() + q * out_plane + oh * OW;
      for (int64_t ow = 0; ow < OW; ++ow) top[ow] = xp[at[ow]], total[ow] = 0.0f;
      for (int64_t i = 0; i < g_.kh; ++i) {
        const int64_t h = oh * g_.sh - g_.ph + i;
        if (h < 0 || h >= g_.H) continue;
        for (int64_t j = 0; j < g_.kw; ++j) {
          const auto [lo, hi] = g_.outputs_inside(j);
          const float* row = xp + h * W - g_.pw + j;
          float* e = weights.data() + (i * g_.kw + j) * OW;
          for (int64_t ow = lo; ow < hi; ++ow) {
            e[ow] = fast_exp((row[ow * g_.sw] - top[ow]) / tau);
            total[ow] += e[ow];
          }
        }
      }
      const float* u = du + q * out_plane + oh * OW;
      for (int64_t ow = 0; ow < OW; ++ow) total[ow] = u[ow] / total[ow];  // now the scale
      for (int64_t i = 0; i < g_.kh; ++i) {
        const int64_t h = oh * g_.sh - g_.ph + i;
        if (h < 0 || h >= g_.H) continue;
        for (int64_t j = 0; j < g_.kw; ++j) {
          const auto [lo, hi] = g_.outputs_inside(j);
          float* row = dp + h * W - g_.pw + j;
          const float* e = weights.data() + (i * g_.kw + j) * OW;
          for (int64_t ow = lo; ow < hi; ++ow) row[ow * g_.sw] += e[ow] * total[ow];
        }
      }
    }
  }

  // Whether the windows tile the input exactly (kernel = stride, no padding, and the
  // windows cover every row and column: VGG's and ResNet's 2×2 pools on even maps). Every
  // input then lies in exactly one window, and spread_tiled applies.
  bool tiles_exactly() const {
    return g_.kh == g_.sh && g_.kw == g_.sw && g_.ph == 0 && g_.pw == 0 && g_.OH * g_.kh == g_.H &&
           g_.OW * g_.kw == g_.W;
  }

  // spread for exactly tiling windows, over planes q0 .. q1 at once, the same operations in
  // the same order. Every input lies in exactly one window, so the windows' taps are first
  // copied apart (tap t of window k to e[t·windows + k], k over all windows of the planes); the
  // exp, the window sums and the scales are then plain loops over every window at once,
  // which vectorise whatever the map's width, and the products go back tap by tap (row by
  // row, 8- and 4-wide maps would make loops of a few elements; docs/benchmarks.md).
  void spread_tiled(const float* x, int64_t q0, int64_t q1, const float* du, float tau, float* d) const {
    const int64_t OW = g_.OW, W = g_.W, kh = g_.kh, kw = g_.kw, taps = kh * kw;
    const int64_t out_plane = g_.OH * OW, in_plane = g_.H * W;
    const int64_t window_rows = (q1 - q0) * g_.OH, windows = window_rows * OW;  // of the planes
    const int64_t first = q0 * out_plane;  // the planes' first output
    const float* xs = x + q0 * in_plane;
    float* ds = d + q0 * in_plane;
    // Calls body(t, k, c) for tap t of window k, input c (from xs), every window in order;
    // VGG's and ResNet's 2-wide windows with the width a constant, so that the loop along a
    // row reads and writes whole vectors (and de-interleaves them).
    const auto each_tap = [&](auto&& body) {
      const auto rows = [&](auto width) {
        for (int64_t p = 0; p < window_rows; ++p)
          for (int64_t i = 0; i < kh; ++i) {
            const int64_t row = (p * kh + i) * W;
            for (int64_t ow = 0; ow < OW; ++ow)
              for (int64_t j = 0; j < width; ++j) body(i * width + j, p * OW + ow, row + ow * width + j);
          }
      };
      if (kw == 2)
        rows(std::integral_constant<int64_t, 2>{});
      else
        rows(kw);
    };
    // scale first holds each window's sum, so it starts at zero.
    std::vector<float> e(static_cast<size_t>(taps * windows)), top(static_cast<size_t>(windows)),
        scale(static_cast<size_t>(windows), 0.0f);
    each_tap([&](int64_t t, int64_t k, int64_t c) { e[t * windows + k] = xs[c]; });
    // Each window's maximum, where the forward pass found it (plane q's flat index).
    for (int64_t q = 0; q < q1 - q0; ++q) {
      const int32_t* at = argmax_.data() + first + q * out_plane;
      const float* plane = xs + q * in_plane;
      float* plane_top = top.data() + q * out_plane;
      for (int64_t o = 0; o < out_plane; ++o) plane_top[o] = plane[at[o]];
    }
    for (int64_t t = 0; t < taps; ++t) {
      float* et = e.data() + t * windows;
      for (int64_t k = 0; k < windows; ++k) et[k] = fast_exp((et[k] - top[k]) / tau);
    }
    for (int64_t t = 0; t < taps; ++t)  // each window's sum, in row-major order
      for (int64_t k = 0; k < windows; ++k) scale[k] += e[t * windows + k];
    const float* u = du + first;
    for (int64_t k = 0; k < windows; ++k) scale[k] = u[k] / scale[k];
    for (int64_t t = 0; t < taps; ++t)
      for (int64_t k = 0; k < windows; ++k) e[t * windows + k] *= scale[k];
    each_tap([&](int64_t t, int64_t k, int64_t c) { ds[c] += e[t * windows + k]; });
  }

  PoolGeometry g_;
  Tensor x_;
  std::vector<int32_t> argmax_;  // per output, the flat index h·W + w of its maximum in the plane
};

// Averaging is linear: every transport spreads u/divisor over the window.
class AvgPoolNode : public Node {
 public:
  AvgPoolNode(const PoolGeometry& g, std::string name) : g_(g), name_(std::move(name)) {}
  std::string name() const override { return name_; }

  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override {
    if (!needs[0]) return {Tensor()};
    Tensor dx = Tensor::zeros({g_.N, g_.C, g_.H, g_.W});
    const float* du = u.data();
    float* d = dx.data();
    parallel_for(g_.planes(), g_.grain(), [&](int64_t q0, int64_t q1) {
      for (int64_t q = q0; q < q1; ++q) {
        float* dp = d + q * g_.H * g_.W;
        for (int64_t oh = 0; oh < g_.OH; ++oh)
          for (int64_t ow = 0; ow < g_.OW; ++ow) {
            const Window win = g_.window(oh, ow);
            const float share = du[(q * g_.OH + oh) * g_.OW + ow] / g_.divisor(win);
            for (int64_t h = win.h0; h < win.h1; ++h)
              for (int64_t w = win.w0; w < win.w1; ++w) dp[h * g_.W + w] += share;
          }
      }
    });
    return {dx};
  }

 private:
  PoolGeometry g_;
  std::string name_;
};

// The mean of every window (fixed or adaptive).
Tensor average(const char* op, const Tensor& x_in, const PoolGeometry& g) {
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty({g.N, g.C, g.OH, g.OW});
  const float* xs = x.data();
  float* y = out.data();
  parallel_for(g.planes(), g.grain(), [&](int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const float* xp = xs + q * g.H * g.W;
      for (int64_t oh = 0; oh < g.OH; ++oh)
        for (int64_t ow = 0; ow < g.OW; ++ow) {
          const Window win = g.window(oh, ow);
          float s = 0;
          for (int64_t h = win.h0; h < win.h1; ++h)
            for (int64_t w = win.w0; w < win.w1; ++w) s += xp[h * g.W + w];
          y[(q * g.OH + oh) * g.OW + ow] = s / g.divisor(win);
        }
    }
  });
  if (needs_grad({x})) attach(out, std::make_shared<AvgPoolNode>(g, op), {x});
  return out;
}

}  // namespace

Tensor max_pool2d(const Tensor& x_in, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  const PoolGeometry g = fixed_geometry("max_pool2d", x_in, kh, kw, sh, sw, ph, pw);
  Tensor x = x_in.contiguous();
  Tensor out = Tensor::empty({g.N, g.C, g.OH, g.OW});
  // The arg-maxes only for a backward pass: inference neither fills nor writes them.
  const bool record = needs_grad({x});
  std::vector<int32_t> argmax(record ? static_cast<size_t>(out.numel()) : 0);
  const float* xs = x.data();
  float* y = out.data();
  // The common 2×2 stride-2 window without padding (VGG): the same rule over its four
  // values as selects, which vectorise, where the general loop's branches mispredict.
  const bool two_by_two = g.kh == 2 && g.kw == 2 && g.sh == 2 && g.sw == 2 && g.ph == 0 && g.pw == 0;
  const auto pool_planes = [&]<bool kArgmax>(int64_t q0, int64_t q1) {
    for (int64_t q = q0; q < q1; ++q) {
      const float* xp = xs + q * g.H * g.W;
      int32_t* at = kArgmax ? argmax.data() + q * g.OH * g.OW : nullptr;
      if (two_by_two) {
        for (int64_t oh = 0; oh < g.OH; ++oh)
          max_of_pairs<kArgmax>(xp + 2 * oh * g.W, g.W, g.OW, static_cast<int32_t>(2 * oh * g.W),
                                y + (q * g.OH + oh) * g.OW, kArgmax ? at + oh * g.OW : nullptr);
        continue;
      }
      // As PyTorch: the first strict maximum in row-major order, NaN wins; padding never does.
      for (int64_t oh = 0; oh < g.OH; ++oh)
        max_of_taps<kArgmax>(g, xp, oh, y + (q * g.OH + oh) * g.OW, kArgmax ? at + oh * g.OW : nullptr);
    }
  };
  parallel_for(g.planes(), g.grain(), [&](int64_t q0, int64_t q1) {
    run_widest([&] {  // strided rows: the wider vectors' permutes gather them
      if (record)
        pool_planes.template operator()<true>(q0, q1);
      else
        pool_planes.template operator()<false>(q0, q1);
    });
  });
  if (record) attach(out, std::make_shared<MaxPoolNode>(g, x.detach(), std::move(argmax)), {x});
  return out;
}

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  return max_pool2d(x, kernel, kernel, stride, stride, padding, padding);
}

Tensor avg_pool2d(const Tensor& x, int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw) {
  return average("avg_pool2d", x, fixed_geometry("avg_pool2d", x, kh, kw, sh, sw, ph, pw));
}

Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding) {
  return avg_pool2d(x, kernel, kernel, stride, stride, padding, padding);
}

Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w) {
  check(x.defined(), "adaptive_avg_pool2d: undefined input");
  check(x.dim() == 4, "adaptive_avg_pool2d: input must be (N, C, H, W), got ", x.shape());
  check(out_h >= 1 && out_w >= 1, "adaptive_avg_pool2d: output size must be positive, got ", out_h, "x", out_w,
        " for input ", x.shape());
  check(x.size(2) >= 1 && x.size(3) >= 1, "adaptive_avg_pool2d: empty spatial extent in input ", x.shape());
  PoolGeometry g;
  g.N = x.size(0), g.C = x.size(1), g.H = x.size(2), g.W = x.size(3);
  g.OH = out_h, g.OW = out_w;
  g.adaptive = true;
  return average("adaptive_avg_pool2d", x, g);
}

}  // namespace adjoint
