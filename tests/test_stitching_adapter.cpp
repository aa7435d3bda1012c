// The map↔token adapter of the stitch (analysis/stitching/layer.h) between a CNN's
// feature maps and a ViT's tokens, and the stitched model as a Model of its own
// (analysis/stitching/stitched_model.h): its predictions and explanations, and the stitch file.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <tuple>

#include "analysis/pullbacks/explain.h"
#include "analysis/stitching/stitched_model.h"
#include "analysis/stitching/objectives.h"
#include "analysis/stitching/train.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/io/safetensors.h"
#include "ops/layout.h"
#include "tests/stitch_fixture.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

// A ViT of width 6 on 1×8×8 images with 2×2 patches: 1 + 4² = 17 tokens.
Endpoint tiny_vit(uint64_t seed) {
  ModelConfig c;
  c.arch = "vit_custom";
  c.dim = 6, c.depth = 2, c.heads = 2, c.patch = 2, c.mlp_ratio = 2;
  c.in_channels = 1, c.image_size = 8, c.num_classes = 10;
  Generator gen(seed);
  Endpoint e{"vit", make_model(c, gen), {0.5f}, {0.25f}};
  e.model->train(false);
  return e;
}

// A ResNet-18 at width 1/16 (4 channels in layer1) on 1×8×8 images.
Endpoint tiny_resnet(uint64_t seed) {
  ModelConfig c;
  c.arch = "resnet18";
  c.width = 0.0625;
  c.in_channels = 1, c.image_size = 8, c.num_classes = 10;
  Generator gen(seed);
  Endpoint e{"resnet", make_model(c, gen), {0.3f}, {0.4f}};
  e.model->train(false);
  return e;
}

// A model stitched into itself after `block` through an identity stitch.
std::unique_ptr<StitchedModel> self_stitched(const Endpoint& e, size_t block, const Shape& input) {
  StitchPair pair(e, block, e, block, input);
  auto stitch = std::make_shared<Stitch>(pair.shapes());
  stitch->init_identity();
  return std::make_unique<StitchedModel>(pair, stitch);
}

}  // namespace

TEST_CASE("stitch adapter: maps into tokens lay positions row-major and make the class token their mean") {
  // Identity on a 2×2 map of 2 channels into 1 + 2² tokens of width 2: token 1 + 2r + c is
  // the map's column at (r, c); the class token is the mean of those four.
  Stitch s({{2, 2, 2}, {5, 2}, "maps→tokens"});
  s.init_identity();
  const Tensor map = Tensor::from_vector({1, 2, 2, 2}, {1, 2, 3, 4, 10, 20, 30, 40});
  CHECK(s.forward(map).to_vector() == std::vector<float>{2.5f, 25, 1, 10, 2, 20, 3, 30, 4, 40});
  // A 4×4 map reaches the 2×2 grid by area averages: token 1 is the mean of the top-left window.
  Stitch down({{1, 4, 4}, {5, 1}, "down"});
  down.init_identity();
  std::vector<float> ramp(16);
  for (int i = 0; i < 16; ++i) ramp[size_t(i)] = float(i);
  const std::vector<float> tokens = down.forward(Tensor::from_vector({1, 1, 4, 4}, ramp)).to_vector();
  CHECK(tokens == std::vector<float>{7.5f, (0 + 1 + 4 + 5) / 4.0f, (2 + 3 + 6 + 7) / 4.0f, (8 + 9 + 12 + 13) / 4.0f,
                                     (10 + 11 + 14 + 15) / 4.0f});
  // Shapes with a resize up and a change of width.
  Stitch up({{8, 2, 2}, {17, 12}, "up"});
  CHECK(up.forward(random_tensor({3, 8, 2, 2}, 1)).shape() == Shape{3, 17, 12});
}

TEST_CASE("stitch adapter: tokens into maps drop the class token and lay the patch tokens on their grid") {
  Stitch s({{5, 2}, {2, 2, 2}, "tokens→maps"});
  s.init_identity();
  const Tensor tokens = Tensor::from_vector({1, 5, 2}, {99, -99, 1, 10, 2, 20, 3, 30, 4, 40});
  CHECK(s.forward(tokens).to_vector() == std::vector<float>{1, 2, 3, 4, 10, 20, 30, 40});
  // The class token never reaches the output.
  Tensor other = tokens.clone();
  other.data()[0] = 5, other.data()[1] = 7;
  CHECK(s.forward(other).to_vector() == s.forward(tokens).to_vector());
  // A 2×2 grid resized up to 3×5 by bilinear interpolation, into 4 channels.
  Stitch up({{5, 6}, {4, 3, 5}, "up"});
  CHECK(up.forward(random_tensor({2, 5, 6}, 2)).shape() == Shape{2, 4, 3, 5});
}

TEST_CASE("stitch adapter: a ViT sequence into one of another grid keeps its class token and resizes its patches") {
  // 1 + 4² tokens of width 1 into 1 + 2²: the class token is copied, each 2×2 window of
  // patch tokens averaged.
  Stitch s({{17, 1}, {5, 1}, "tokens→tokens"});
  s.init_identity();
  std::vector<float> values(17);
  for (int i = 0; i < 17; ++i) values[size_t(i)] = float(i == 0 ? -5 : i - 1);  // the grid 0..15, row-major
  CHECK(s.forward(Tensor::from_vector({1, 17, 1}, values)).to_vector() ==
        std::vector<float>{-5, (0 + 1 + 4 + 5) / 4.0f, (2 + 3 + 6 + 7) / 4.0f, (8 + 9 + 12 + 13) / 4.0f,
                           (10 + 11 + 14 + 15) / 4.0f});
  Stitch up({{5, 6}, {10, 4}, "up"});
  CHECK(up.forward(random_tensor({2, 5, 6}, 3)).shape() == Shape{2, 10, 4});
}

TEST_CASE("stitch adapter: token counts that are not 1 + g² are refused, naming the blocks and shapes") {
  CHECK(token_grid_side(17) == 4);
  CHECK(token_grid_side(2) == 1);
  CHECK(token_grid_side(16) == 0);
  CHECK(token_grid_side(1) == 0);
  CHECK_THROWS_WITH_AS(Stitch({{8, 4, 4}, {16, 12}, "front a block 1 → end b block 2"}),
                       doctest::Contains("front a block 1 → end b block 2: cannot join front features [8, 4, 4] to end "
                                         "features [16, 12]: the end's 16 tokens are not a class token and a square "
                                         "grid of patch tokens (1 + g²)"),
                       Error);
  CHECK_THROWS_WITH_AS(Stitch({{11, 12}, {8, 4, 4}, "w"}), doctest::Contains("the front's 11 tokens are not"), Error);
  CHECK_THROWS_WITH_AS(Stitch({{17, 12}, {11, 12}, "w"}),
                       doctest::Contains("token counts differ (17 against 11) and are not both 1 + g²"), Error);
}

// Least squares through the adapter: tests/test_stitching.cpp, beside the other shapes.

TEST_CASE("stitch adapter: gradients through maps→tokens, tokens→maps and tokens→tokens of another grid match central "
          "differences") {
  check_gradients([](const Args& in) { return apply_stitch(in[0], in[1], in[2], {10, 3}); },
                  {random_tensor({2, 4, 5, 5}, 1), random_tensor({3, 4}, 2), random_tensor({3}, 3)});
  check_gradients([](const Args& in) { return apply_stitch(in[0], in[1], in[2], {3, 5, 3}); },
                  {random_tensor({2, 10, 4}, 4), random_tensor({3, 4}, 5), random_tensor({3}, 6)});
  check_gradients([](const Args& in) { return apply_stitch(in[0], in[1], in[2], {17, 3}); },
                  {random_tensor({2, 10, 4}, 7), random_tensor({3, 4}, 8), random_tensor({3}, 9)});
}

TEST_CASE("stitch adapter: a ResNet front stitched into a ViT end, and a ViT into a ResNet, trains") {
  const Endpoint resnet = tiny_resnet(1), vit = tiny_vit(2);
  const Tensor x = random_tensor({32, 1, 8, 8}, 31, 0.0f, 1.0f);
  std::vector<int64_t> labels(32, 0);
  // ResNet block 2 'layer1.1' (4×8×8 maps) into ViT 'blocks.0' (17 tokens of 6), and ViT
  // 'blocks.0' into ResNet block 4 'layer2.1' (8×4×4 maps).
  for (const auto& [front, i, end, j] : {std::tuple{&resnet, size_t(2), &vit, size_t(1)},
                                         std::tuple{&vit, size_t(1), &resnet, size_t(4)}}) {
    StitchPair pair(*front, i, *end, j, {1, 8, 8});
    INFO(pair.shapes().where, ": ", pair.shapes().front, " → ", pair.shapes().end);
    Stitch s(pair.shapes());
    Generator gen(4);
    s.init_random(gen);
    const std::vector<Tensor> targets = pair.end_targets(x);
    const auto loss = [&] {
      NoGrad off;
      return objective("fula").loss(pair.stitched_path(s, pair.front_features(x)), targets, labels, {}).item();
    };
    const double before = loss();
    StitchTrainOptions o;
    o.objective = "fula";
    o.epochs = 40;
    o.batch = 16;
    o.lr = 3e-2;
    train_stitch(s, pair, {x, x, labels}, o);
    const double after = loss();
    CHECK(std::isfinite(after));
    CHECK(after < 0.7 * before);
  }
}

TEST_CASE("stitched model: an identity stitch of a model into itself predicts and explains as the model does") {
  const Endpoint b = stitch_fixture_model("B");
  const Tensor x = random_tensor({4, 1, 16, 16}, 8);  // already normalised: the model's inputs
  Tensor expected;
  {
    NoGrad off;
    expected = b.model->forward(x);
  }
  const std::vector<int64_t> targets = predicted_classes(*b.model, x);
  for (size_t block : {size_t(1), size_t(5)}) {
    INFO("block ", block);
    const auto stitched_model = self_stitched(b, block, {1, 16, 16});
    const StitchedModel& stitched = *stitched_model;
    CHECK(stitched.num_blocks() == b.model->num_blocks() + 1);
    CHECK(stitched.blocks()[block + 1].name == "stitch");
    CHECK(stitched.blocks()[0].name == "front." + b.model->blocks()[0].name);
    CHECK(stitched.blocks().back().name == "end." + b.model->blocks().back().name);
    CHECK(!stitched.training());
    {
      NoGrad off;
      check_close(stitched.forward(x), expected, 1e-6, 1e-6, "identity-stitched logits");
    }
    // Every transport crosses the stitch as the same linear map: the identity here.
    for (const std::string method : {"gradient", "pullback", "soft_pullback"}) {
      INFO(method);
      const Tensor map = explain(method, stitched, x, targets);
      CHECK(max_abs(map) > 0);
      check_close(map, explain(method, *b.model, x, targets), 1e-5, 1e-6, method + " through the stitched model");
    }
  }
}

TEST_CASE("stitched model: a ViT keeps its class-token-only last block only where the head still follows it") {
  const Endpoint vit = tiny_vit(4);
  const Tensor x = random_tensor({3, 1, 8, 8}, 9);
  Tensor expected;
  {
    NoGrad off;
    expected = vit.model->forward(x);
  }
  // Blocks: patch_embed, blocks.0, blocks.1 (computed with the head: its with_next), head.
  REQUIRE(vit.model->blocks()[2].with_next);
  for (size_t block : {size_t(1), size_t(2)}) {
    INFO("block ", block);
    const auto stitched = self_stitched(vit, block, {1, 8, 8});
    // After block 1 the end's blocks.1 still meets its head; after block 2 the front's
    // blocks.1 meets the stitch, so it must run in full.
    const size_t copy_of_last = block == 1 ? 3 : 2;  // end.blocks.1 after the stitch, or front.blocks.1 before it
    CHECK(bool(stitched->blocks()[copy_of_last].with_next) == (block == 1));
    NoGrad off;
    check_close(stitched->forward(x), expected, 1e-5, 1e-6, "identity-stitched logits");
  }
}

TEST_CASE("stitched model: a stitch file rebuilds its model; malformed files are refused naming the file") {
  const Endpoint a = stitch_fixture_model("A"), b = stitch_fixture_model("B");
  StitchPair pair(a, 2, b, 3, {1, 16, 16});
  Stitch stitch(pair.shapes());
  Generator gen(6);
  stitch.init_random(gen);
  TempDir dir;
  const std::string path = dir.file("s.safetensors");
  write_stitch_file(path, pair, stitch, {{"objective", "slm"}});
  const StitchFile file = read_stitch_file(path);
  CHECK(file.front == "A");
  CHECK(file.end == "B");
  CHECK(file.front_block == 2);
  CHECK(file.end_block == 3);
  const auto model = stitched_model(pair, file);
  CHECK(model->config().arch == "stitched:vgg11_bn→vgg11_bn");
  const Tensor raw = random_tensor({3, 1, 16, 16}, 12, 0.0f, 1.0f);
  {
    NoGrad off;
    check_close(model->forward(a.input(raw)), pair.stitched_logits(stitch, raw), 1e-6, 1e-6, "stitched model");
  }
  // A stitch between other blocks does not fit this file's weight.
  StitchPair other(a, 4, b, 4, {1, 16, 16});
  const std::string misfit = cat("stitch file ", path, ": weight [", stitch.weight.size(0), ", ", stitch.weight.size(1),
                                 "] and bias");
  CHECK_THROWS_WITH_AS(stitched_model(other, file), doctest::Contains(misfit.c_str()), Error);
  write_safetensors(dir.file("bare.safetensors"), {{"weight", stitch.weight}, {"bias", stitch.bias}});
  CHECK_THROWS_WITH_AS(read_stitch_file(dir.file("bare.safetensors")),
                       doctest::Contains("bare.safetensors: no 'front' in its metadata"), Error);
}
