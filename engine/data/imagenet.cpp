#include "engine/data/imagenet.h"

#include <algorithm>
#include <array>
#include <cmath>

#include "engine/error.h"

namespace adjoint {

namespace {

// The statistics of ImageNet's training images every preset here normalises by.
constexpr std::array<float, 3> kMean = {0.485f, 0.456f, 0.406f}, kStd = {0.229f, 0.224f, 0.225f};

}  // namespace

const std::vector<EvalPreset>& eval_presets() {
  using F = ResampleFilter;
  static const std::vector<EvalPreset> presets = {
      {"resnet18_v1", "torchvision ResNet18_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"resnet34_v1", "torchvision ResNet34_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"resnet50_v1", "torchvision ResNet50_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"resnet50_v2", "torchvision ResNet50_Weights.IMAGENET1K_V2", 232, 224, F::bilinear, kMean, kStd, true},
      {"resnet101_v1", "torchvision ResNet101_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"resnet101_v2", "torchvision ResNet101_Weights.IMAGENET1K_V2", 232, 224, F::bilinear, kMean, kStd, true},
      {"resnet152_v1", "torchvision ResNet152_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"resnet152_v2", "torchvision ResNet152_Weights.IMAGENET1K_V2", 232, 224, F::bilinear, kMean, kStd, true},
      {"vgg11_v1", "torchvision VGG11_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"vgg11_bn_v1", "torchvision VGG11_BN_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"vgg13_v1", "torchvision VGG13_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"vgg13_bn_v1", "torchvision VGG13_BN_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"vgg16_v1", "torchvision VGG16_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"vgg16_bn_v1", "torchvision VGG16_BN_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"vgg19_v1", "torchvision VGG19_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"vgg19_bn_v1", "torchvision VGG19_BN_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"vit_b_16_v1", "torchvision ViT_B_16_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"vit_b_16_swag_e2e_v1", "torchvision ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1", 384, 384, F::bicubic,
       kMean, kStd, true},
      {"vit_b_16_swag_linear_v1", "torchvision ViT_B_16_Weights.IMAGENET1K_SWAG_LINEAR_V1", 224, 224, F::bicubic,
       kMean, kStd, true},
      {"vit_b_32_v1", "torchvision ViT_B_32_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      {"vit_l_16_v1", "torchvision ViT_L_16_Weights.IMAGENET1K_V1", 242, 224, F::bilinear, kMean, kStd, true},
      {"vit_l_32_v1", "torchvision ViT_L_32_Weights.IMAGENET1K_V1", 256, 224, F::bilinear, kMean, kStd, true},
      // timm's default config of every PVT-v2 (b0–b5): crop_pct 0.9 and bicubic, so its eval
      // transform resizes the shorter side to ⌊224 / 0.9⌋ = 248 with PIL's bicubic.
      {"pvt_v2", "timm pvt_v2_b0..b5 (crop_pct 0.9, bicubic)", 248, 224, F::bicubic, kMean, kStd, false},
  };
  return presets;
}

const EvalPreset& eval_preset(const std::string& name) {
  std::string names;
  for (const EvalPreset& p : eval_presets()) {
    if (name == p.name) return p;
    names += cat(names.empty() ? "" : ", ", p.name);
  }
  throw UsageError(cat("unknown preset '", name, "'; known: ", names));
}

void shorter_side_size(int64_t in_h, int64_t in_w, int64_t shorter, int64_t& out_h, int64_t& out_w) {
  // torchvision: new_long = int(shorter · long / short), a float product truncated.
  const bool portrait = in_w <= in_h;
  const int64_t short_side = portrait ? in_w : in_h, long_side = portrait ? in_h : in_w;
  const int64_t new_long = int64_t(double(shorter) * double(long_side) / double(short_side));
  out_h = portrait ? new_long : shorter;
  out_w = portrait ? shorter : new_long;
}

namespace {

// Python's round() of (size − crop) / 2: a half goes to the even neighbour.
int64_t centre_offset(int64_t size, int64_t crop) {
  return int64_t(std::nearbyint(double(size - crop) / 2.0));  // the default rounding mode is to even
}

}  // namespace

void preprocess_image(const uint8_t* rgb, int64_t height, int64_t width, const EvalPreset& preset, float* out,
                      const std::string& what) {
  int64_t h = 0, w = 0;
  shorter_side_size(height, width, preset.resize, h, w);
  // A thin strip (1 × 60000 pixels) would grow to billions of pixels; the decoder's limit.
  constexpr int64_t max_pixels = int64_t(1) << 26;
  check(h <= max_pixels / std::max<int64_t>(w, 1), what, ": a ", width, " × ", height, " image resized to ", w, " × ", h,
        " is over the limit of ", max_pixels, " pixels");
  check(h >= preset.crop && w >= preset.crop, what, ": a ", width, " × ", height, " image resized to ", w, " × ", h,
        " is smaller than the ", preset.crop, "-pixel crop of preset ", preset.name);
  std::vector<uint8_t> resized;
  const uint8_t* pixels = rgb;
  if (h != height || w != width) {
    resized.resize(size_t(h * w * 3));
    resample_uint8(rgb, height, width, 3, resized.data(), h, w, preset.filter);
    pixels = resized.data();
  }
  const int64_t top = centre_offset(h, preset.crop), left = centre_offset(w, preset.crop), side = preset.crop;
  for (int64_t c = 0; c < 3; ++c)
    for (int64_t y = 0; y < side; ++y)
      for (int64_t x = 0; x < side; ++x)
        out[(c * side + y) * side + x] = float(pixels[((top + y) * w + left + x) * 3 + c]) / 255.0f;
}

const std::vector<std::string>& imagenet_class_names() {
  static const std::vector<std::string> names = {
#include "engine/data/imagenet_classes.inc"
  };
  return names;
}

}  // namespace adjoint
