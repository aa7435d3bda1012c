// 2-D pooling (ops/pool.h). Average pooling is linear: one rule for every transport.
// Max-pooling routes each output's cotangent through a hard choice, the window's arg-max;
// the pullback keeps that choice (it is the gate of the input-conditioned linear map), and
// the soft pullback replaces it with fixed weights softmax(window/τ) (docs/methods.md §1.2).
#include <cmath>

#include "ops/reference/reference.h"

namespace adjoint::reference {

namespace {

// The inputs one output's window covers, clipped to the input (padding reads nothing).
struct Window {
  int64_t h0, h1, w0, w1;
};
Window window(const PoolShape& s, int64_t oh, int64_t ow) {
  const int64_t h = oh * s.sh - s.ph, w = ow * s.sw - s.pw;
  return {std::max<int64_t>(h, 0), std::min(h + s.kh, s.H), std::max<int64_t>(w, 0), std::min(w + s.kw, s.W)};
}

// Calls visit(plane offset, output index, window) for every output.
template <class Visit>
void for_each_output(const PoolShape& s, Visit visit) {
  const int64_t OH = s.OH(), OW = s.OW();
  for (int64_t plane = 0; plane < s.N * s.C; ++plane)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow)
        visit(plane * s.H * s.W, (plane * OH + oh) * OW + ow, window(s, oh, ow));
}

// The flat index (in the plane) of the window's first maximal input, row-major.
int64_t argmax(const Values& x, int64_t base, const PoolShape& s, const Window& win) {
  int64_t best = win.h0 * s.W + win.w0;
  for (int64_t h = win.h0; h < win.h1; ++h)
    for (int64_t w = win.w0; w < win.w1; ++w)
      if (x[base + h * s.W + w] > x[base + best]) best = h * s.W + w;
  return best;
}

}  // namespace

// y = max over the window.
Values max_pool2d_forward(const Values& x, const PoolShape& s) {
  Values y(s.N * s.C * s.OH() * s.OW());
  for_each_output(s, [&](int64_t base, int64_t out, const Window& win) { y[out] = x[base + argmax(x, base, s, win)]; });
  return y;
}

// Hard routing to the arg-max, or (soft pullback) u·softmax(window/τ) over the window
// (docs/methods.md §1.2).
Values max_pool2d_backward(const Values& u, const Values& x, const PoolShape& s, const Transport& t) {
  Values dx(x.size(), 0.0);
  for_each_output(s, [&](int64_t base, int64_t out, const Window& win) {
    const int64_t top = argmax(x, base, s, win);
    if (!t.is_soft()) {
      dx[base + top] += u[out];
      return;
    }
    const double tau = t.tau.max_pool;
    double total = 0;  // Σ exp((x − max)/τ) over the window
    for (int64_t h = win.h0; h < win.h1; ++h)
      for (int64_t w = win.w0; w < win.w1; ++w) total += std::exp((x[base + h * s.W + w] - x[base + top]) / tau);
    for (int64_t h = win.h0; h < win.h1; ++h)
      for (int64_t w = win.w0; w < win.w1; ++w)
        dx[base + h * s.W + w] += u[out] * std::exp((x[base + h * s.W + w] - x[base + top]) / tau) / total;
  });
  return dx;
}

// y = (Σ window) / (kh·kw): padding counts as zeros in the divisor (count_include_pad).
Values avg_pool2d_forward(const Values& x, const PoolShape& s) {
  Values y(s.N * s.C * s.OH() * s.OW(), 0.0);
  for_each_output(s, [&](int64_t base, int64_t out, const Window& win) {
    for (int64_t h = win.h0; h < win.h1; ++h)
      for (int64_t w = win.w0; w < win.w1; ++w) y[out] += x[base + h * s.W + w];
    y[out] /= double(s.kh * s.kw);
  });
  return y;
}

// u/(kh·kw) to every input of the window (docs/methods.md §1.2: linear, one rule for every transport).
Values avg_pool2d_backward(const Values& u, const PoolShape& s) {
  Values dx(s.N * s.C * s.H * s.W, 0.0);
  for_each_output(s, [&](int64_t base, int64_t out, const Window& win) {
    for (int64_t h = win.h0; h < win.h1; ++h)
      for (int64_t w = win.w0; w < win.w1; ++w) dx[base + h * s.W + w] += u[out] / double(s.kh * s.kw);
  });
  return dx;
}

// Output (oh, ow) of an adaptive pooling to OH × OW averages rows [⌊oh·H/OH⌋, ⌈(oh+1)·H/OH⌉)
// and the columns likewise.
Values adaptive_avg_pool2d_forward(const Values& x, int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH,
                                   int64_t OW) {
  Values y(N * C * OH * OW, 0.0);
  for (int64_t plane = 0; plane < N * C; ++plane)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t h0 = oh * H / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
        const int64_t w0 = ow * W / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
        double& out = y[(plane * OH + oh) * OW + ow];
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w) out += x[(plane * H + h) * W + w] / double((h1 - h0) * (w1 - w0));
      }
  return y;
}

// u/(window area) to every input of the window (docs/methods.md §1.2: linear, one rule for
// every transport).
Values adaptive_avg_pool2d_backward(const Values& u, int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH,
                                    int64_t OW) {
  Values dx(N * C * H * W, 0.0);
  for (int64_t plane = 0; plane < N * C; ++plane)
    for (int64_t oh = 0; oh < OH; ++oh)
      for (int64_t ow = 0; ow < OW; ++ow) {
        const int64_t h0 = oh * H / OH, h1 = ((oh + 1) * H + OH - 1) / OH;
        const int64_t w0 = ow * W / OW, w1 = ((ow + 1) * W + OW - 1) / OW;
        for (int64_t h = h0; h < h1; ++h)
          for (int64_t w = w0; w < w1; ++w)
            dx[(plane * H + h) * W + w] += u[(plane * OH + oh) * OW + ow] / double((h1 - h0) * (w1 - w0));
      }
  return dx;
}

}  // namespace adjoint::reference
