// PVT-v2 (models/pvt.cpp): timm's names, logits and every transport against the PyTorch
// PVT-v2 of tests/goldens/gen_pvt.py, finite differences, blocks and facts, a few training
// steps, and `adjoint train` and `explain` on a tiny one.
#include <doctest/doctest.h>
#include <stb/stb_image_write.h>

#include <filesystem>

#include "analysis/pullbacks/explain.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "models/checkpoint.h"
#include "models/model.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/loss.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

// gen_pvt.py's model: pvt_v2_b0 with heads 4 wide (width 4/32) and two blocks a stage.
ModelConfig golden_config() {
  ModelConfig c;
  c.arch = "pvt_v2_b0", c.width = 0.125, c.depth = 2;
  c.in_channels = 1, c.image_size = 64, c.num_classes = 10;
  return c;
}

std::shared_ptr<Model> golden_pvt() {
  Generator gen(1);
  auto model = make_model(golden_config(), gen);
  std::map<std::string, Tensor> weights;
  const std::string prefix = "weights.";
  for (const auto& [name, t] : fixture("pvt").tensors)
    if (name.rfind(prefix, 0) == 0) weights[name.substr(prefix.size())] = t;
  load_state_dict(*model, weights, "tests/goldens/pvt.safetensors");
  model->train(false);
  return model;
}

// Cotangent of the golden target logit for every example.
Tensor target_cotangent(int64_t batch) {
  Tensor u = Tensor::zeros({batch, 10});
  for (int64_t i = 0; i < batch; ++i) u.data()[i * 10 + int64_t(golden("pvt", "target").item())] = 1.0f;
  return u;
}

void check_golden(const Tensor& got, const std::string& name) {
  const Tensor want = golden("pvt", name);
  REQUIRE(max_abs(want) > 0);
  check_close(got, want, 1e-3, 1e-4 * max_abs(want), name);
}

// Grey size×size images of two classes: bright on the left half, or on the right.
Batch halves(int64_t n, int64_t size, uint64_t seed) {
  Batch b;
  Tensor noise = random_tensor({n, 1, size, size}, seed, -0.3f, 0.3f);
  for (int64_t i = 0; i < n; ++i) {
    b.labels.push_back(i % 2);
    for (int64_t p = 0; p < size * size; ++p)
      if ((p % size < size / 2) == (i % 2 == 0)) noise.data()[i * size * size + p] += 1.0f;
  }
  b.inputs = noise;
  return b;
}

}  // namespace

TEST_CASE("pvt: timm's parameter names, and logits as PyTorch's PVT-v2 gives them") {
  auto model = golden_pvt();  // load_state_dict refuses a missing, unexpected or misshapen name
  const auto names = model->state_dict();
  for (const char* name : {"patch_embed.proj.weight", "patch_embed.norm.bias", "stages.1.downsample.proj.weight",
                           "stages.0.blocks.1.attn.q.weight", "stages.0.blocks.0.attn.sr.weight",
                           "stages.2.blocks.0.attn.norm.weight", "stages.0.blocks.0.mlp.dwconv.weight",
                           "stages.3.norm.weight", "head.bias"})
    CHECK_MESSAGE(names.count(name) == 1, name);
  CHECK(names.count("stages.0.downsample.proj.weight") == 0);  // stage 0's embedding is patch_embed
  CHECK(names.count("stages.3.blocks.0.attn.sr.weight") == 0);  // sr_ratio 1: every token is a key
  CHECK(names.at("stages.0.blocks.0.mlp.dwconv.weight").shape() == Shape{32, 1, 3, 3});  // depth-wise, ratio 8

  NoGrad off;
  const Tensor logits = model->forward(golden("pvt", "input"));
  const Tensor expected = golden("pvt", "logits");
  check_close(logits, expected, 1e-4, 1e-4 * max_abs(expected), "logits");
}

TEST_CASE("pvt: gradient, pullback and soft pullback of a logit match PyTorch's rules") {
  auto model = golden_pvt();
  const Tensor x = golden("pvt", "input").clone().requires_grad_();
  const Tensor u = target_cotangent(x.size(0));
  Temperatures hot;
  hot.gelu = 0.5f, hot.attention = 2.0f;
  std::map<std::string, Tensor> at_input;
  for (const auto& [label, transport] : std::vector<std::pair<std::string, Transport>>{
           {"gradient", Transport::gradient()}, {"pullback", Transport::pullback()},
           {"soft_hot", Transport::soft_pullback(hot)}}) {
    INFO("transport ", label);
    at_input[label] = grad(model->forward(x), {x}, u, transport)[0];
    check_golden(at_input[label], label);
  }
  // The rules differ here by far more than the tolerance, so a transport that fell back
  // on another's rule would fail above.
  CHECK(max_abs(at_input["pullback"] - at_input["gradient"]) > 0.1 * max_abs(at_input["gradient"]));
  CHECK(max_abs(at_input["soft_hot"] - at_input["pullback"]) > 0.1 * max_abs(at_input["pullback"]));

  // The gradient reaches every kind of weight as PyTorch's does.
  const auto params = model->named_parameters();
  const Tensor y = model->forward(x);
  for (const char* name : {"patch_embed.proj.weight", "stages.0.blocks.1.mlp.dwconv.weight",
                           "stages.1.blocks.0.attn.sr.weight", "stages.2.downsample.norm.weight",
                           "stages.3.blocks.0.attn.kv.weight", "stages.3.norm.bias"}) {
    Tensor p;
    for (const auto& [n, t] : params)
      if (n == name) p = t;
    REQUIRE_MESSAGE(p.defined(), name);
    check_golden(grad(y, {p}, u)[0], cat("gradient.", name));
  }
}

TEST_CASE("pvt: the input gradient agrees with finite differences") {
  ModelConfig c = golden_config();
  c.image_size = 32, c.depth = 1;
  Generator gen(5);
  auto model = make_model(c, gen);
  model->train(false);
  check_gradients([&](const Args& a) { return model->forward(a[0]); }, {random_tensor({1, 1, 32, 32}, 9)});
}

TEST_CASE("pvt: the MLP's hidden layer in chunks of images gives each image's own logits and cotangents") {
  // pvt_v2_b1 at 224 pixels: stage 0's hidden layer is 6.4 MB an image, so a recorded batch
  // of 5 runs its MLPs as 4 images and 1 (and as single images without a graph). Each
  // image alone takes one call: the logits and cotangents (gradient and soft pullback) of
  // the batch must be theirs.
  ModelConfig c;
  c.arch = "pvt_v2_b1", c.depth = 1, c.num_classes = 10, c.image_size = 224;
  Generator gen(3);
  auto model = make_model(c, gen);
  model->train(false);
  const int64_t batch = 5;
  const Tensor x = random_tensor({batch, 3, 224, 224}, 13), u = random_tensor({batch, 10}, 14);
  Tensor fc1;
  for (const auto& [name, p] : model->named_parameters())
    if (name == "stages.0.blocks.0.mlp.fc1.weight") fc1 = p;
  REQUIRE(fc1.defined());
  Tensor xl = x.detach();
  xl.requires_grad_();
  const Tensor logits = model->forward(xl);
  const std::vector<Tensor> g = grad(logits, {xl, fc1}, u);
  Temperatures hot;
  hot.gelu = 0.5f, hot.attention = 2.0f;
  const Tensor soft = grad(logits, {xl}, u, Transport::soft_pullback(hot))[0];
  Tensor plain;
  {
    NoGrad off;
    plain = model->forward(x);
  }
  Tensor fc1_sum = Tensor::zeros(fc1.shape());
  for (int64_t i = 0; i < batch; ++i) {
    INFO("image ", i);
    Tensor xi = slice(x, 0, i, i + 1).contiguous().detach();
    xi.requires_grad_();
    const Tensor li = model->forward(xi);
    check_close(slice(logits, 0, i, i + 1), li, 1e-5, 1e-5, "logits");
    const std::vector<Tensor> gi = grad(li, {xi, fc1}, slice(u, 0, i, i + 1).contiguous());
    REQUIRE(max_abs(gi[0]) > 0);
    check_close(slice(g[0], 0, i, i + 1), gi[0], 1e-4, 1e-5 * max_abs(gi[0]), "input cotangent");
    fc1_sum = fc1_sum + gi[1];
    const Tensor soft_i = grad(li, {xi}, slice(u, 0, i, i + 1).contiguous(), Transport::soft_pullback(hot))[0];
    REQUIRE(max_abs(soft_i) > 0);
    check_close(slice(soft, 0, i, i + 1), soft_i, 1e-4, 1e-5 * max_abs(soft_i), "soft pullback's input cotangent");
    check_close(slice(plain, 0, i, i + 1), li, 1e-5, 1e-5, "logits without a graph");
  }
  REQUIRE(max_abs(fc1_sum) > 0);
  check_close(g[1], fc1_sum, 1e-4, 1e-5 * max_abs(fc1_sum), "fc1 weight cotangent");
}

TEST_CASE("pvt: blocks run from any point, are maps, and the facts name Grad-CAM's block and AdamW") {
  auto model = golden_pvt();
  std::vector<std::string> names;
  for (const Block& b : model->blocks()) names.push_back(b.name);
  CHECK(names == std::vector<std::string>{"patch_embed", "stages.0.blocks.0", "stages.0.blocks.1",
                                          "stages.1.downsample", "stages.1.blocks.0", "stages.1.blocks.1",
                                          "stages.2.downsample", "stages.2.blocks.0", "stages.2.blocks.1",
                                          "stages.3.downsample", "stages.3.blocks.0", "stages.3.blocks.1", "head"});
  NoGrad off;
  const Tensor x = golden("pvt", "input");
  const Tensor full = model->forward(x);
  for (size_t i = 0; i + 1 < model->num_blocks(); ++i) {
    const Tensor h = model->features(x, i);
    CHECK_MESSAGE(h.dim() == 4, model->blocks()[i].name);
    check_close(model->forward_from(h, i), full, 1e-6, 1e-6, cat("from block ", model->blocks()[i].name));
  }
  CHECK(model->features(x, model->block_index("stages.3.blocks.1")).shape() == Shape{2, 32, 2, 2});
  CHECK(model->facts().gradcam_block == "stages.3.blocks.1");
  CHECK(default_gradcam_block(*model, x.shape()) == "stages.3.blocks.1");
  CHECK(model->facts().default_optimizer == "adamw");
  CHECK_FALSE(model->facts().has_dropout);
}

TEST_CASE("pvt: variants, reduced configs and bad inputs") {
  Generator gen(2);
  ModelConfig c;
  c.arch = "pvt_v2_b1";
  c.num_classes = 1000;
  // timm's pvt_v2_b1 and b0 have 14.01M and 3.67M parameters (counted by gen_pvt.py's model).
  const auto parameters = [&](const ModelConfig& config) {
    int64_t n = 0;
    for (const auto& [name, p] : make_model(config, gen)->named_parameters()) n += p.numel();
    return n;
  };
  CHECK(parameters(c) == 14009000);
  c.arch = "pvt_v2_b0";
  CHECK(parameters(c) == 3666760);
  c.arch = "pvt_v2_b2", c.depth = 1;
  auto reduced = make_model(c, gen);
  CHECK(reduced->num_blocks() == 1 + 3 + 4 + 1);
  CHECK(ModelConfig::from_map(golden_config().to_map()).width == doctest::Approx(0.125));
  c.arch = "pvt_v2_b9";
  CHECK_THROWS_WITH_AS(make_model(c, gen), doctest::Contains("unknown PVT-v2 'pvt_v2_b9' (pvt_v2_b0, "), UsageError);
  c = golden_config(), c.width = -1;
  CHECK_THROWS_WITH_AS(make_model(c, gen), doctest::Contains("width multiplier must be positive"), UsageError);
  c = golden_config(), c.heads = 4;
  CHECK_THROWS_WITH_AS(make_model(c, gen), doctest::Contains("dim and heads are fixed per stage"), UsageError);
  auto model = golden_pvt();
  NoGrad off;
  CHECK_THROWS_WITH_AS(model->forward(Tensor::zeros({1, 1, 16, 16})),
                       doctest::Contains("4×4 map is smaller than its attention's reduction 8×8"), Error);
}

TEST_CASE("pvt: a few AdamW steps lower the loss on a two-class task") {
  ModelConfig c = golden_config();
  c.image_size = 32, c.depth = 1, c.num_classes = 2;
  Generator gen(11);
  auto model = make_model(c, gen);
  model->train(true);
  AdamW opt(model->named_parameters(), AdamWOptions{3e-3, 0.9, 0.999, 1e-8, 1e-4});
  const Batch batch = halves(16, 32, 21);
  std::vector<float> losses;
  for (int step = 0; step < 25; ++step) {
    opt.zero_grad();
    const Tensor loss = cross_entropy(model->forward(batch.inputs), batch.labels);
    losses.push_back(loss.item());
    backward(loss);
    opt.step();
  }
  INFO("losses: first ", losses.front(), ", last ", losses.back());
  CHECK(losses.back() < 0.5f * losses.front());
}

TEST_CASE("pvt: adjoint train, explain and stitch run on a tiny PVT-v2") {
  TempDir dir;
  Generator gen(7);
  for (const std::string split : {"train", "test"})
    for (const std::string cls : {"left", "right"}) {
      const std::filesystem::path folder = dir.path() / "images" / split / cls;
      std::filesystem::create_directories(folder);
      for (int i = 0; i < 4; ++i) {
        std::vector<uint8_t> pixels(32 * 32 * 3);
        for (size_t p = 0; p < pixels.size(); ++p)
          pixels[p] = uint8_t(((p / 3) % 32 < 16) == (cls == "left") ? 200 : 40 + int(randint(40, gen)));
        REQUIRE(stbi_write_png((folder / cat(i, ".png")).c_str(), 32, 32, 3, pixels.data(), 32 * 3) != 0);
      }
    }
  const std::string data = "images:" + (dir.path() / "images").string() + ":32";
  const CommandOutcome trained = run_adjoint({"train", "--model", "pvt_v2_b0", "--width", "0.125", "--depth", "1",
                                              "--data", data, "--batch", "4", "--epochs", "1", "--out", dir.file("run")});
  REQUIRE_MESSAGE(trained.code == 0, trained.err);
  const std::string checkpoint = dir.file("run/checkpoint.safetensors");
  const Checkpoint ck = load_checkpoint(checkpoint);
  CHECK(ck.config.arch == "pvt_v2_b0");
  CHECK(ck.metadata.at("train.optimizer") == "adamw");
  const CommandOutcome explained =
      run_adjoint({"explain", "--checkpoint", checkpoint, "--data", data, "--count", "2", "--methods",
                   "gradient,pullback,soft_pullback,gradcam", "--metrics", "none", "--out", dir.file("explain")});
  REQUIRE_MESSAGE(explained.code == 0, explained.err);
  CHECK(std::filesystem::exists(dir.file("explain/index.html")));

  // Its blocks' maps join a ResNet's both ways, as two CNNs' would.
  const CommandOutcome resnet = run_adjoint({"train", "--model", "resnet18", "--width", "0.0625", "--data", data,
                                             "--batch", "4", "--epochs", "1", "--out", dir.file("resnet")});
  REQUIRE_MESSAGE(resnet.code == 0, resnet.err);
  const CommandOutcome stitched = run_adjoint(
      {"stitch", "--front", checkpoint, "--end", dir.file("resnet/checkpoint.safetensors"), "--pairs",
       "stages.1.blocks.0:layer2.0,stages.3.blocks.0:layer4.0", "--train-images", "8", "--epochs", "1", "--batch", "4",
       "--objectives", "hlm", "--protocol", "standard", "--iri-images", "0", "--test-images", "8", "--out",
       dir.file("stitch")});
  REQUIRE_MESSAGE(stitched.code == 0, stitched.err);
  CHECK(std::filesystem::exists(dir.file("stitch/results.csv")));
  const CommandOutcome back = run_adjoint(
      {"stitch", "--front", dir.file("resnet/checkpoint.safetensors"), "--end", checkpoint, "--pairs",
       "layer2.1:stages.2.downsample", "--train-images", "8", "--epochs", "1", "--batch", "4", "--objectives", "hlm",
       "--protocol", "standard", "--iri-images", "0", "--test-images", "8", "--out", dir.file("stitch_back")});
  REQUIRE_MESSAGE(back.code == 0, back.err);
  CHECK(std::filesystem::exists(dir.file("stitch_back/results.csv")));
}
