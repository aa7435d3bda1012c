// ImageNet as pretrained models expect it: the evaluation presets of torchvision's weights
// (and timm's PVT-v2), and the 1000 class names of the pretrained heads.
//
// A preset's evaluation transform, as torchvision's ImageClassification does it on a PIL
// image (and timm's eval transform, which is the same chain):
//   1. resize the shorter side to `resize` pixels, the longer to ⌊resize · long / short⌋,
//      with PIL's antialiased filter on 8-bit pixels (engine/data/resample.h); an image
//      already of that size is left as it is;
//   2. cut the centre `crop` × `crop` square, its offset round((size − crop) / 2) with
//      Python's rounding (halves to even);
//   3. bytes to floats v / 255;
//   4. normalise by the preset's mean and standard deviation (a Normalize transform: the
//      data source carries mean and std, so reports can show the inputs as pictures).
// Steps 1–3 are preprocess_image; step 4 is the data source's normalisation.
#pragma once
#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/data/resample.h"

namespace adjoint {

struct EvalPreset {
  const char* name;     // as --data imagenet:ROOT:NAME takes it, e.g. "resnet50_v2"
  const char* weights;  // whose weights it belongs to, e.g. "torchvision ResNet50_Weights.IMAGENET1K_V2"
  int64_t resize;       // the shorter side after resizing
  int64_t crop;         // the side of the centre square
  ResampleFilter filter;
  std::array<float, 3> mean, std;
  bool from_torchvision;  // checked against torchvision's weights by the tests' goldens
};

// Every preset, torchvision's first (in the order of tests/goldens/gen_imagenet.py).
const std::vector<EvalPreset>& eval_presets();
// The preset of `name`; a UsageError listing the names for an unknown one.
const EvalPreset& eval_preset(const std::string& name);
// The preset `imagenet:ROOT` uses when none is named: torchvision's V1 weights' transform
// (ResNet-50 V1, VGG, ViT-B/16: resize 256, crop 224, bilinear).
constexpr const char* kDefaultEvalPreset = "resnet50_v1";

// The size torchvision resizes an in_h × in_w image to for a shorter side of `shorter`.
void shorter_side_size(int64_t in_h, int64_t in_w, int64_t shorter, int64_t& out_h, int64_t& out_w);

// Steps 1–3 above: an interleaved (height, width, 3) RGB image to planar (3, crop, crop)
// floats in [0, 1]. Throws an Error naming `what` when the preset's crop does not fit.
void preprocess_image(const uint8_t* rgb, int64_t height, int64_t width, const EvalPreset& preset, float* out,
                      const std::string& what);

// ImageNet-1k's 1000 class names in the order of the pretrained heads (sorted WordNet ids),
// from engine/data/imagenet_classes.inc.
const std::vector<std::string>& imagenet_class_names();

}  // namespace adjoint
