// ResNet-18/34/50 with torchvision's parameter names (conv1, bn1, layer1.0.conv1, ...,
// fc), the ImageNet stem (7×7 stride 2 + max-pool) or the small-image stem (3×3
// stride 1, no max-pool), a width multiplier and any input channel count.
// Blocks: "stem", "layer1.0", ..., "layer4.<last>", "head" (global average pool + fc).
#include <cmath>

#include "engine/error.h"
#include "models/layers.h"
#include "models/model.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/pool.h"

namespace adjoint {

namespace {

Conv2dOptions conv_options(int64_t stride, int64_t padding) {
  Conv2dOptions o;
  o.stride_h = o.stride_w = stride;
  o.pad_h = o.pad_w = padding;
  return o;
}

// torchvision initialises convolutions with kaiming_normal(fan_out, relu).
std::shared_ptr<Conv2d> make_conv(int64_t in, int64_t out, int64_t k, int64_t stride, int64_t pad, Generator& gen) {
  auto conv = std::make_shared<Conv2d>(in, out, k, conv_options(stride, pad), false, gen);
  const float std = std::sqrt(2.0f / float(out * k * k));
  redraw_normal(conv->weight, std, gen);
  return conv;
}

class ResidualBlock : public Module {
public:
  ResidualBlock(int64_t in, int64_t planes, int64_t stride, bool bottleneck, Generator& gen) {
    const int64_t out = bottleneck ? planes * 4 : planes;
    if (bottleneck) {
      convs_ = {make_conv(in, planes, 1, 1, 0, gen), make_conv(planes, planes, 3, stride, 1, gen),
                make_conv(planes, out, 1, 1, 0, gen)};
    } else {
      convs_ = {make_conv(in, planes, 3, stride, 1, gen), make_conv(planes, planes, 3, 1, 1, gen)};
    }
    for (size_t i = 0; i < convs_.size(); ++i) {
      register_module("conv" + std::to_string(i + 1), convs_[i]);
      bns_.push_back(register_module("bn" + std::to_string(i + 1), std::make_shared<BatchNorm>(convs_[i]->weight.size(0))));
    }
    if (stride != 1 || in != out) {
      auto shortcut = std::make_shared<Module>();
      down_conv_ = shortcut->register_module("0", make_conv(in, out, 1, stride, 0, gen));
      down_bn_ = shortcut->register_module("1", std::make_shared<BatchNorm>(out));
      register_module("downsample", shortcut);
    }
  }

  Tensor forward(const Tensor& x) const {
    Tensor h = x;
    for (size_t i = 0; i + 1 < convs_.size(); ++i) h = conv_bn(*convs_[i], *bns_[i], h, true);
    // The shortcut before the last convolution, which adds it (and the ReLU) as it writes.
    const Tensor identity = down_conv_ ? conv_bn(*down_conv_, *down_bn_, x, false) : x;
    return conv_bn(*convs_.back(), *bns_.back(), h, true, identity);
  }

private:
  std::vector<std::shared_ptr<Conv2d>> convs_;
  std::vector<std::shared_ptr<BatchNorm>> bns_;
  std::shared_ptr<Conv2d> down_conv_;
  std::shared_ptr<BatchNorm> down_bn_;
};

class ResNet : public Model {
public:
  PolynomialView polynomial_view(int64_t) const override {
    throw Error(cat(config().arch, ": the ReLU after 'bn1' is not polynomial; tensor similarity compares bilinear models"));
  }
  ResNet(const ModelConfig& config, const std::vector<int64_t>& depths, bool bottleneck, Generator& gen)
      : Model(config) {
    auto widths = [&](int64_t base) { return std::max<int64_t>(1, int64_t(std::lround(base * config.width))); };
    const int64_t stem_width = widths(64);
    auto conv1 = register_module("conv1", config.small_stem ? make_conv(config.in_channels, stem_width, 3, 1, 1, gen)
                                                            : make_conv(config.in_channels, stem_width, 7, 2, 3, gen));
    auto bn1 = register_module("bn1", std::make_shared<BatchNorm>(stem_width));
    const bool pool = !config.small_stem;
    add_block("stem", [conv1, bn1, pool](const Tensor& x) {
      Tensor h = conv_bn(*conv1, *bn1, x, true);
      return pool ? max_pool2d(h, 3, 2, 1) : h;
    });

    int64_t in = stem_width;
    for (size_t stage = 0; stage < depths.size(); ++stage) {
      auto layer = register_module("layer" + std::to_string(stage + 1), std::make_shared<Module>());
      const int64_t planes = widths(64 << stage);
      for (int64_t b = 0; b < depths[stage]; ++b) {
        const int64_t stride = (stage > 0 && b == 0) ? 2 : 1;
        auto block = layer->register_module(std::to_string(b),
                                            std::make_shared<ResidualBlock>(in, planes, stride, bottleneck, gen));
        in = bottleneck ? planes * 4 : planes;
        add_block(cat("layer", stage + 1, ".", b), [block](const Tensor& x) { return block->forward(x); });
      }
    }
    auto fc = register_module("fc", std::make_shared<Linear>(in, config.num_classes, true, gen));
    add_block("head", [fc](const Tensor& x) { return fc->forward(flatten(adaptive_avg_pool2d(x, 1, 1), 1)); });
  }
};

}  // namespace

std::shared_ptr<Model> make_resnet(const ModelConfig& config, Generator& gen) {
  std::vector<int64_t> depths;
  bool bottleneck = false;
  if (config.arch == "resnet18") depths = {2, 2, 2, 2};
  else if (config.arch == "resnet34") depths = {3, 4, 6, 3};
  else if (config.arch == "resnet50") depths = {3, 4, 6, 3}, bottleneck = true;
  else throw UsageError(cat("unknown ResNet '", config.arch, "' (resnet18, resnet34, resnet50)"));
  check(config.width > 0, "resnet: width multiplier must be positive, got ", config.width);
  return std::make_shared<ResNet>(config, depths, bottleneck, gen);
}

}  // namespace adjoint
