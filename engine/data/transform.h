// Per-example transforms: normalisation and the usual image augmentations.
//
// A transform maps one example (shape → output_shape(shape)) and draws whatever
// randomness it needs from a Generator that belongs to that example alone. The Loader
// derives that generator from (seed, epoch, dataset index) — see example_generator — so
// an augmented batch is the same whatever the thread count, the batch composition or
// whether it was prefetched, and changes from one epoch to the next.
// Image transforms expect (C, H, W).
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/random.h"
#include "engine/shape.h"

namespace adjoint {

class Transform {
public:
  virtual ~Transform() = default;
  virtual std::string name() const = 0;
  // The shape of the result for an input of shape `in`; throws when the transform does
  // not apply to it (e.g. an image transform on a vector).
  virtual Shape output_shape(const Shape& in) const { return in; }
  // Writes the result for `in` (shape `in_shape`) into `out`, which holds
  // numel(output_shape(in_shape)) floats and never overlaps `in`.
  virtual void apply(const float* in, const Shape& in_shape, float* out, Generator& gen) const = 0;
};

using Transforms = std::vector<std::shared_ptr<const Transform>>;

// (x - mean[c]) / std[c] per channel (axis 0). One value serves every channel.
class Normalize : public Transform {
public:
  Normalize(std::vector<float> mean, std::vector<float> std);
  std::string name() const override { return "normalize"; }
  Shape output_shape(const Shape& in) const override;
  void apply(const float* in, const Shape& in_shape, float* out, Generator& gen) const override;

private:
  std::vector<float> mean_, std_;
};

// Pads the image with `padding` zeros on every side, then cuts a height × width window
// at a uniformly random position (the CIFAR recipe is RandomCrop(32, 32, 4)).
class RandomCrop : public Transform {
public:
  RandomCrop(int64_t height, int64_t width, int64_t padding = 0);
  std::string name() const override { return "random_crop"; }
  Shape output_shape(const Shape& in) const override;
  void apply(const float* in, const Shape& in_shape, float* out, Generator& gen) const override;

private:
  int64_t height_, width_, padding_;
};

// Mirrors the image left–right with probability p.
class RandomHorizontalFlip : public Transform {
public:
  explicit RandomHorizontalFlip(float p = 0.5f);
  std::string name() const override { return "random_horizontal_flip"; }
  Shape output_shape(const Shape& in) const override;
  void apply(const float* in, const Shape& in_shape, float* out, Generator& gen) const override;

private:
  float p_;
};

// Bilinear resize to height × width (see resize_bilinear).
class Resize : public Transform {
public:
  Resize(int64_t height, int64_t width);
  std::string name() const override { return "resize"; }
  Shape output_shape(const Shape& in) const override;
  void apply(const float* in, const Shape& in_shape, float* out, Generator& gen) const override;

private:
  int64_t height_, width_;
};

// Bilinear interpolation of a (channels, in_h, in_w) image to (channels, out_h, out_w)
// with half-pixel centres and clamped borders: the same numbers as PyTorch's
// F.interpolate(mode="bilinear", align_corners=False) without antialiasing.
void resize_bilinear(const float* in, int64_t channels, int64_t in_h, int64_t in_w, float* out, int64_t out_h,
                     int64_t out_w);

// The shape after applying `transforms` in order to an example of shape `shape`.
Shape transformed_shape(const Transforms& transforms, Shape shape);
// Applies `transforms` in order; `shape` is updated to the result's shape.
std::vector<float> apply_transforms(const Transforms& transforms, std::vector<float> example, Shape& shape,
                                    Generator& gen);

// The generator of example `index` in `epoch` under `seed`: a pure function of the three
// (Philox hashes them into a key), independent of the loader's shuffling stream.
Generator example_generator(uint64_t seed, int64_t epoch, int64_t index);

}  // namespace adjoint
