// PIL's 8-bit resize (engine/data/resample.h), written from its definition: every output
// pixel is a sum over every input pixel of its axis, each weight computed afresh.
#include <algorithm>
#include <cmath>

#include "ops/reference/reference.h"

namespace adjoint::reference {

namespace {

// The fixed-point weight of input pixel i in output pixel o of an axis of in_n → out_n.
int64_t weight(int64_t in_n, int64_t out_n, int64_t o, int64_t i, ResampleFilter filter) {
  const double scale = double(in_n) / double(out_n);
  const double stretch = std::max(1.0, scale);
  const double reach = resample_support(filter) * stretch;
  const double centre = (double(o) + 0.5) * scale;
  const int64_t lo = std::max<int64_t>(0, int64_t(centre - reach + 0.5));
  const int64_t hi = std::min<int64_t>(in_n, int64_t(centre + reach + 0.5));
  if (i < lo || i >= hi) return 0;
  const auto raw = [&](int64_t j) { return resample_filter(filter, (double(j) - centre + 0.5) * (1.0 / stretch)); };
  double total = 0;
  for (int64_t j = lo; j < hi; ++j) total += raw(j);
  const double w = (total != 0.0 ? raw(i) / total : raw(i)) * double(int64_t(1) << kPrecisionBits);
  return int64_t(w < 0 ? w - 0.5 : w + 0.5);
}

uint8_t to_byte(int64_t sum) {
  const int64_t v = (sum + (int64_t(1) << (kPrecisionBits - 1))) >> kPrecisionBits;
  return uint8_t(std::clamp<int64_t>(v, 0, 255));
}

}  // namespace

std::vector<uint8_t> resample_uint8(const std::vector<uint8_t>& in, int64_t h, int64_t w, int64_t channels,
                                    int64_t out_h, int64_t out_w, ResampleFilter filter) {
  std::vector<uint8_t> image = in;
  if (out_w != w) {  // rows first, rounded to bytes
    std::vector<uint8_t> next(size_t(h * out_w * channels));
    for (int64_t y = 0; y < h; ++y)
      for (int64_t x = 0; x < out_w; ++x)
        for (int64_t c = 0; c < channels; ++c) {
          int64_t sum = 0;
          for (int64_t i = 0; i < w; ++i) sum += int64_t(image[size_t((y * w + i) * channels + c)]) * weight(w, out_w, x, i, filter);
          next[size_t((y * out_w + x) * channels + c)] = to_byte(sum);
        }
    image = next;
    w = out_w;
  }
  if (out_h != h) {  // then columns
    std::vector<uint8_t> next(size_t(out_h * w * channels));
    for (int64_t y = 0; y < out_h; ++y)
      for (int64_t x = 0; x < w; ++x)
        for (int64_t c = 0; c < channels; ++c) {
          int64_t sum = 0;
          for (int64_t i = 0; i < h; ++i) sum += int64_t(image[size_t((i * w + x) * channels + c)]) * weight(h, out_h, y, i, filter);
          next[size_t((y * w + x) * channels + c)] = to_byte(sum);
        }
    image = next;
  }
  return image;
}

}  // namespace adjoint::reference
