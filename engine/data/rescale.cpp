#include "engine/data/rescale.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <vector>

#include "engine/error.h"

namespace adjoint {

RescaleRange parse_rescale_range(const std::string& text, const char* option) {
  const size_t comma = text.find(',');
  RescaleRange r{-1, -1};
  const auto read = [](const std::string& part, double& v) {
    const auto [end, ec] = std::from_chars(part.data(), part.data() + part.size(), v);
    return ec == std::errc() && end == part.data() + part.size();
  };
  const bool numbers = comma != std::string::npos && read(text.substr(0, comma), r.lo) && read(text.substr(comma + 1), r.hi);
  if (!numbers || !(r.lo > 0 && r.lo <= r.hi && r.hi <= 1))
    throw UsageError(cat("option --", option, " expects LO,HI, fractions of the image's side with 0 < LO <= HI <= 1 "
                         "(e.g. 0.5,1), got '", text, "'"));
  return r;
}

std::string to_string(const RescaleRange& range) {
  char text[64];
  char* end = std::to_chars(text, text + 30, range.lo).ptr;
  *end++ = ',';
  end = std::to_chars(end, text + sizeof text, range.hi).ptr;
  return std::string(text, end);
}

RandomRescale::RandomRescale(RescaleRange range) : range_(range) {
  check(range.lo > 0 && range.lo <= range.hi && range.hi <= 1, "random_rescale: the range [", range.lo, ", ",
        range.hi, "] is not within (0, 1] with its low end first");
}

int64_t RandomRescale::min_height(int64_t height) const {
  return std::max<int64_t>(1, std::llround(range_.lo * double(height)));
}
int64_t RandomRescale::max_height(int64_t height) const {
  return std::max(min_height(height), int64_t(std::llround(range_.hi * double(height))));
}

Shape RandomRescale::output_shape(const Shape& in) const {
  check(in.size() == 3 && numel(in) > 0, "random_rescale: expects a (C, H, W) image, got ", in);
  return in;
}

void RandomRescale::apply(const float* in, const Shape& in_shape, float* out, Generator& gen) const {
  const int64_t channels = in_shape[0], height = in_shape[1], width = in_shape[2];
  const int64_t lo = min_height(height);
  const int64_t h = lo + randint(max_height(height) - lo + 1, gen);
  const int64_t w = std::clamp<int64_t>(std::llround(double(h) * double(width) / double(height)), 1, width);
  const int64_t top = randint(height - h + 1, gen), left = randint(width - w + 1, gen);
  std::fill(out, out + channels * height * width, 0.0f);
  std::vector<float> shrunk(static_cast<size_t>(channels * h * w));
  resize_bilinear(in, channels, height, width, shrunk.data(), h, w);
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t y = 0; y < h; ++y)
      std::copy_n(shrunk.data() + (c * h + y) * w, w, out + (c * height + top + y) * width + left);
}

}  // namespace adjoint
