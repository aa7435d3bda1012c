#include "ops/conv/geometry.h"

#include <mutex>

#include "engine/error.h"

namespace adjoint::conv {

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

namespace {

// What the pool may keep between calls.
constexpr size_t kMaxPooled = 16;
constexpr size_t kMaxPooledFloats = size_t(32) << 20;  // 128 MiB

std::mutex& pool_mutex() {
  static std::mutex m;
  return m;
}
std::vector<std::unique_ptr<std::vector<float>>>& pool() {
  static std::vector<std::unique_ptr<std::vector<float>>> p;
  return p;
}
bool smaller(const std::unique_ptr<std::vector<float>>& a, const std::unique_ptr<std::vector<float>>& b) {
  return a->size() < b->size();
}

}  // namespace

Scratch::Buffer Scratch::take(size_t n) {
  std::lock_guard<std::mutex> lock(pool_mutex());
  auto& p = pool();
  auto best = p.end();
  for (auto it = p.begin(); it != p.end(); ++it)
    if ((*it)->size() >= n && (best == p.end() || (*it)->size() < (*best)->size())) best = it;
  if (best == p.end()) return std::make_unique<std::vector<float>>(n);
  Buffer out = std::move(*best);
  p.erase(best);
  return out;
}

void Scratch::give(Buffer b) {
  std::lock_guard<std::mutex> lock(pool_mutex());
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

}  // namespace adjoint::conv
