#include "engine/data/transform.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"

namespace adjoint {

namespace {

// Throws unless `shape` is a non-empty (C, H, W) image.
void check_image(const Shape& shape, const char* who) {
  check(shape.size() == 3 && numel(shape) > 0, who, ": expects a (C, H, W) image, got ", shape);
}

// A float in [0, 1) from one Philox word of the example's generator.
float uniform01(Generator& gen) {
  const uint32_t bits = philox(gen.seed(), gen.reserve(1))[0];
  return static_cast<float>(bits >> 8) * (1.0f / 16777216.0f);
}

}  // namespace

Normalize::Normalize(std::vector<float> mean, std::vector<float> std) : mean_(std::move(mean)), std_(std::move(std)) {
  check(!mean_.empty() && mean_.size() == std_.size(), "normalize: ", mean_.size(), " means and ", std_.size(),
        " standard deviations (need the same non-zero number)");
  for (float s : std_) check(s > 0, "normalize: standard deviation ", s, " is not positive");
}

Shape Normalize::output_shape(const Shape& in) const {
  check(!in.empty(), "normalize: expects at least one axis (channels first), got a scalar");
  check(mean_.size() == 1 || static_cast<int64_t>(mean_.size()) == in[0], "normalize: ", mean_.size(),
        " channel statistics for an example of shape ", in);
  return in;
}

void Normalize::apply(const float* in, const Shape& in_shape, float* out, Generator&) const {
  const int64_t channels = in_shape[0], plane = numel(in_shape) / std::max<int64_t>(channels, 1);
  for (int64_t c = 0; c < channels; ++c) {
    const size_t k = mean_.size() == 1 ? 0 : static_cast<size_t>(c);
    const float m = mean_[k], s = std_[k];
    for (int64_t i = c * plane; i < (c + 1) * plane; ++i) out[i] = (in[i] - m) / s;
  }
}

RandomCrop::RandomCrop(int64_t height, int64_t width, int64_t padding)
    : height_(height), width_(width), padding_(padding) {
  check(height > 0 && width > 0 && padding >= 0, "random_crop: bad size ", height, "x", width, " or padding ",
        padding);
}

Shape RandomCrop::output_shape(const Shape& in) const {
  check_image(in, "random_crop");
  check(height_ <= in[1] + 2 * padding_ && width_ <= in[2] + 2 * padding_, "random_crop: a ", height_, "x", width_,
        " window does not fit image ", in, " padded by ", padding_);
  return {in[0], height_, width_};
}

void RandomCrop::apply(const float* in, const Shape& in_shape, float* out, Generator& gen) const {
  const int64_t channels = in_shape[0], h = in_shape[1], w = in_shape[2];
  // Window origin in padded coordinates, then shifted back into the image's.
  const int64_t top = randint(h + 2 * padding_ - height_ + 1, gen) - padding_;
  const int64_t left = randint(w + 2 * padding_ - width_ + 1, gen) - padding_;
  for (int64_t c = 0; c < channels; ++c)
    for (int64_t y = 0; y < height_; ++y) {
      const int64_t sy = top + y;
      float* row = out + (c * height_ + y) * width_;
      for (int64_t x = 0; x < width_; ++x) {
        const int64_t sx = left + x;
        const bool inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
        row[x] = inside ? in[(c * h + sy) * w + sx] : 0.0f;
      }
    }
}

RandomHorizontalFlip::RandomHorizontalFlip(float p) : p_(p) {
  check(p >= 0 && p <= 1, "random_horizontal_flip: probability ", p, " is outside [0, 1]");
}

Shape RandomHorizontalFlip::output_shape(const Shape& in) const {
  check_image(in, "random_horizontal_flip");
  return in;
}

void RandomHorizontalFlip::apply(const float* in, const Shape& in_shape, float* out, Generator& gen) const {
  const int64_t rows = in_shape[0] * in_shape[1], w = in_shape[2];
  const bool flip = uniform01(gen) < p_;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t x = 0; x < w; ++x) out[r * w + x] = in[r * w + (flip ? w - 1 - x : x)];
}

Resize::Resize(int64_t height, int64_t width) : height_(height), width_(width) {
  check(height > 0 && width > 0, "resize: bad target size ", height, "x", width);
}

Shape Resize::output_shape(const Shape& in) const {
  check_image(in, "resize");
  return {in[0], height_, width_};
}

void Resize::apply(const float* in, const Shape& in_shape, float* out, Generator&) const {
  resize_bilinear(in, in_shape[0], in_shape[1], in_shape[2], out, height_, width_);
}

void resize_bilinear(const float* in, int64_t channels, int64_t in_h, int64_t in_w, float* out, int64_t out_h,
                     int64_t out_w) {
  check(channels > 0 && in_h > 0 && in_w > 0 && out_h > 0 && out_w > 0, "resize_bilinear: bad sizes ", channels,
        "x", in_h, "x", in_w, " -> ", out_h, "x", out_w);
  // Source coordinate of an output pixel centre; negative positions clamp to the edge.
  struct Tap {
    int64_t i0, i1;
    float frac;
  };
  auto taps = [](int64_t in_n, int64_t out_n) {
    std::vector<Tap> t(static_cast<size_t>(out_n));
    const float scale = static_cast<float>(in_n) / static_cast<float>(out_n);
    for (int64_t o = 0; o < out_n; ++o) {
      const float src = std::max(0.0f, (static_cast<float>(o) + 0.5f) * scale - 0.5f);
      const int64_t i0 = std::min(static_cast<int64_t>(src), in_n - 1);
      t[static_cast<size_t>(o)] = {i0, std::min(i0 + 1, in_n - 1), src - static_cast<float>(i0)};
    }
    return t;
  };
  const std::vector<Tap> ty = taps(in_h, out_h), tx = taps(in_w, out_w);
  for (int64_t c = 0; c < channels; ++c) {
    const float* plane = in + c * in_h * in_w;
    for (int64_t y = 0; y < out_h; ++y) {
      const Tap& a = ty[static_cast<size_t>(y)];
      const float* r0 = plane + a.i0 * in_w;
      const float* r1 = plane + a.i1 * in_w;
      float* row = out + (c * out_h + y) * out_w;
      for (int64_t x = 0; x < out_w; ++x) {
        const Tap& b = tx[static_cast<size_t>(x)];
        const float top = r0[b.i0] + b.frac * (r0[b.i1] - r0[b.i0]);
        const float bottom = r1[b.i0] + b.frac * (r1[b.i1] - r1[b.i0]);
        row[x] = top + a.frac * (bottom - top);
      }
    }
  }
}

Shape transformed_shape(const Transforms& transforms, Shape shape) {
  for (const auto& t : transforms) {
    check(t != nullptr, "transforms: null transform in the list");
    shape = t->output_shape(shape);
  }
  return shape;
}

std::vector<float> apply_transforms(const Transforms& transforms, std::vector<float> example, Shape& shape,
                                    Generator& gen) {
  check(static_cast<int64_t>(example.size()) == numel(shape), "transforms: ", example.size(),
        " values for an example of shape ", shape);
  std::vector<float> next;
  for (const auto& t : transforms) {
    check(t != nullptr, "transforms: null transform in the list");
    const Shape out_shape = t->output_shape(shape);
    next.resize(static_cast<size_t>(numel(out_shape)));
    t->apply(example.data(), shape, next.data(), gen);
    std::swap(example, next);
    shape = out_shape;
  }
  return example;
}

Generator example_generator(uint64_t seed, int64_t epoch, int64_t index) {
  // A key apart from `seed` itself, whose counters the loader's shuffling uses.
  constexpr uint64_t augmentation_stream = 0xA0761D6478BD642Full;
  const uint64_t counter = (static_cast<uint64_t>(epoch) << 40) ^ static_cast<uint64_t>(index);
  const auto w = philox(seed ^ augmentation_stream, counter);
  return Generator((uint64_t(w[0]) << 32) | w[1]);
}

}  // namespace adjoint
