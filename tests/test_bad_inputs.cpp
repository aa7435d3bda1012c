// Bad inputs a new user might give the command line, each refused with one line that
// names the option or the file at fault (exit 2 for a bad option, 1 for a bad file),
// and no half-written output left behind. The commands run in this process through
// run_adjoint (tests/support.h).
#include <doctest/doctest.h>
#include <stb/stb_image_write.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/data/image_folder.h"
#include "engine/data/open.h"
#include "engine/error.h"
#include "engine/io/json.h"
#include "engine/random.h"
#include "engine/io/safetensors.h"
#include "models/checkpoint.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;
namespace fs = std::filesystem;

namespace {

// A bilinear MLP for modular addition mod 5: inputs of 10 values, 5 classes.
ModelConfig tiny_config() {
  ModelConfig c;
  c.arch = "bilinear_mlp";
  c.hidden = 4;
  c.num_classes = 5;
  c.in_features = 10;
  return c;
}

std::string save_tiny_checkpoint(const TempDir& dir, const std::string& name = "ck.safetensors") {
  Generator gen(0);
  auto model = make_model(tiny_config(), gen);
  const std::string path = dir.file(name);
  save_checkpoint(path, *model, nullptr, 1, 3, {{"data.spec", "modadd:5"}});
  return path;
}

// Rewrites a safetensors file with one metadata value or one tensor changed.
void edit_file(const std::string& path, const std::string& key, const std::string& value) {
  SafetensorsFile f = read_safetensors(path);
  f.metadata[key] = value;
  write_safetensors(path, f.tensors, f.metadata);
}

// A one-tensor safetensors file of any dtype, written byte by byte.
void write_raw_tensor(const std::string& path, const std::string& name, const std::string& dtype, const Shape& shape,
                      const std::vector<uint8_t>& data) {
  Json dims = Json::array();
  for (int64_t d : shape) dims.push_back(d);
  Json header = Json::object();
  header[name] = Json(Json::Object{{"dtype", dtype}, {"shape", dims}, {"data_offsets", Json::Array{0, data.size()}}});
  const std::string text = to_json(header);
  const uint64_t length = text.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&length), 8);
  out << text;
  out.write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
}

void check_fails(const CommandOutcome& o, int code, const std::string& message) {
  CAPTURE(o.out);
  CAPTURE(o.err);
  CHECK(o.code == code);
  CHECK(contains(o.err, message));
}

}  // namespace

TEST_CASE("bad inputs: NaN weights are refused by predict, eval and explain, naming file and tensor") {
  TempDir dir;
  const std::string ck = save_tiny_checkpoint(dir);
  SafetensorsFile f = read_safetensors(ck);
  Tensor head = f.tensors.at("model.head.weight").clone();
  head.data()[2] = NAN;
  f.tensors["model.head.weight"] = head;
  f.metadata.erase("tensors.crc32");  // as a file from before checksums: the finite check is what is tested
  write_safetensors(ck, f.tensors, f.metadata);
  write_safetensors(dir.file("x.safetensors"), {{"x", Tensor::zeros({2, 10})}});

  const std::string why = "tensor 'head.weight' holds 1 NaN or infinite value of 20";
  check_fails(run_adjoint({"predict", "--checkpoint", ck, "--input", dir.file("x.safetensors"), "--out",
                           dir.file("p")}),
              1, "adjoint: error: loading checkpoint " + ck + " (bilinear_mlp): " + why);
  check_fails(run_adjoint({"eval", "--checkpoint", ck}), 1, why);
  check_fails(run_adjoint({"explain", "--checkpoint", ck, "--input", dir.file("x.safetensors")}), 1, why);
  CHECK(!fs::exists(dir.file("p.safetensors")));

  // A plain weights file the same way.
  std::map<std::string, Tensor> weights;
  for (const auto& [name, t] : f.tensors) weights[name.substr(6)] = t;
  weights["head.weight"].data()[0] = INFINITY;
  write_safetensors(dir.file("w.safetensors"), weights);
  check_fails(run_adjoint({"predict", "--model", "bilinear_mlp", "--hidden", "4", "--classes", "5", "--in-channels",
                           "10", "--image-size", "1", "--weights", dir.file("w.safetensors"), "--input",
                           dir.file("x.safetensors")}),
              1, "loading " + dir.file("w.safetensors") + ": tensor 'head.weight' holds 2 NaN or infinite values");
}

TEST_CASE("bad inputs: integer and boolean tensors are refused as weights or inputs, naming dtype and tensor") {
  TempDir dir;
  const std::string ck = save_tiny_checkpoint(dir);
  write_raw_tensor(dir.file("u8.safetensors"), "pixels", "U8", {2, 10}, std::vector<uint8_t>(20, 7));
  check_fails(run_adjoint({"predict", "--checkpoint", ck, "--input", dir.file("u8.safetensors")}), 1,
              "u8.safetensors: tensor 'pixels' has dtype U8, expected floating point");
  write_raw_tensor(dir.file("b.safetensors"), "mask", "BOOL", {2, 10}, std::vector<uint8_t>(20, 1));
  check_fails(run_adjoint({"predict", "--checkpoint", ck, "--input", dir.file("b.safetensors")}), 1,
              "tensor 'mask' has dtype BOOL");
  // An I64 weight (not BatchNorm's counter, which torch stores as I64 and is accepted).
  write_raw_tensor(dir.file("w.safetensors"), "head.weight", "I64", {5, 4}, std::vector<uint8_t>(160, 0));
  check_fails(run_adjoint({"predict", "--model", "bilinear_mlp", "--hidden", "4", "--classes", "5", "--in-channels",
                           "10", "--image-size", "1", "--weights", dir.file("w.safetensors"), "--input",
                           dir.file("u8.safetensors")}),
              1, "w.safetensors: tensor 'head.weight' has dtype I64");
}

TEST_CASE("bad inputs: options out of range are usage errors naming the option") {
  TempDir dir;
  const std::string ck = save_tiny_checkpoint(dir);
  check_fails(run_adjoint({"eval", "--checkpoint", ck, "--limit", "-5"}), 2, "option --limit must be 0 (all)");
  check_fails(run_adjoint({"eval", "--checkpoint", ck, "--batch", "0"}), 2, "option --batch must be at least 1");
  check_fails(run_adjoint({"explain", "--checkpoint", ck, "--image", ","}), 2,
              "option --image expects a comma-separated list, got ','");
  stbi_write_png(dir.file("a.png").c_str(), 2, 2, 1, std::vector<uint8_t>(4, 9).data(), 2);
  check_fails(run_adjoint({"predict", "--checkpoint", ck, "--std", "0", dir.file("a.png")}), 2,
              "option --std value 0 is not a positive number");
  check_fails(run_adjoint({"predict", "--checkpoint", ck, "--mean", "nan", dir.file("a.png")}), 2,
              "option --mean value nan is not a finite number");
  for (const auto& [option, value] : std::vector<std::pair<std::string, std::string>>{
           {"lr", "nan"}, {"lr", "inf"}, {"lr", "-0.1"}, {"momentum", "nan"}, {"weight-decay", "nan"},
           {"label-smoothing", "2"}})
    check_fails(run_adjoint({"train", "--data", "modadd:5", "--model", "bilinear_mlp", "--" + option, value, "--out",
                             dir.file("run")}),
                2, "option --" + option + " must be a finite number");
  CHECK(!fs::exists(dir.file("run")));
  check_fails(run_adjoint({"train", "--data", "modadd:99999999999", "--model", "bilinear_mlp"}), 1,
              "modulus must be between 2 and 4096, got 99999999999");
  check_fails(run_adjoint({"train", "--data", "text:" + dir.path().string(), "--model", "bilinear_lm"}), 1,
              dir.path().string() + ": is a directory, not a file");
}

TEST_CASE("bad inputs: a checkpoint's bad metadata is an error naming the file and the key, not an option") {
  TempDir dir;
  const std::string ck = save_tiny_checkpoint(dir);
  edit_file(ck, "config.arch", "frobnet");
  check_fails(run_adjoint({"info", ck}), 1,
              "adjoint: error: checkpoint " + ck + ": metadata config.*: unknown model 'frobnet'");
  save_tiny_checkpoint(dir);
  edit_file(ck, "config.num_classes", "-5");
  check_fails(run_adjoint({"eval", "--checkpoint", ck}), 1,
              "checkpoint " + ck + ": metadata config.*: model config: 'num_classes' must be positive, got -5");
  save_tiny_checkpoint(dir);
  edit_file(ck, "config.hidden", "many");
  check_fails(run_adjoint({"eval", "--checkpoint", ck}), 1,
              "checkpoint " + ck + ": metadata: model config: 'hidden' must be an integer");
  save_tiny_checkpoint(dir);
  edit_file(ck, "data.spec", "nosuchdata");
  check_fails(run_adjoint({"eval", "--checkpoint", ck}), 1,
              "checkpoint " + ck + ": metadata data.spec: --data nosuchdata: unknown data set");
  save_tiny_checkpoint(dir);
  edit_file(ck, "data.std", "0");
  stbi_write_png(dir.file("a.png").c_str(), 2, 2, 1, std::vector<uint8_t>(4, 9).data(), 2);
  check_fails(run_adjoint({"predict", "--checkpoint", ck, dir.file("a.png")}), 1,
              "checkpoint " + ck + ": metadata data.std value 0 is not a positive number");
}

TEST_CASE("bad inputs: a model fed the wrong input shape names the model and what it expects") {
  TempDir dir;
  const std::string ck = save_tiny_checkpoint(dir);
  write_safetensors(dir.file("x.safetensors"), {{"x", Tensor::zeros({2, 7})}});
  check_fails(run_adjoint({"predict", "--checkpoint", ck, "--input", dir.file("x.safetensors")}), 1,
              "x.safetensors: inputs of shape [2, 7] do not fit the model bilinear_mlp (checkpoint " + ck +
                  "), which expects N examples of 10 values");
}

TEST_CASE("bad inputs: predict that cannot write its .csv leaves no .safetensors either") {
  TempDir dir;
  const std::string ck = save_tiny_checkpoint(dir);
  write_safetensors(dir.file("x.safetensors"), {{"x", Tensor::zeros({2, 10})}});
  fs::create_directories(dir.file("p.csv"));  // the .csv cannot replace a folder
  const std::vector<std::string> predict = {"predict", "--checkpoint", ck, "--input", dir.file("x.safetensors"),
                                            "--out", dir.file("p")};
  const CommandOutcome o = run_adjoint(predict);
  check_fails(o, 1, "p.csv");
  CHECK(!fs::exists(dir.file("p.safetensors")));
  for (const auto& entry : fs::directory_iterator(dir.path()))  // no temporary file is left
    CHECK(entry.path().filename().string().find(".tmp") == std::string::npos);
  fs::remove(dir.file("p.csv"));
  const CommandOutcome ok = run_adjoint(predict);
  CHECK(ok.code == 0);
  CHECK(fs::exists(dir.file("p.safetensors")));
  CHECK(fs::exists(dir.file("p.csv")));
}

namespace {

std::vector<uint8_t> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<uint8_t>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void put_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
}

void put_big_endian(std::vector<uint8_t>& bytes, size_t at, uint32_t value) {
  for (int i = 0; i < 4; ++i) bytes[at + size_t(i)] = uint8_t(value >> (24 - 8 * i));
}

std::string decode_error(const std::string& path) {
  std::vector<float> out(3 * 4 * 4);
  try {
    load_image(path, 3, 4, 4, out.data());
  } catch (const Error& e) {
    return e.what();
  }
  return "(decoded)";
}

}  // namespace

TEST_CASE("bad inputs: damaged PNGs are refused (CRC, zlib checksum), errors name the format and a missing file") {
  TempDir dir;
  std::vector<uint8_t> pixels(4 * 4 * 3);
  for (size_t i = 0; i < pixels.size(); ++i) pixels[i] = uint8_t(i * 7);
  const std::string good = dir.file("good.png");
  REQUIRE(stbi_write_png(good.c_str(), 4, 4, 3, pixels.data(), 4 * 3) != 0);
  CHECK(decode_error(good) == "(decoded)");
  const std::vector<uint8_t> png = file_bytes(good);

  // The last byte is IEND's CRC: stb alone decodes this file without a word.
  std::vector<uint8_t> bad_crc = png;
  bad_crc.back() ^= 1;
  put_bytes(dir.file("crc.png"), bad_crc);
  CHECK(decode_error(dir.file("crc.png")) == dir.file("crc.png") + ": damaged PNG: chunk 'IEND' at byte " +
                                                 std::to_string(png.size() - 12) + " fails its CRC check");

  // IDAT follows IHDR (8 + 25 bytes): break its zlib stream's Adler-32 (the last 4 data
  // bytes) and give the chunk a correct CRC, so that only zlib's check can tell.
  std::vector<uint8_t> bad_adler = png;
  const size_t idat = 33, length = (size_t(png[idat]) << 24) | (size_t(png[idat + 1]) << 16) |
                                   (size_t(png[idat + 2]) << 8) | png[idat + 3];
  REQUIRE(std::string(png.begin() + idat + 4, png.begin() + idat + 8) == "IDAT");
  bad_adler[idat + 8 + length - 1] ^= 1;
  put_big_endian(bad_adler, idat + 8 + length, uint32_t(crc32(0, bad_adler.data() + idat + 4, uInt(length + 4))));
  put_bytes(dir.file("adler.png"), bad_adler);
  CHECK(decode_error(dir.file("adler.png")) ==
        dir.file("adler.png") + ": damaged PNG: the image data fails zlib's checks (incorrect data check)");

  // A truncated JPEG is reported as a JPEG; bytes of no known format say so.
  const std::string jpeg = dir.file("cut.jpg");
  REQUIRE(stbi_write_jpg(jpeg.c_str(), 4, 4, 3, pixels.data(), 90) != 0);
  std::vector<uint8_t> jpg = file_bytes(jpeg);
  jpg.resize(30);
  put_bytes(jpeg, jpg);
  CHECK(contains(decode_error(jpeg), jpeg + ": cannot decode JPEG image ("));
  put_bytes(dir.file("text.png"), {'h', 'e', 'l', 'l', 'o'});
  CHECK(contains(decode_error(dir.file("text.png")), ": cannot decode image (not PNG, JPEG, BMP or GIF)"));
  CHECK(decode_error(dir.file("missing.png")) == dir.file("missing.png") + ": no such file");

  // Found by fuzz/fuzz_image.cpp: 65 bytes of BMP declaring 524290 × 213 pixels, which
  // stb allocated and decoded (1.3 GB of floats, a fuzzer timeout).
  const std::vector<uint8_t> bomb = {
      0x42, 0x4d, 0x46, 0x0,  0x0,  0x0,  0x0,  0x0,  0x0, 0x0, 0x36, 0x0, 0x0,  0x0, 0x28, 0x0, 0x0,
      0x0,  0x2,  0x0,  0x8,  0x0,  0xd5, 0x0,  0x0,  0x0, 0x1, 0x0,  0x18, 0x0, 0x0,  0x0, 0x0,  0x0,
      0x10, 0x0,  0x0,  0x13, 0xb,  0x0,  0x0,  0x13, 0xb, 0x0, 0x0,  0x0,  0x0, 0x0,  0x0, 0x0,  0x0,
      0x0,  0x0,  0x0,  0x6d, 0x0,  0x0,  0xff, 0x0,  0x0, 0x9, 0x9,  0x9,  0x0, 0x0};
  put_bytes(dir.file("bomb.bmp"), bomb);
  CHECK(decode_error(dir.file("bomb.bmp")) ==
        dir.file("bomb.bmp") + ": BMP image of 524290 × 213 pixels is over the limit of 67108864 pixels");
  // The same as a top-down BMP, whose negative height stbi_info reports as it is: 54
  // bytes declaring 34 × 2555947 pixels (a fuzzer timeout, and an out-of-memory at 130
  // pixels wide).
  const std::vector<uint8_t> top_down = {
      0x42, 0x4d, 0x21, 0x0,  0x0, 0x0,  0x0,  0x0,  0x0,  0x0,  0x36, 0x0, 0x0,  0x0,  0x28, 0x0,  0x0, 0x0,
      0x22, 0x0,  0x0,  0x0,  0xd5, 0xff, 0xd8, 0xff, 0x1,  0x0,  0x18, 0x0, 0x0,  0x0,  0x0,  0x0,  0x10, 0x0,
      0x0,  0x0,  0x0,  0x0,  0x0,  0x0,  0xff, 0xd8, 0xff, 0x0,  0x0,  0xc2, 0x0, 0xff, 0x0,  0x0,  0x0,  0x0};
  put_bytes(dir.file("top_down.bmp"), top_down);
  CHECK(decode_error(dir.file("top_down.bmp")) ==
        dir.file("top_down.bmp") + ": BMP image of 34 × 2555947 pixels is over the limit of 67108864 pixels");
}

TEST_CASE("bad inputs: an image folder whose test classes differ from the train classes is refused") {
  TempDir dir;
  const std::vector<uint8_t> grey(4, 128);
  for (const std::string cls : {"train/cat", "train/dog", "test/cat", "test/dogs"}) {
    fs::create_directories(dir.path() / cls);
    REQUIRE(stbi_write_png((dir.path() / cls / "a.png").c_str(), 2, 2, 1, grey.data(), 2) != 0);
  }
  const std::string spec = "images:" + dir.path().string() + ":8";
  CHECK_THROWS_WITH_AS(open_data(spec), doctest::Contains("the test classes differ from the train classes (only in "
                                                          "train: dog; only in test: dogs)"),
                       Error);
  fs::rename(dir.path() / "test/dogs", dir.path() / "test/dog");
  CHECK(open_data(spec).test->num_classes() == 2);
}

TEST_CASE("bad inputs: a checkpoint with one flipped exponent bit is refused in one line; info shows its checksum") {
  TempDir dir;
  const std::string ck = save_tiny_checkpoint(dir);
  const CommandOutcome info = run_adjoint({"info", ck});
  CAPTURE(info.err);
  REQUIRE(info.code == 0);
  CHECK(contains(info.out, "  tensors: crc32 "));
  CHECK(contains(info.out, ", as recorded\n"));

  // The top exponent bit of one weight: 0.1 becomes about 3·10³⁷, finite, so only the
  // checksum can tell (a loss of 2e35 was reported with exit 0).
  SafetensorsFile f = read_safetensors(ck);
  Tensor& w = f.tensors.begin()->second;
  uint32_t bits;
  std::memcpy(&bits, w.data(), 4);
  bits ^= 1u << 30;
  std::memcpy(w.data(), &bits, 4);
  REQUIRE(std::isfinite(w.data()[0]));
  write_safetensors(ck, f.tensors, f.metadata);
  const std::string message = "adjoint: error: checkpoint " + ck +
                              ": its tensors do not match the crc32 its metadata records (";
  for (const std::vector<std::string>& words : std::vector<std::vector<std::string>>{
           {"info", ck}, {"eval", "--checkpoint", ck}, {"tensorsim", ck, ck}}) {
    const CommandOutcome r = run_adjoint(words);
    CAPTURE(words.front());
    check_fails(r, 1, message);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
  }

  // A checkpoint written before checksums were recorded still loads, and info says so.
  const std::string old = save_tiny_checkpoint(dir, "old.safetensors");
  SafetensorsFile o = read_safetensors(old);
  o.metadata.erase("tensors.crc32");
  write_safetensors(old, o.tensors, o.metadata);
  const CommandOutcome old_info = run_adjoint({"info", old});
  CAPTURE(old_info.err);
  CHECK(old_info.code == 0);
  CHECK(contains(old_info.out, "  tensors: no checksum recorded (a checkpoint from before they were), not checked\n"));
}
