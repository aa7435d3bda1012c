// What a model says about itself (models/model.h, ModelFacts) and what a checkpoint says
// about its run (training_position, models/checkpoint.h): code outside models/ asks these
// instead of testing an architecture's name, and train, info and eval name a run's epoch
// the same way.
#include <doctest/doctest.h>

#include <filesystem>

#include "analysis/pullbacks/explain.h"
#include "engine/data/dataset.h"
#include "engine/error.h"
#include "models/checkpoint.h"
#include "models/model.h"
#include "models/training.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

std::shared_ptr<Model> build(ModelConfig c) {
  Generator gen(3);
  return make_model(c, gen);
}

ModelConfig small_vit(int64_t depth) {
  ModelConfig c;
  c.arch = "vit_custom", c.dim = 16, c.depth = depth, c.heads = 2, c.patch = 4;
  c.in_channels = 1, c.image_size = 8, c.num_classes = 3;
  return c;
}

ModelConfig small_vgg(bool small_classifier) {
  ModelConfig c;
  c.arch = "vgg11", c.width = 0.0625, c.small_stem = small_classifier;
  c.in_channels = 1, c.image_size = 32, c.num_classes = 3;
  return c;
}

// A three-block convolutional model that carries a ViT's name but says nothing about
// Grad-CAM: its block must be found by running it, as for any CNN.
class NamedLikeAVit : public Model {
 public:
  NamedLikeAVit() : Model(config()) {
    add_block("conv1", [](const Tensor& x) { return x * 2.0f; });
    add_block("conv2", [](const Tensor& x) { return x * 3.0f; });
    add_block("head", [](const Tensor& x) { return mean(x, {2, 3}); });
  }
  static ModelConfig config() {
    ModelConfig c;
    c.arch = "vit_tiny";
    return c;
  }
};

// Four blank 1×32×32 images in two classes: enough for train() to reach its checks.
DataSource blank_images() {
  DataSource d;
  d.spec = "blank";
  d.train = std::make_shared<InMemoryDataset>("blank", Shape{1, 32, 32}, std::vector<float>(4 * 32 * 32, 0.5f),
                                              std::vector<int64_t>{0, 1, 0, 1}, 2);
  d.test = d.train;
  d.mean = {0.5f};
  d.std = {0.5f};
  d.images = true;
  return d;
}

}  // namespace

TEST_CASE("model facts: a ViT names its Grad-CAM block, the input of its last transformer block") {
  for (const auto& [depth, block] : std::vector<std::pair<int64_t, std::string>>{
           {1, "patch_embed"}, {2, "blocks.0"}, {3, "blocks.1"}}) {
    CAPTURE(depth);
    auto vit = build(small_vit(depth));
    CHECK(vit->facts().gradcam_block == block);
    CHECK(default_gradcam_block(*vit, {2, 1, 8, 8}) == block);
    CHECK_FALSE(vit->facts().has_dropout);
  }
  // CNNs leave it to the run: ResNet's last block before the head on 32×32.
  ModelConfig r;
  r.arch = "resnet18", r.width = 0.0625, r.in_channels = 1, r.image_size = 32, r.num_classes = 3;
  auto resnet = build(r);
  CHECK(resnet->facts().gradcam_block.empty());
  CHECK(default_gradcam_block(*resnet, {1, 1, 32, 32}) == "layer4.1");
  // The name alone decides nothing: a CNN called "vit_tiny" gets the CNN rule.
  NamedLikeAVit impostor;
  CHECK(impostor.facts().gradcam_block.empty());
  CHECK(default_gradcam_block(impostor, {1, 1, 4, 4}) == "conv2");  // a name test would pick "conv1"
}

TEST_CASE("model facts: VGG's ImageNet classifier has dropout, which data-parallel training refuses") {
  auto with_dropout = build(small_vgg(false));
  auto without = build(small_vgg(true));
  CHECK(with_dropout->facts().has_dropout);
  CHECK_FALSE(without->facts().has_dropout);
  // VGG-11 without BatchNorm has no buffers: dropout alone is why the run is refused.
  REQUIRE(with_dropout->named_buffers().empty());
  TrainOptions o;
  o.epochs = 1, o.batch_size = 2, o.augment = false, o.data_parallel = 2;
  CHECK_THROWS_WITH_AS(train(*with_dropout, blank_images(), o), doctest::Contains("vgg11 has dropout"), UsageError);
  CHECK(train(*without, blank_images(), o).size() == 1);
}

TEST_CASE("training position: an epoch's end, a part of one, and checkpoints that do not say") {
  CHECK(training_position(938, 2, 469) == "epoch 2");
  CHECK(training_position(150, 0, 469) == "epoch 1 (150 of 469 batches)");
  CHECK(training_position(470, 1, 469) == "epoch 2 (1 of 469 batches)");
  CHECK(training_position(0, 0, 469) == "epoch 0 (no step taken)");
  CHECK(training_position(150, 0, 0) == "0 epochs completed");
  CHECK(training_position(938, 1, 0) == "1 epoch completed");
}

TEST_CASE("training position: train, info and eval name a run cut short by --max-steps alike") {
  TempDir dir;
  // modadd:7 with batch 4: 3 batches an epoch; 2 steps stop inside the first.
  const CommandOutcome trained =
      run_adjoint({"train", "--model", "bilinear_mlp", "--hidden", "8", "--data", "modadd:7", "--batch", "4",
                   "--epochs", "1", "--max-steps", "2", "--optimizer", "adamw", "--out", dir.path().string()});
  REQUIRE(trained.code == 0);
  CHECK(contains(trained.out, "epoch 1 (2 of 3 batches): train loss"));
  const std::string checkpoint = dir.file("checkpoint.safetensors");
  const Checkpoint ck = load_checkpoint(checkpoint);
  CHECK(ck.epoch == 0);  // epochs completed, what --resume reads
  CHECK(ck.step == 2);
  CHECK(ck.batches_per_epoch == 3);
  const CommandOutcome info = run_adjoint({"info", checkpoint});
  REQUIRE(info.code == 0);
  CHECK(contains(info.out, "epoch 1 (2 of 3 batches), step 2"));
  const CommandOutcome eval = run_adjoint({"eval", "--checkpoint", checkpoint});
  REQUIRE(eval.code == 0);
  CHECK(contains(eval.out, "(epoch 1 (2 of 3 batches), step 2)"));

  // A whole epoch: "epoch 1" everywhere.
  const CommandOutcome whole = run_adjoint({"train", "--model", "bilinear_mlp", "--hidden", "8", "--data", "modadd:7",
                                            "--batch", "4", "--epochs", "1", "--optimizer", "adamw", "--overwrite",
                                            "--out", dir.path().string()});
  REQUIRE(whole.code == 0);
  CHECK(contains(whole.out, "epoch 1: train loss"));
  CHECK(contains(run_adjoint({"info", checkpoint}).out, "  epoch 1, step 3"));
}

TEST_CASE("model facts: train's default optimizer is the model's own (AdamW for a ViT, SGD for a CNN)" *
          doctest::skip(!std::filesystem::is_directory("/usr/share/datasets/fashion-mnist"))) {
  TempDir dir;
  const auto optimizer_of = [&](const std::vector<std::string>& model, const std::string& name) {
    std::vector<std::string> words = {"train", "--data", "fashion-mnist", "--batch", "8", "--max-steps", "1",
                                      "--eval-limit", "16", "--out", dir.file(name), "--model"};
    words.insert(words.end(), model.begin(), model.end());
    const CommandOutcome run = run_adjoint(words);
    REQUIRE_MESSAGE(run.code == 0, run.err);
    return load_checkpoint(dir.file(name + "/checkpoint.safetensors")).metadata.at("train.optimizer");
  };
  CHECK(build(small_vit(1))->facts().default_optimizer == "adamw");
  CHECK(build(small_vgg(true))->facts().default_optimizer == "sgd");
  CHECK(optimizer_of({"vit_custom", "--dim", "16", "--depth", "1", "--heads", "2", "--patch", "4"}, "vit") == "adamw");
  CHECK(optimizer_of({"resnet18", "--width", "0.0625"}, "resnet") == "sgd");
  // A given --optimizer still wins.
  CHECK(optimizer_of({"vit_custom", "--dim", "16", "--depth", "1", "--heads", "2", "--patch", "4", "--optimizer", "sgd"},
                     "vit_sgd") == "sgd");
}
