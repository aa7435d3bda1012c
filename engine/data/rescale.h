// Random rescaling: the image shrunk by a random factor and placed at a random position on a
// black background, so that a model learns its classes at every size from a fraction of the
// image up to the whole. In spirit ImageNet's RandomResizedCrop, which shows each class at
// many scales; here it lets a Fashion-MNIST model recognise the half-size tiles of a focus
// mosaic (analysis/pullbacks/focus.h), which plain training never shows it.
//
// Definition, for an image (C, H, W) and a range [lo, hi] of fractions of its side:
//   h  uniform among the integers max(1, round(lo·H)) … round(hi·H);
//   w  = max(1, round(h·W / H)), the aspect ratio kept;
//   the image resized to h × w by resize_bilinear (the interpolation of the mosaics' tiles),
//   its top-left corner at (top, left), uniform in [0, H − h] × [0, W − w];
//   every other value 0 (black, before normalisation).
// h, top and left are drawn in that order from the example's generator, which the loader
// keys by (seed, epoch, index): the same image whatever the threads, ranks or batching.
#pragma once
#include <string>

#include "engine/data/transform.h"

namespace adjoint {

struct RescaleRange {
  double lo = 1, hi = 1;  // fractions of the side; [1, 1] leaves the image as it is
  bool active() const { return lo < 1 || hi < 1; }
};

// "LO,HI" with 0 < LO ≤ HI ≤ 1; UsageError naming the option otherwise.
RescaleRange parse_rescale_range(const std::string& text, const char* option = "random-rescale");
// "LO,HI", the shortest text that reads back as the same numbers.
std::string to_string(const RescaleRange& range);

class RandomRescale : public Transform {
public:
  explicit RandomRescale(RescaleRange range);
  std::string name() const override { return "random_rescale"; }
  Shape output_shape(const Shape& in) const override;
  void apply(const float* in, const Shape& in_shape, float* out, Generator& gen) const override;

  // The smallest and largest height drawn for an image `height` pixels high.
  int64_t min_height(int64_t height) const;
  int64_t max_height(int64_t height) const;

private:
  RescaleRange range_;
};

}  // namespace adjoint
