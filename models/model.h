// A model is a list of named blocks over a Module that owns the parameters.
//
// Running a model means running its blocks in order; features after block i and running
// from block i+1 on given features are the same call with other bounds. Stitching and
// every layer-wise analysis rely on this being the normal way to run a model.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/module.h"
#include "engine/random.h"
#include "models/polynomial.h"

namespace adjoint {

// Everything needed to rebuild a model: saved in checkpoints as string metadata.
struct ModelConfig {
  std::string arch = "resnet18";  // resnet18|34|50, vgg11|13|16|19[_bn], vit_tiny|small|base|custom,
                                  // vit_b_16|b_32|l_16 (torchvision's),
                                  // bilinear_mlp, bilinear_lm, pvt_v2_b0…b5
  int64_t num_classes = 10;
  int64_t in_channels = 3;
  int64_t image_size = 32;
  bool small_stem = true;       // ResNet: 3×3 stride-1 stem, no max-pool; VGG: small classifier
  double width = 1.0;           // channel multiplier (ResNet, VGG; PVT: of each head's width)
  int64_t patch = 4;            // ViT
  int64_t dim = 0, depth = 0, heads = 0;  // ViT / bilinear LM (0 = the arch's default);
                                          // PVT: depth is every stage's block count
  int64_t mlp_ratio = 4;
  std::string pool = "token";   // ViT: "token" (class token, then norm) or "avg" (timm's
                                // global_pool='avg': mean of the patch tokens, then fc_norm)
  int64_t hidden = 256;         // bilinear MLP hidden width (with depth: of each block)
  int64_t in_features = 0;      // bilinear MLP flat input size (0: in_channels·image_size²)
  int64_t vocab = 256, seq_len = 64;   // bilinear LM
  std::string attention = "softmax";   // bilinear LM: softmax | bilinear
  double residual_scale = 1.0;         // bilinear LM: x + s·block(x)
  bool layer_norm = false;             // bilinear LM: pre-LN (off keeps it polynomial)

  std::map<std::string, std::string> to_map() const;
  // Throws UsageError naming the key at fault.
  static ModelConfig from_map(const std::map<std::string, std::string>& values);
};

struct Block {
  std::string name;
  std::function<Tensor(const Tensor&)> forward;
  // Optional: this block and the next one in a single call, with the same result as the
  // two in turn. Run whenever a call runs both, so it may skip work whose only reader is
  // the next block (a ViT's last block computes only the class token its head reads).
  std::function<Tensor(const Tensor&)> with_next;
};

// Renames (ECMAScript regex over a whole name, its replacement with $1 for the first group),
// tried in order; the first that matches a name renames it.
using NameRules = std::vector<std::pair<std::string, std::string>>;

// What a model says about itself, so that code outside models/ asks the model instead of
// testing its architecture's name. Each family sets these in its constructor.
struct ModelFacts {
  // The block Grad-CAM reads by default, where the family fixes it (a ViT: the input of its
  // last transformer block, analysis/pullbacks/explain.h says why). Empty: the last block
  // before the head whose output map is larger than 1×1, found by running the model.
  std::string gradcam_block;
  // Dropout in training mode (VGG's ImageNet classifier): random state that the parts of a
  // data-parallel batch would all draw from at once.
  bool has_dropout = false;
  // The optimizer `adjoint train` uses when none is given: the one the family is known to
  // train with from scratch at the default learning rates (a ViT diverges under SGD at 0.1
  // within its first hundred steps, as transformers without warm-up do; AdamW at 1e-3 trains it).
  std::string default_optimizer = "sgd";
  // Names in the weight files the family is published with that differ from the model's
  // own (torchvision's ViT names for a model built with timm's), as rules mapping a file's
  // name to the model's. Names no rule matches are taken as they are.
  NameRules weight_file_names{};
};

class Model : public Module {
public:
  explicit Model(ModelConfig config) : config_(std::move(config)) {}
  const ModelConfig& config() const { return config_; }
  const std::vector<Block>& blocks() const { return blocks_; }
  const ModelFacts& facts() const { return facts_; }
  size_t num_blocks() const { return blocks_.size(); }
  // Index of a block by name; throws listing the names when absent.
  size_t block_index(const std::string& name) const;

  // Runs blocks [from, to), taking a block's `with_next` when the range holds the next one.
  Tensor run(const Tensor& x, size_t from, size_t to) const;
  Tensor forward(const Tensor& x) const { return run(x, 0, blocks_.size()); }
  Tensor features(const Tensor& x, size_t block) const { return run(x, 0, block + 1); }
  Tensor forward_from(const Tensor& features, size_t block) const { return run(features, block + 1, blocks_.size()); }
  // Runs blocks [from, to) and keeps every block's output: element k is the output of
  // block from + k (what layer-wise losses such as stitching's FuLA compare). Never takes
  // `with_next`, since every output is wanted.
  std::vector<Tensor> trace(const Tensor& x, size_t from, size_t to) const;

  // The network as a polynomial (models/polynomial.h), for tensor similarity, over the first
  // `positions` sequence positions of a sequence model (0: all it takes). Throws an Error
  // naming the first layer that is not polynomial (ReLU, GELU, softmax, LayerNorm).
  virtual PolynomialView polynomial_view(int64_t positions = 0) const;

protected:
  void add_block(std::string name, std::function<Tensor(const Tensor&)> forward);
  // Sets the last added block's `with_next` (the block to follow must be added next).
  void set_with_next(std::function<Tensor(const Tensor&)> both);
  void set_facts(ModelFacts facts) { facts_ = std::move(facts); }

private:
  ModelConfig config_;
  std::vector<Block> blocks_;
  ModelFacts facts_;
};

// Builds any architecture named in config.arch with freshly initialised weights.
std::shared_ptr<Model> make_model(const ModelConfig& config, Generator& gen);
// The architectures make_model knows, for --help and error messages.
std::vector<std::string> model_names();

// Factories per family (models/resnet.cpp, vgg.cpp, vit.cpp, bilinear.cpp, pvt.cpp).
std::shared_ptr<Model> make_resnet(const ModelConfig& config, Generator& gen);
std::shared_ptr<Model> make_vgg(const ModelConfig& config, Generator& gen);
std::shared_ptr<Model> make_vit(const ModelConfig& config, Generator& gen);
std::shared_ptr<Model> make_bilinear(const ModelConfig& config, Generator& gen);
std::shared_ptr<Model> make_pvt(const ModelConfig& config, Generator& gen);

}  // namespace adjoint
