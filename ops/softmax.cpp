// softmax and log_softmax.
//
// A tensor normalised along `axis` splits into lanes: for every index of the axes before
// and after it, the `count` elements along it, `inner` apart in memory (the product of
// the later extents). Lanes are processed in panels of neighbouring lanes, so that the
// innermost loop always runs over contiguous memory: for the common case, the last
// axis (inner = 1), a panel is one row; otherwise it is up to kPanel lanes side by side.
#include "ops/softmax.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <type_traits>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"

namespace adjoint {

namespace {

constexpr int64_t kGrain = 16384;
constexpr int64_t kPanel = 64;  // lanes per panel when the axis is not the last

struct Lanes {
  int64_t outer = 1, count = 1, inner = 1;
};

Lanes lanes_of(const char* who, const Shape& shape, int64_t axis) {
  const int64_t a = normalize_axis(axis, int64_t(shape.size()), who);
  Lanes l;
  for (int64_t i = 0; i < a; ++i) l.outer *= shape[i];
  l.count = shape[a];
  for (size_t i = size_t(a) + 1; i < shape.size(); ++i) l.inner *= shape[i];
  return l;
}

// A compile-time 1: the row case's stride and panel width, so its loops are plain loops.
using One = std::integral_constant<int64_t, 1>;

// body(first, stride, width) for every panel, in parallel: `width` lanes starting at
// element `first`, element c of lane j at first + c·stride + j.
template <class Body>
void for_each_panel(const Lanes& l, Body body) {
  const int64_t per_outer = (l.inner + kPanel - 1) / kPanel;
  const int64_t panel_size = std::max<int64_t>(1, l.count * std::min(l.inner, kPanel));
  parallel_for(l.outer * per_outer, std::max<int64_t>(1, kGrain / panel_size), [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t o = p / per_outer, j0 = (p % per_outer) * kPanel;
      const int64_t first = o * l.count * l.inner + j0;
      if (l.inner == 1)
        body(first, One{}, One{});
      else
        body(first, l.inner, std::min(kPanel, l.inner - j0));
    }
  });
}

// softmax (log = false) or log_softmax (log = true) of one panel of n × w elements.
template <class Stride, class Width>
void forward_panel(const float* x, float* y, int64_t n, Stride s, Width w, bool log) {
  float top[kPanel];
  double total[kPanel];
  for (int64_t j = 0; j < w; ++j) top[j] = -INFINITY, total[j] = 0;
  for (int64_t c = 0; c < n; ++c)
    for (int64_t j = 0; j < w; ++j) top[j] = std::max(top[j], x[c * s + j]);
  if (log) {
    for (int64_t c = 0; c < n; ++c)
      for (int64_t j = 0; j < w; ++j) total[j] += std::exp(x[c * s + j] - top[j]);
    float lse[kPanel];
    for (int64_t j = 0; j < w; ++j) lse[j] = float(std::log(total[j]));
    for (int64_t c = 0; c < n; ++c)
      for (int64_t j = 0; j < w; ++j) y[c * s + j] = (x[c * s + j] - top[j]) - lse[j];
  } else {
    for (int64_t c = 0; c < n; ++c)
      for (int64_t j = 0; j < w; ++j) total[j] += y[c * s + j] = std::exp(x[c * s + j] - top[j]);
    for (int64_t j = 0; j < w; ++j) total[j] = 1.0 / total[j];
    for (int64_t c = 0; c < n; ++c)
      for (int64_t j = 0; j < w; ++j) y[c * s + j] = float(y[c * s + j] * total[j]);
  }
}

// The VJP on one panel from the saved output y:
//   softmax      g = y ⊙ (u − ⟨u, y⟩)
//   log_softmax  g = u − exp(y) · Σu
template <class Stride, class Width>
void vjp_panel(const float* y, const float* u, float* g, int64_t n, Stride s, Width w, bool log) {
  double dot[kPanel];
  float projection[kPanel];
  for (int64_t j = 0; j < w; ++j) dot[j] = 0;
  if (log) {
    for (int64_t c = 0; c < n; ++c)
      for (int64_t j = 0; j < w; ++j) dot[j] += u[c * s + j];
    for (int64_t j = 0; j < w; ++j) projection[j] = float(dot[j]);
    for (int64_t c = 0; c < n; ++c)
      for (int64_t j = 0; j < w; ++j) g[c * s + j] = u[c * s + j] - std::exp(y[c * s + j]) * projection[j];
  } else {
    for (int64_t c = 0; c < n; ++c)
      for (int64_t j = 0; j < w; ++j) dot[j] += double(u[c * s + j]) * y[c * s + j];
    for (int64_t j = 0; j < w; ++j) projection[j] = float(dot[j]);
    for (int64_t c = 0; c < n; ++c)
      for (int64_t j = 0; j < w; ++j) g[c * s + j] = y[c * s + j] * (u[c * s + j] - projection[j]);
  }
}

class SoftmaxNode : public Node {
public:
  SoftmaxNode(bool log, Tensor y, Lanes lanes) : log_(log), y_(std::move(y)), lanes_(lanes) {}
  std::string name() const override { return log_ ? "log_softmax" : "softmax"; }
  std::vector<Tensor> vjp(const Tensor& cotangent, const Transport&) override {
    const Tensor u = cotangent.contiguous();
    Tensor g = Tensor::empty(u.shape());
    const float *py = y_.data(), *pu = u.data();
    float* pg = g.data();
    for_each_panel(lanes_, [&](int64_t first, auto stride, auto width) {
      vjp_panel(py + first, pu + first, pg + first, lanes_.count, stride, width, log_);
    });
    return {g};
  }

  void release() override { y_ = Tensor(); }

private:
  bool log_;
  Tensor y_;  // the forward output (detached)
  Lanes lanes_;
};

Tensor normalise(const char* who, const Tensor& input, int64_t axis, bool log) {
  const Lanes lanes = lanes_of(who, input.shape(), axis);
  const Tensor x = input.contiguous();
  Tensor y = Tensor::empty(x.shape());
  const float* px = x.data();
  float* py = y.data();
  for_each_panel(lanes, [&](int64_t first, auto stride, auto width) {
    forward_panel(px + first, py + first, lanes.count, stride, width, log);
  });
  if (needs_grad({x})) attach(y, std::make_shared<SoftmaxNode>(log, y.detach(), lanes), {x});
  return y;
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t axis) { return normalise("softmax", x, axis, false); }
Tensor log_softmax(const Tensor& x, int64_t axis) { return normalise("log_softmax", x, axis, true); }

}  // namespace adjoint
