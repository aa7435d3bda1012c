// VGG-11/13/16/19, with or without BatchNorm, with torchvision's parameter names
// (features.<i>, classifier.<i>). The ImageNet classifier is adaptive-pool 7×7 + three
// linear layers with dropout, 4096 wide at width 1 (the width multiplier scales it with the
// channels, so a narrow VGG keeps torchvision's structure at a fraction of its size); the
// small-image classifier (config.small_stem) drops the last max-pool so 28×28 and 32×32
// inputs keep a spatial map, then global average pool + one linear layer (classifier.0).
// Blocks: "features.<i>" per conv unit (conv[, bn], relu[, following max-pool]), "head".
#include <cmath>

#include "engine/error.h"
#include "models/layers.h"
#include "models/model.h"
#include "ops/activation.h"
#include "ops/dropout.h"
#include "ops/layout.h"
#include "ops/pool.h"

namespace adjoint {

namespace {

constexpr int64_t kPool = -1;  // 'M' in torchvision's configuration lists

std::vector<int64_t> vgg_layout(int depth) {
  switch (depth) {
    case 11: return {64, kPool, 128, kPool, 256, 256, kPool, 512, 512, kPool, 512, 512, kPool};
    case 13: return {64, 64, kPool, 128, 128, kPool, 256, 256, kPool, 512, 512, kPool, 512, 512, kPool};
    case 16:
      return {64, 64, kPool, 128, 128, kPool, 256, 256, 256, kPool, 512, 512, 512, kPool, 512, 512, 512, kPool};
    case 19:
      return {64,  64,  kPool, 128, 128, kPool, 256, 256, 256, 256, kPool,
              512, 512, 512,   512, kPool, 512, 512, 512, 512, kPool};
  }
  throw UsageError(cat("unknown VGG depth ", depth, " (11, 13, 16, 19)"));
}

class Vgg : public Model {
public:
  PolynomialView polynomial_view(int64_t) const override {
    throw Error(cat(config().arch, ": the ReLU in block 'features.0' is not polynomial; tensor similarity compares "
                    "bilinear models"));
  }
  Vgg(const ModelConfig& config, int depth, bool batch_norm, Generator& gen) : Model(config) {
    std::vector<int64_t> layout = vgg_layout(depth);
    if (config.small_stem) layout.pop_back();  // keep a spatial map on 28×28 / 32×32 inputs
    auto features = register_module("features", std::make_shared<Module>());
    Conv2dOptions same;
    same.pad_h = same.pad_w = 1;
    int64_t index = 0, in = config.in_channels;
    for (size_t i = 0; i < layout.size(); ++i) {
      if (layout[i] == kPool) continue;
      const int64_t out = std::max<int64_t>(1, std::lround(double(layout[i]) * config.width));
      const std::string name = cat("features.", index);
      auto conv = features->register_module(std::to_string(index++), std::make_shared<Conv2d>(in, out, 3, same, true, gen));
      // torchvision: kaiming_normal(fan_out) weights, zero bias.
      redraw_normal(conv->weight, std::sqrt(2.0f / float(out * 9)), gen);
      conv->bias.fill_(0.0f);
      std::shared_ptr<BatchNorm> bn;
      if (batch_norm) bn = features->register_module(std::to_string(index++), std::make_shared<BatchNorm>(out));
      ++index;  // ReLU
      const bool pool = i + 1 < layout.size() && layout[i + 1] == kPool;
      if (pool) ++index;
      add_block(name, [conv, bn, pool](const Tensor& x) {
        Tensor h = bn ? conv_bn(*conv, *bn, x, true) : relu(conv->forward(x));
        return pool ? max_pool2d(h, 2, 2) : h;
      });
      in = out;
    }
    auto classifier = register_module("classifier", std::make_shared<Module>());
    if (config.small_stem) {
      auto fc = classifier->register_module("0", std::make_shared<Linear>(in, config.num_classes, true, gen));
      add_block("head", [fc](const Tensor& x) { return fc->forward(flatten(adaptive_avg_pool2d(x, 1, 1), 1)); });
      return;
    }
    const int64_t hidden = std::max<int64_t>(1, std::lround(4096.0 * config.width));
    auto fc0 = classifier->register_module("0", std::make_shared<Linear>(in * 49, hidden, true, gen));
    auto fc3 = classifier->register_module("3", std::make_shared<Linear>(hidden, hidden, true, gen));
    auto fc6 = classifier->register_module("6", std::make_shared<Linear>(hidden, config.num_classes, true, gen));
    auto dropout_gen = std::make_shared<Generator>(gen.seed() ^ 0x5eedull);
    set_facts({.gradcam_block = "", .has_dropout = true});
    const Module* self = this;
    add_block("head", [=](const Tensor& x) {
      const bool train = self->training();
      Tensor h = flatten(adaptive_avg_pool2d(x, 7, 7), 1);
      h = dropout(relu(fc0->forward(h)), 0.5f, train, *dropout_gen);
      h = dropout(relu(fc3->forward(h)), 0.5f, train, *dropout_gen);
      return fc6->forward(h);
    });
  }
};

}  // namespace

std::shared_ptr<Model> make_vgg(const ModelConfig& config, Generator& gen) {
  const std::string& a = config.arch;
  const bool bn = a.size() > 3 && a.substr(a.size() - 3) == "_bn";
  const std::string digits = a.substr(3, a.size() - 3 - (bn ? 3 : 0));
  int depth = 0;
  if (digits == "11" || digits == "13" || digits == "16" || digits == "19") depth = std::stoi(digits);
  else throw UsageError(cat("unknown VGG '", a, "' (vgg11, vgg13, vgg16, vgg19, each with or without _bn)"));
  return std::make_shared<Vgg>(config, depth, bn, gen);
}

}  // namespace adjoint
