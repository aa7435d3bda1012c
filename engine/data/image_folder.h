// A folder of images, one sub-folder per class: root/<class>/<file>.{png,jpg,jpeg,bmp}.
//
// Classes are the sub-folder names sorted bytewise (label = position in that order);
// files are sorted by name inside each class. Images are decoded on demand by stb_image
// (so a loader decodes a batch in parallel), converted to the requested channel count
// (1 grey, 3 RGB, 4 RGBA) and resized bilinearly to height × width when their size
// differs. Opening the folder lists it and opens no image: an ImageNet folder holds
// 50 000 validation and 1.28 million training files, and a run that looks at 16 of them
// should not read them all. So an unreadable or non-image file is found when its example
// is first decoded, and that error names the file; it is never skipped, which would shift
// every later index and label.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/data/dataset.h"
#include "engine/data/imagenet.h"

namespace adjoint {

// Decodes one image file (PNG, JPEG, BMP, ...) into (channels, height, width) floats in
// [0, 1], converting the channel count and resizing bilinearly. Errors name the file.
// A missing file is "no such file"; a PNG whose chunk CRCs or zlib checksum fail is
// refused as damaged (stb would decode it to wrong pixels); decoding errors name the
// format the file's first bytes claim.
void load_image(const std::string& path, int64_t channels, int64_t height, int64_t width, float* out);
// The same from bytes in memory; `path` names them in messages.
void decode_image(const uint8_t* bytes, size_t size, const std::string& path, int64_t channels, int64_t height,
                  int64_t width, float* out);

// Decodes one image file to interleaved (height, width, channels) bytes, the channel count
// converted as stb does (grey repeated, alpha dropped). Errors name the file, as load_image's.
struct DecodedImage {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;
};
DecodedImage decode_image_bytes(const uint8_t* bytes, size_t size, const std::string& path, int64_t channels);
DecodedImage load_image_bytes(const std::string& path, int64_t channels);

class ImageFolder : public Dataset {
public:
  ImageFolder(const std::string& root, int64_t channels, int64_t height, int64_t width);
  // RGB images through a preset's evaluation transform (engine/data/imagenet.h): every
  // example is (3, crop, crop) in [0, 1], whatever the file's size.
  ImageFolder(const std::string& root, const EvalPreset& preset);

  std::string name() const override { return "image-folder:" + root_; }
  int64_t size() const override { return static_cast<int64_t>(files_.size()); }
  Shape shape() const override { return {channels_, height_, width_}; }
  int64_t num_classes() const override { return static_cast<int64_t>(classes_.size()); }
  using Dataset::get;  // keeps the classification shorthand visible
  void get(int64_t index, float* input, int64_t* targets) const override;
  int64_t label(int64_t index) const override;

  const std::vector<std::string>& classes() const { return classes_; }
  const std::string& file(int64_t index) const;

private:
  std::string root_;
  int64_t channels_, height_, width_;
  const EvalPreset* preset_ = nullptr;  // null: a plain bilinear resize to height × width
  std::vector<std::string> classes_;
  std::vector<std::string> files_;
  std::vector<int64_t> labels_;
};

}  // namespace adjoint
