// PyTorch's own weight files (torch.save's zip archive) read by the restricted unpickler:
// torchvision's ResNet-18, ResNet-50, VGG-11-BN and ViT-B/16 layouts give PyTorch's logits,
// the reader's variants (float16/bfloat16, strided views, nested dicts, "module." names,
// deflate, big-endian, zip64) read the same weights, and tampered files are refused in one
// line. Files and logits come from tests/goldens/gen_pth.py.
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <fstream>

#include "engine/error.h"
#include "engine/io/safetensors.h"
#include "engine/io/state_dict_file.h"
#include "engine/io/torch_pickle.h"
#include "engine/io/zip_archive.h"
#include "engine/threads.h"
#include "models/weights_file.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;
namespace fs = std::filesystem;

namespace {

std::string pth(const std::string& name) { return std::string(ADJOINT_SOURCE_DIR) + "/tests/goldens/pth/" + name; }

// The engine's configuration of each narrow torchvision model gen_pth.py saves.
ModelConfig torchvision_config(const std::string& name) {
  ModelConfig c;
  c.num_classes = 10, c.in_channels = 3, c.image_size = 32, c.small_stem = false;
  if (name == "resnet18") c.arch = "resnet18", c.width = 1.0 / 16;
  else if (name == "resnet50") c.arch = "resnet50", c.width = 1.0 / 16;
  else if (name == "vgg11_bn") c.arch = "vgg11_bn", c.width = 1.0 / 32;
  else if (name == "vit_b_16") c.arch = "vit_b_16", c.dim = 32, c.depth = 2, c.heads = 2, c.mlp_ratio = 2;
  else FAIL("no configuration for ", name);
  return c;
}

// The logits of model `name` (its configuration) with the weights of `file`, on the input
// gen_pth.py gave PyTorch.
Tensor logits_from(const std::string& name, const std::string& file, const std::string& key = "") {
  Generator gen(1);
  auto model = make_model(torchvision_config(name), gen);
  load_weights_file(*model, pth(file), key);
  model->train(false);
  return model->forward(golden("pth", name + ".input"));
}

// Within 1e-4 of PyTorch's logits, relative to their largest magnitude.
void check_logits(const Tensor& actual, const std::string& expected_name, const std::string& what) {
  const Tensor expected = golden("pth", expected_name);
  REQUIRE(max_abs(expected) > 0.1);
  check_close(actual, expected, 1e-4, 1e-4 * max_abs(expected), what);
}

void check_fails(const CommandOutcome& o, int code, const std::string& message) {
  CAPTURE(o.out);
  CAPTURE(o.err);
  CHECK(o.code == code);
  CHECK(contains(o.err, message));
  // One line.
  CHECK(std::count(o.err.begin(), o.err.end(), '\n') == 1);
}

}  // namespace

TEST_CASE("torch weights: torchvision's resnet18, resnet50, vgg11_bn and vit_b_16 give PyTorch's logits") {
  for (const std::string name : {"resnet18", "resnet50", "vgg11_bn", "vit_b_16"}) {
    CAPTURE(name);
    check_logits(logits_from(name, name + ".pth"), name + ".logits", name);
  }
}

TEST_CASE("torch weights: the stored dtypes, the BatchNorm counters and the views as saved") {
  const SafetensorsFile mixed = read_state_dict(pth("resnet18_mixed.pth"));
  // gen_pth.py alternates float16 and bfloat16 through the state dict (the transposed fc and
  // the offset conv1 are float32 views); num_batches_tracked stays int64.
  CHECK(mixed.dtypes.at("conv1.weight") == "F32");
  CHECK(mixed.dtypes.at("fc.weight") == "F32");
  CHECK(mixed.dtypes.at("bn1.weight") == "BF16");
  CHECK(mixed.dtypes.at("bn1.bias") == "F16");
  CHECK(mixed.dtypes.at("bn1.num_batches_tracked") == "I64");
  const SafetensorsFile plain = read_state_dict(pth("resnet18.pth"));
  CHECK(plain.dtypes.at("layer1.0.bn1.num_batches_tracked") == "I64");
  CHECK(plain.tensors.at("layer1.0.bn1.num_batches_tracked").data()[0] >= 1.0f);
  CHECK(plain.tensors.size() == mixed.tensors.size());
  // The transposed view and the view at an offset hold the same values as the plain file's.
  check_close(mixed.tensors.at("fc.weight"), plain.tensors.at("fc.weight"), 1e-2, 1e-3, "fc.weight (strided view)");
  check_close(mixed.tensors.at("conv1.weight"), plain.tensors.at("conv1.weight"), 1e-2, 1e-3, "conv1.weight (offset)");

  // The logits of the weights as rounded to float16 and bfloat16.
  check_logits(logits_from("resnet18", "resnet18_mixed.pth"), "resnet18_mixed.logits", "float16/bfloat16");
}

TEST_CASE("torch weights: a state dict nested under a key, saved as parameters under module.") {
  check_logits(logits_from("resnet18", "resnet18_nested.pth", "model"), "resnet18.logits", "--weights-key model");
  const SafetensorsFile nested = read_state_dict(pth("resnet18_nested.pth"), "model");
  CHECK(nested.tensors.count("fc.weight") == 1);  // "module." dropped
  CHECK_THROWS_WITH_AS(read_state_dict(pth("resnet18_nested.pth")),
                       doctest::Contains("entry 'epoch' is an int, not a tensor: the file holds a dict beside its state "
                                         "dict (keys: epoch, lr, model, note); name the entry holding the state dict "
                                         "with --weights-key"),
                       Error);
  CHECK_THROWS_WITH_AS(read_state_dict(pth("resnet18_nested.pth"), "state_dict"),
                       doctest::Contains("no key 'state_dict' in the saved dict (its keys: epoch, lr, model, note)"),
                       Error);
  CHECK_THROWS_WITH_AS(read_state_dict(pth("resnet18_nested.pth"), "note"),
                       doctest::Contains("entry 'note' is a str, not a state dict"), Error);
}

TEST_CASE("torch weights: deflated entries, a big-endian file and zip64 records read the same weights") {
  for (const std::string file : {"vit_b_16_deflated.pth", "vit_b_16_big_endian.pth", "vit_b_16_zip64.pth"}) {
    CAPTURE(file);
    check_logits(logits_from("vit_b_16", file), "vit_b_16.logits", file);
  }
}

TEST_CASE("torch weights: --model vit_b_16 --weights FILE through predict, and torchvision's names mapped") {
  TempDir dir;
  write_safetensors(dir.file("x.safetensors"), {{"x", golden("pth", "vit_b_16.input")}});
  const CommandOutcome o = run_adjoint({"predict", "--model", "vit_b_16", "--dim", "32", "--depth", "2", "--heads", "2",
                                        "--mlp-ratio", "2", "--classes", "10", "--image-size", "32", "--weights",
                                        pth("vit_b_16.pth"), "--input", dir.file("x.safetensors"), "--out",
                                        dir.file("p")});
  CAPTURE(o.err);
  REQUIRE(o.code == 0);
  check_logits(read_safetensors(dir.file("p.safetensors")).tensors.at("logits"), "vit_b_16.logits", "predict");

  // The rules rename every torchvision name, the legacy MLP names too.
  Generator gen(1);
  auto vit = make_model(torchvision_config("vit_b_16"), gen);
  std::map<std::string, Tensor> named;
  for (const std::string name : {"conv_proj.weight", "class_token", "encoder.pos_embedding",
                                 "encoder.layers.encoder_layer_1.self_attention.in_proj_weight",
                                 "encoder.layers.encoder_layer_1.mlp.linear_2.bias", "encoder.ln.weight", "heads.head.bias"})
    named[name] = Tensor::zeros({1});
  std::vector<std::string> renamed;
  for (const auto& [name, t] : rename_weights(named, vit->facts().weight_file_names, "test")) renamed.push_back(name);
  CHECK(renamed == std::vector<std::string>{"blocks.1.attn.qkv.weight", "blocks.1.mlp.fc2.bias", "cls_token", "head.bias",
                                            "norm.weight", "patch_embed.proj.weight", "pos_embed"});
}

TEST_CASE("torch weights: tampered and unsupported files are refused in one line, exit 1") {
  TempDir dir;
  write_safetensors(dir.file("x.safetensors"), {{"x", golden("pth", "vit_b_16.input")}});
  const auto run = [&](const std::string& command, const std::string& file) {
    std::vector<std::string> words = {command, "--model", "vit_b_16", "--dim", "32", "--depth", "2", "--heads", "2",
                                      "--mlp-ratio", "2", "--classes", "10", "--image-size", "32", "--weights", file,
                                      "--input", dir.file("x.safetensors")};
    if (command == "predict") words.insert(words.end(), {"--out", dir.file("p")});
    return run_adjoint(words);
  };

  // A truncated archive: the vit's first half.
  const std::string whole = read_text(pth("vit_b_16.pth"));
  REQUIRE(whole.size() > 1000);
  {
    std::ofstream(dir.file("truncated.pth"), std::ios::binary) << whole.substr(0, whole.size() / 2);
  }
  for (const std::string command : {"predict", "explain"}) {
    CAPTURE(command);
    check_fails(run(command, pth("os_system.pth")), 1, "refuses the global 'os.system'");
    check_fails(run(command, pth("module.pth")), 1,
                "holds a pickled object of class torch.nn.modules.linear.Linear, not a state dict (a whole model "
                "saved with torch.save(model)?); save model.state_dict() instead");
    check_fails(run(command, pth("torchscript.pth")), 1,
                "is a TorchScript archive (torch.jit.save), not a state dict; save model.state_dict()");
    check_fails(run(command, pth("short_storage.pth")), 1,
                "tensor 'w': storage '0' holds 32 bytes, fewer than its 16 elements of F32 need");
    check_fails(run(command, dir.file("truncated.pth")), 1,
                "zip archive " + dir.file("truncated.pth") + ": no end of central directory record");
    check_fails(run(command, pth("legacy.pth")), 1, "written in PyTorch's legacy format (before 1.6)");
    check_fails(run(command, pth("view_beyond_storage.pth")), 1,
                "tensor 'w': size [4, 4], stride [5, 1] and offset 0 reach element 18 of storage '0', which holds 16");
    check_fails(run(command, pth("expanded.pth")), 1,
                "tensor 'w': size [1000, 3] has 3000 elements, more than the 3 its storage '0' holds");
  }
  CHECK(!fs::exists(dir.file("p.safetensors")));
}

TEST_CASE("torch weights: a storage whose bytes fail their CRC-32 is refused in one line before anything is written") {
  // The ViT's largest storage with one byte changed in the middle of its data.
  std::string bytes = read_text(pth("vit_b_16.pth"));
  const ZipArchive archive(pth("vit_b_16.pth"));
  const ZipArchive::Entry* largest = nullptr;
  for (const ZipArchive::Entry& e : archive.entries())
    if (e.name.find("/data/") != std::string::npos && (largest == nullptr || e.size > largest->size)) largest = &e;
  REQUIRE(largest != nullptr);
  REQUIRE(largest->method == 0);
  const auto u16 = [&](size_t at) { return size_t(uint8_t(bytes[at])) | size_t(uint8_t(bytes[at + 1])) << 8; };
  const size_t data_at = largest->local_header_offset + 30 + u16(largest->local_header_offset + 26) +
                         u16(largest->local_header_offset + 28);
  bytes[data_at + largest->size / 2] ^= 0x01;
  TempDir dir;
  {
    std::ofstream(dir.file("damaged.pth"), std::ios::binary) << bytes;
  }
  write_safetensors(dir.file("x.safetensors"), {{"x", golden("pth", "vit_b_16.input")}});
  for (const std::string command : {"predict", "explain"}) {
    CAPTURE(command);
    const std::string out = dir.file(command + "_out");
    const CommandOutcome o = run_adjoint({command, "--model", "vit_b_16", "--dim", "32", "--depth", "2", "--heads", "2",
                                          "--mlp-ratio", "2", "--classes", "10", "--image-size", "32", "--weights",
                                          dir.file("damaged.pth"), "--input", dir.file("x.safetensors"), "--out", out});
    check_fails(o, 1, cat("zip archive ", dir.file("damaged.pth"), ": entry '", largest->name, "': CRC-32 mismatch"));
    CHECK(!fs::exists(out));                     // explain's folder
    CHECK(!fs::exists(out + ".safetensors"));    // predict's file
  }
}

TEST_CASE("torch weights: read straight into the model, two damaged storages name the first tensor's at any thread count") {
  // The ViT's two largest storages damaged: loading reads the tensors in parallel, yet the
  // error is always the same one, that of the first damaged tensor in the model's name order.
  std::string bytes = read_text(pth("vit_b_16.pth"));
  const ZipArchive archive(pth("vit_b_16.pth"));
  std::vector<const ZipArchive::Entry*> storages;
  for (const ZipArchive::Entry& e : archive.entries())
    if (e.name.find("/data/") != std::string::npos) storages.push_back(&e);
  std::sort(storages.begin(), storages.end(), [](auto* a, auto* b) { return a->size > b->size; });
  REQUIRE(storages.size() > 2);
  const auto u16 = [&](size_t at) { return size_t(uint8_t(bytes[at])) | size_t(uint8_t(bytes[at + 1])) << 8; };
  for (int k = 0; k < 2; ++k) {
    const ZipArchive::Entry& e = *storages[size_t(k)];
    bytes[e.local_header_offset + 30 + u16(e.local_header_offset + 26) + u16(e.local_header_offset + 28) + 5] ^= 0x40;
  }
  TempDir dir;
  {
    std::ofstream(dir.file("damaged.pth"), std::ios::binary) << bytes;
  }
  const int threads_before = num_threads();
  std::set<std::string> messages;
  for (int threads : {1, 2}) {
    set_num_threads(threads);
    for (int repeat = 0; repeat < 3; ++repeat) {
      Generator gen(1);
      auto model = make_model(torchvision_config("vit_b_16"), gen);
      try {
        load_weights_file(*model, dir.file("damaged.pth"));
        messages.insert("(loaded)");
      } catch (const Error& e) {
        messages.insert(e.what());
      }
    }
  }
  set_num_threads(threads_before);
  REQUIRE(messages.size() == 1);
  const std::string message = *messages.begin();
  CHECK(contains(message, "CRC-32 mismatch"));
  CHECK((contains(message, "'" + storages[0]->name + "'") || contains(message, "'" + storages[1]->name + "'")));
  // Undamaged, the model holds the file's tensors exactly, as read whole.
  Generator gen(1);
  auto model = make_model(torchvision_config("vit_b_16"), gen);
  load_weights_file(*model, pth("vit_b_16.pth"));
  const std::map<std::string, Tensor> whole =
      rename_weights(read_state_dict(pth("vit_b_16.pth")).tensors, model->facts().weight_file_names, "test");
  const std::map<std::string, Tensor> own = model->state_dict();
  int64_t compared = 0;
  for (const auto& [name, t] : own)
    if (whole.count(name)) check_close(t, whole.at(name), 0, 0, name), ++compared;
  CHECK(compared == int64_t(own.size()));
}

TEST_CASE("torch weights: --weights-key in a safetensors file takes the tensors under KEY.") {
  TempDir dir;
  const Tensor w = random_tensor({2, 3}, 5);
  write_safetensors(dir.file("ck.safetensors"),
                    {{"model.module.fc.weight", w}, {"optim.fc.weight", random_tensor({2, 3}, 6)}});
  const SafetensorsFile file = read_state_dict(dir.file("ck.safetensors"), "model");
  REQUIRE(file.tensors.size() == 1);
  check_close(file.tensors.at("fc.weight"), w, 0, 0, "model.module.fc.weight");  // both prefixes dropped
  CHECK_THROWS_WITH_AS(read_state_dict(dir.file("ck.safetensors"), "ema"),
                       doctest::Contains("none of its 2 tensors is named 'ema.*' (--weights-key ema)"), Error);
}

TEST_CASE("torch weights: vit_b_32 and vit_l_16 take torchvision's patch sizes whatever --patch says") {
  for (const auto& [arch, patch] : {std::pair<std::string, int64_t>{"vit_b_32", 32}, {"vit_l_16", 16}}) {
    ModelConfig c;
    c.arch = arch, c.dim = 8, c.depth = 1, c.heads = 2, c.patch = 4, c.image_size = 64, c.num_classes = 3;
    Generator gen(2);
    auto model = make_model(c, gen);
    CHECK(model->config().patch == patch);
    CHECK(model->state_dict().at("pos_embed").shape() == Shape{1, (64 / patch) * (64 / patch) + 1, 8});
    CHECK(model->forward(random_tensor({1, 3, 64, 64}, 3)).shape() == Shape{1, 3});
    CHECK(!model->facts().weight_file_names.empty());
  }
}
