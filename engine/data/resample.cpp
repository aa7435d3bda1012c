#include "engine/data/resample.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"

namespace adjoint {

double resample_filter(ResampleFilter filter, double x) {
  x = std::fabs(x);
  switch (filter) {
    case ResampleFilter::bilinear:
      return x < 1.0 ? 1.0 - x : 0.0;
    case ResampleFilter::bicubic: {
      constexpr double a = -0.5;
      if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1.0;
      if (x < 2.0) return (((x - 5.0) * x + 8.0) * x - 4.0) * a;
      return 0.0;
    }
  }
  return 0.0;
}

double resample_support(ResampleFilter filter) { return filter == ResampleFilter::bilinear ? 1.0 : 2.0; }

namespace {

// The taps of every output pixel of one axis: output o reads `count[o]` input pixels from
// `first[o]` on, with the fixed-point weights weights[o · width + k].
struct AxisTaps {
  int64_t width = 0;  // the most taps any output has
  std::vector<int64_t> first, count;
  std::vector<int32_t> weights;
};

AxisTaps axis_taps(int64_t in_n, int64_t out_n, ResampleFilter filter) {
  const double scale = double(in_n) / double(out_n);
  const double stretch = std::max(scale, 1.0);
  const double reach = resample_support(filter) * stretch;
  const double shrink = 1.0 / stretch;  // PIL multiplies by the reciprocal: the same last bits
  AxisTaps taps;
  taps.width = int64_t(std::ceil(reach)) * 2 + 1;
  taps.first.resize(size_t(out_n));
  taps.count.resize(size_t(out_n));
  taps.weights.assign(size_t(out_n * taps.width), 0);
  std::vector<double> w(size_t(taps.width));
  for (int64_t o = 0; o < out_n; ++o) {
    const double centre = (double(o) + 0.5) * scale;
    // PIL rounds the footprint's ends by adding ½ and truncating (towards zero).
    const int64_t lo = std::max<int64_t>(0, int64_t(centre - reach + 0.5));
    const int64_t hi = std::min<int64_t>(in_n, int64_t(centre + reach + 0.5));
    double total = 0;
    for (int64_t i = lo; i < hi; ++i) total += w[size_t(i - lo)] = resample_filter(filter, (double(i) - centre + 0.5) * shrink);
    for (int64_t i = lo; i < hi; ++i) {
      const double normalised = total != 0.0 ? w[size_t(i - lo)] / total : w[size_t(i - lo)];
      const double fixed = normalised * double(1 << kPrecisionBits);
      taps.weights[size_t(o * taps.width + i - lo)] = int32_t(fixed < 0 ? fixed - 0.5 : fixed + 0.5);
    }
    taps.first[size_t(o)] = lo;
    taps.count[size_t(o)] = hi - lo;
  }
  return taps;
}

// The fixed-point sum back to a byte: ½ was added before summing, so the shift rounds; an
// arithmetic shift floors negative sums, which clip to 0.
inline uint8_t to_byte(int32_t sum) { return uint8_t(std::clamp(sum >> kPrecisionBits, 0, 255)); }

constexpr int32_t kHalf = int32_t(1) << (kPrecisionBits - 1);

// (rows, in_w, C) → (rows, out_w, C).
void resample_rows(const uint8_t* in, int64_t rows, int64_t in_w, int64_t channels, uint8_t* out, int64_t out_w,
                   const AxisTaps& taps) {
  for (int64_t y = 0; y < rows; ++y) {
    const uint8_t* row = in + y * in_w * channels;
    uint8_t* dst = out + y * out_w * channels;
    for (int64_t o = 0; o < out_w; ++o) {
      const int32_t* w = taps.weights.data() + o * taps.width;
      const uint8_t* src = row + taps.first[size_t(o)] * channels;
      for (int64_t c = 0; c < channels; ++c) {
        int32_t sum = kHalf;
        for (int64_t k = 0; k < taps.count[size_t(o)]; ++k) sum += int32_t(src[k * channels + c]) * w[k];
        dst[o * channels + c] = to_byte(sum);
      }
    }
  }
}

// (in_h, width, C) → (out_h, width, C): each output row is a weighted sum of input rows.
void resample_columns(const uint8_t* in, int64_t width, int64_t channels, uint8_t* out, int64_t out_h,
                      const AxisTaps& taps) {
  const int64_t row_len = width * channels;
  std::vector<int32_t> sums(static_cast<size_t>(row_len));
  for (int64_t o = 0; o < out_h; ++o) {
    std::fill(sums.begin(), sums.end(), kHalf);
    const int32_t* w = taps.weights.data() + o * taps.width;
    for (int64_t k = 0; k < taps.count[size_t(o)]; ++k) {
      const uint8_t* src = in + (taps.first[size_t(o)] + k) * row_len;
      for (int64_t i = 0; i < row_len; ++i) sums[size_t(i)] += int32_t(src[i]) * w[k];
    }
    uint8_t* dst = out + o * row_len;
    for (int64_t i = 0; i < row_len; ++i) dst[i] = to_byte(sums[size_t(i)]);
  }
}

}  // namespace

void resample_uint8(const uint8_t* in, int64_t in_h, int64_t in_w, int64_t channels, uint8_t* out, int64_t out_h,
                    int64_t out_w, ResampleFilter filter) {
  check(in_h > 0 && in_w > 0 && channels > 0 && out_h > 0 && out_w > 0, "resample: bad sizes ", in_h, "x", in_w, "x",
        channels, " -> ", out_h, "x", out_w);
  const bool horizontal = out_w != in_w, vertical = out_h != in_h;
  if (!horizontal && !vertical) {
    std::copy(in, in + in_h * in_w * channels, out);
    return;
  }
  if (!vertical) return resample_rows(in, in_h, in_w, channels, out, out_w, axis_taps(in_w, out_w, filter));
  if (!horizontal) return resample_columns(in, in_w, channels, out, out_h, axis_taps(in_h, out_h, filter));
  std::vector<uint8_t> between(size_t(in_h * out_w * channels));
  resample_rows(in, in_h, in_w, channels, between.data(), out_w, axis_taps(in_w, out_w, filter));
  resample_columns(between.data(), out_w, channels, out, out_h, axis_taps(in_h, out_h, filter));
}

}  // namespace adjoint
