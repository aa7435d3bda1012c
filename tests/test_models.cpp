// Models: logits against torchvision/timm-equivalent PyTorch modules loaded by name,
// running from any block, checkpoints and weight-file errors.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/io/json.h"
#include "engine/io/safetensors.h"
#include "models/checkpoint.h"
#include "models/layers.h"
#include "models/model.h"
#include "ops/activation.h"
#include "ops/matmul.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

// The same formula as tests/goldens/gen_models.py: every value is a function of the
// tensor's name and the element index, computed in exact integer arithmetic.
uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xCBF29CE484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001B3ull;
  return h;
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

Tensor formula_tensor(const std::string& name, const Shape& shape) {
  Tensor t = Tensor::empty(shape);
  const uint64_t h = fnv1a64(name);
  const int64_t n = t.numel();
  double scale = 1.0, shift = 0.0;
  if (ends_with(name, "num_batches_tracked")) scale = 0.0;
  else if (ends_with(name, "running_var")) scale = 0.4, shift = 1.0 + 0.2;  // 1 + 0.4 (v + 0.5)
  else if (ends_with(name, "running_mean") || ends_with(name, "bias")) scale = 0.1;
  else if (shape.size() == 1) scale = 0.2, shift = 1.0;
  else {
    int64_t fan_in = shape[0] ? n / shape[0] : 1;
    if (ends_with(name, "cls_token") || ends_with(name, "pos_embed")) fan_in = shape.back();
    scale = 2.0 * std::sqrt(3.0 / double(fan_in));
  }
  for (int64_t i = 0; i < n; ++i) {
    const uint64_t bits = (h + uint64_t(i) * 0x9E3779B97F4A7C15ull) >> 40;
    const double v = double(bits) / double(1 << 24) - 0.5;
    t.data()[i] = float(shift + scale * v);
  }
  return t;
}

// A state dict holding every name/shape PyTorch listed for `case_name`.
std::map<std::string, Tensor> formula_state_dict(const std::string& case_name) {
  const SafetensorsFile& f = fixture("models");
  Json names = parse_json(f.metadata.at(case_name));
  std::map<std::string, Tensor> out;
  for (const Json& entry : names.as_array()) {
    const std::string& name = entry.as_array()[0].as_string();
    Shape shape;
    for (const Json& d : entry.as_array()[1].as_array()) shape.push_back(d.as_int());
    out[name] = formula_tensor(name, shape);
  }
  return out;
}

ModelConfig config_for(const std::string& case_name) {
  ModelConfig c;
  c.num_classes = 10;
  if (case_name == "resnet18") c.arch = "resnet18", c.small_stem = false, c.in_channels = 3;
  if (case_name == "resnet18_small") c.arch = "resnet18", c.small_stem = true, c.in_channels = 1;
  if (case_name == "resnet50") c.arch = "resnet50", c.small_stem = false, c.in_channels = 3;
  if (case_name == "vgg11_bn_small") c.arch = "vgg11_bn", c.small_stem = true, c.in_channels = 1;
  if (case_name == "vit_custom")
    c.arch = "vit_custom", c.dim = 48, c.depth = 2, c.heads = 3, c.patch = 4, c.image_size = 16, c.in_channels = 3;
  if (case_name == "vit_custom_avg")
    c.arch = "vit_custom", c.dim = 48, c.depth = 2, c.heads = 3, c.patch = 4, c.image_size = 16, c.in_channels = 3,
    c.pool = "avg";
  return c;
}

std::shared_ptr<Model> golden_model(const std::string& case_name) {
  Generator gen(1);
  auto model = make_model(config_for(case_name), gen);
  load_state_dict(*model, formula_state_dict(case_name), case_name);
  model->train(false);
  return model;
}

}  // namespace

TEST_CASE("models: logits match PyTorch (torchvision/timm names, weights loaded by name)") {
  for (const char* name : {"resnet18", "resnet18_small", "resnet50", "vgg11_bn_small", "vit_custom", "vit_custom_avg"}) {
    CAPTURE(name);
    auto model = golden_model(name);
    NoGrad off;
    Tensor logits = model->forward(golden("models", std::string(name) + ".input"));
    Tensor expected = golden("models", std::string(name) + ".logits");
    double scale = 0;
    for (float v : expected.to_vector()) scale = std::max(scale, double(std::abs(v)));
    check_close(logits, expected, 1e-4, 1e-4 * scale, name);
  }
}

TEST_CASE("models: running from any block equals the whole forward") {
  for (const char* name : {"resnet18_small", "vit_custom", "vit_custom_avg"}) {
    auto model = golden_model(name);
    NoGrad off;
    Tensor x = golden("models", std::string(name) + ".input");
    Tensor full = model->forward(x);
    for (size_t i = 0; i < model->num_blocks(); ++i) {
      Tensor h = model->features(x, i);
      check_close(model->forward_from(h, i), full, 1e-6, 1e-6, cat(name, " from block ", model->blocks()[i].name));
    }
    CHECK(model->block_index(model->blocks()[1].name) == 1);
    CHECK_THROWS_WITH_AS(model->block_index("nope"), doctest::Contains("blocks: "), Error);
  }
}

TEST_CASE("models: a ViT's last block computed for the class token alone carries every transport as in full") {
  // forward() runs the last block and the head together (the block's with_next), computing
  // the class token's row alone; forward_from(features(last), last) runs them in turn, in
  // full. Every transport must bring the same cotangents to the input and the weights.
  auto model = golden_model("vit_custom");
  const size_t last = model->num_blocks() - 2;
  REQUIRE(model->blocks()[last].with_next);
  REQUIRE(!golden_model("vit_custom_avg")->blocks()[last].with_next);  // the mean reads every token
  std::vector<Tensor> wrt = {golden("models", "vit_custom.input").clone().requires_grad_()};
  for (auto& [name, p] : model->named_parameters()) wrt.push_back(p);
  const Tensor u = random_tensor({wrt[0].size(0), 10}, 71);
  Temperatures hot;
  hot.attention = 2.0f, hot.gelu = 0.5f;
  for (const Transport& t : {Transport::gradient(), Transport::pullback(), Transport::soft_pullback(hot)}) {
    INFO("transport ", to_string(t.kind));
    const Tensor fused = model->forward(wrt[0]);
    const Tensor in_turn = model->forward_from(model->features(wrt[0], last), last);
    check_close(fused, in_turn, 1e-6, 1e-6, "logits");
    const std::vector<Tensor> got = grad(fused, wrt, u, t), want = grad(in_turn, wrt, u, t);
    double moved = 0;
    for (size_t i = 0; i < wrt.size(); ++i) {
      check_close(got[i], want[i], 1e-5, 1e-6, i == 0 ? "input" : model->named_parameters()[i - 1].first);
      moved += max_abs(want[i]);
    }
    CHECK(moved > 0);
    CHECK(max_abs(got[0]) > 0);
  }
}

TEST_CASE("models: a row-wise function runs in chunks of rows at inference, whole when recording") {
  const Tensor x = random_tensor({3, 5, 4}, 81), w = random_tensor({6, 4}, 82), b = random_tensor({6}, 83),
               w2 = random_tensor({6, 6}, 85);
  int calls = 0, written_in_place = 0;
  // The MLP's shape: a last linear layer that may write the chunk's rows of the output itself.
  auto fn = [&](const Tensor& t, const Tensor& into) {
    ++calls;
    const Tensor y = linear(gelu(linear(t, w, b)), w2, {}, {}, into);
    if (into.defined() && y.data() == into.data()) ++written_in_place;
    return y;
  };
  // One that ignores `into`: its results are copied in.
  auto elsewhere = [&](const Tensor& t, const Tensor&) { return fn(t, {}); };
  Tensor whole, chunked, copied;
  {
    NoGrad off;
    whole = fn(x, {});
    calls = 0;
    chunked = rowwise_in_chunks(x, 4, 6, fn);  // 15 rows: 4 + 4 + 4 + 3
    CHECK(calls == 4);
    CHECK(written_in_place == 4);
    copied = rowwise_in_chunks(x, 4, 6, elsewhere);
    CHECK(written_in_place == 4);
    CHECK_THROWS_WITH_AS(rowwise_in_chunks(x, 4, 5, fn), doctest::Contains("linear: output destination"), Error);
  }
  CHECK(chunked.shape() == Shape{3, 5, 6});
  check_close(chunked, whole, 1e-7, 1e-7, "chunked");
  CHECK(copied.to_vector() == chunked.to_vector());
  calls = 0;
  const Tensor leaf = x.clone().requires_grad_();
  const Tensor recorded = rowwise_in_chunks(leaf, 4, 6, fn);
  CHECK(calls == 1);
  CHECK(max_abs(grad(recorded, {leaf}, random_tensor({3, 5, 6}, 84))[0]) > 0);
}

TEST_CASE("models: a ViT's pool option picks timm's head, survives the checkpoint config and is validated") {
  ModelConfig c = config_for("vit_custom_avg");
  CHECK(ModelConfig::from_map(c.to_map()).pool == "avg");
  Generator gen(1);
  const auto names = make_model(c, gen)->state_dict();
  CHECK(names.count("fc_norm.weight") == 1);
  CHECK(names.count("norm.weight") == 0);
  c.pool = "max";
  CHECK_THROWS_WITH_AS(make_model(c, gen), doctest::Contains("pool must be token or avg, got 'max'"), UsageError);
}

TEST_CASE("models: mismatched weight files list every bad name") {
  auto sd = formula_state_dict("resnet18_small");
  sd.erase("layer1.0.conv1.weight");
  sd["layer9.weight"] = Tensor::zeros({1});
  sd["fc.weight"] = Tensor::zeros({3, 3});
  Generator gen(1);
  auto model = make_model(config_for("resnet18_small"), gen);
  try {
    load_state_dict(*model, sd, "weights.safetensors");
    FAIL("expected an error");
  } catch (const Error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("weights.safetensors") != std::string::npos);
    CHECK(msg.find("missing: layer1.0.conv1.weight") != std::string::npos);
    CHECK(msg.find("unexpected: layer9.weight") != std::string::npos);
    CHECK(msg.find("fc.weight [3, 3] vs model [10, 512]") != std::string::npos);
  }
  // Old exports without num_batches_tracked load, as in PyTorch.
  auto old = formula_state_dict("resnet18_small");
  for (auto it = old.begin(); it != old.end();) it = ends_with(it->first, "num_batches_tracked") ? old.erase(it) : ++it;
  CHECK_NOTHROW(load_state_dict(*model, old, "old export"));
}

TEST_CASE("models: int64 and half-precision tensors in a weight file load as PyTorch would") {
  // A BatchNorm state dict as a real export stores it: F16 weight, BF16 bias, F32
  // statistics and an I64 num_batches_tracked, written byte by byte.
  const std::string header =
      R"({"bias":{"dtype":"BF16","shape":[2],"data_offsets":[4,8]},)"
      R"("num_batches_tracked":{"dtype":"I64","shape":[],"data_offsets":[24,32]},)"
      R"("running_mean":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
      R"("running_var":{"dtype":"F32","shape":[2],"data_offsets":[16,24]},)"
      R"("weight":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}})";
  std::string bytes(8, '\0');
  for (int b = 0; b < 8; ++b) bytes[size_t(b)] = char((header.size() >> (8 * b)) & 0xff);
  bytes += header;
  const unsigned char data[32] = {0x00, 0x3E, 0x00, 0xC0,  // F16 1.5, -2
                                  0x00, 0x3F, 0x80, 0x3E,  // BF16 0.5, 0.25
                                  0, 0, 0x80, 0x3F, 0, 0, 0, 0x40,         // F32 1, 2
                                  0, 0, 0x40, 0x40, 0, 0, 0x80, 0x40,      // F32 3, 4
                                  7, 0, 0, 0, 0, 0, 0, 0};                 // I64 7
  bytes.append(reinterpret_cast<const char*>(data), sizeof data);
  TempDir dir;
  const std::string path = dir.file("bn_export.safetensors");
  std::ofstream(path, std::ios::binary) << bytes;
  SafetensorsFile file = read_safetensors(path);
  CHECK(file.dtypes.at("num_batches_tracked") == "I64");
  struct Bn : Module {
    Bn() {
      register_parameter("weight", Tensor::ones({2}));
      register_parameter("bias", Tensor::zeros({2}));
      register_buffer("running_mean", Tensor::zeros({2}));
      register_buffer("running_var", Tensor::ones({2}));
      register_buffer("num_batches_tracked", Tensor::zeros({}));
    }
  } bn;
  load_state_dict(bn, file.tensors, path);
  auto sd = bn.state_dict();
  CHECK(sd.at("weight").to_vector() == std::vector<float>{1.5f, -2.0f});
  CHECK(sd.at("bias").to_vector() == std::vector<float>{0.5f, 0.25f});
  CHECK(sd.at("running_var").to_vector() == std::vector<float>{3.0f, 4.0f});
  CHECK(sd.at("num_batches_tracked").item() == 7.0f);
}

TEST_CASE("models: checkpoints round-trip and corrupted ones are refused") {
  ModelConfig c = config_for("resnet18_small");
  c.width = 0.125;
  Generator gen(3);
  auto model = make_model(c, gen);
  TempDir dir;
  const std::string path = dir.file("ckpt.safetensors");
  save_checkpoint(path, *model, nullptr, 2, 17, {{"note", "test"}});
  Checkpoint ck = load_checkpoint(path);
  CHECK(ck.epoch == 2);
  CHECK(ck.step == 17);
  CHECK(ck.config.arch == "resnet18");
  CHECK(ck.config.width == doctest::Approx(0.125));
  auto again = model_from_checkpoint(ck);
  for (auto& [name, t] : model->state_dict()) CHECK(again->state_dict().at(name).to_vector() == t.to_vector());

  // Truncated file.
  auto size = std::filesystem::file_size(path);
  std::filesystem::resize_file(path, size / 2);
  CHECK_THROWS_WITH_AS(load_checkpoint(path), doctest::Contains(path.c_str()), Error);
  // A plain weights file is not a checkpoint.
  write_safetensors(path, model->state_dict());
  CHECK_THROWS_WITH_AS(load_checkpoint(path), doctest::Contains("not an adjoint checkpoint"), Error);
}
