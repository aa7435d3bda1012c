// ImageNet's pipeline: PIL's 8-bit resize against its plain reference, torchvision's
// evaluation transform against its goldens (tests/goldens/gen_imagenet.py) on PNGs written
// here, the presets' table against torchvision's weights, and `--data imagenet:ROOT` on a
// small ImageNet-shaped folder.
#include <doctest/doctest.h>
#include <stb/stb_image_write.h>

#include <algorithm>
#include <filesystem>
#include <span>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/data/image_folder.h"
#include "engine/data/imagenet.h"
#include "engine/data/open.h"
#include "engine/data/resample.h"
#include "engine/error.h"
#include "engine/io/safetensors.h"
#include "engine/random.h"
#include "models/model.h"
#include "ops/reference/reference.h"
#include "tests/support.h"

using namespace adjoint;
using adjoint::testing::check_close;
using adjoint::testing::fixture;
using adjoint::testing::golden;
using adjoint::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// The pixels of gen_imagenet.py: the low byte of a 32-bit hash of (seed, index).
std::vector<uint8_t> hashed_pixels(uint32_t seed, int64_t height, int64_t width) {
  std::vector<uint8_t> out(size_t(height * width * 3));
  for (size_t i = 0; i < out.size(); ++i) {
    uint32_t x = uint32_t(i + 1) * 0x9E3779B1u + seed * 0x85EBCA77u;
    x ^= x >> 15;
    x *= 0x2C1B3C6Du;
    x ^= x >> 12;
    x *= 0x297A2D39u;
    x ^= x >> 15;
    out[i] = uint8_t(x & 255u);
  }
  return out;
}

std::vector<uint8_t> random_bytes(size_t n, uint64_t seed) {
  Generator gen(seed);
  std::vector<uint8_t> out(n);
  for (uint8_t& b : out) b = uint8_t(randint(256, gen));
  return out;
}

void write_png(const std::string& path, const std::vector<uint8_t>& rgb, int64_t height, int64_t width) {
  REQUIRE(stbi_write_png(path.c_str(), int(width), int(height), 3, rgb.data(), int(width * 3)) != 0);
}

const char* const kGoldenCases[] = {
    "shrink_portrait_bilinear", "grow_landscape_bilinear", "shrink_landscape_bicubic", "grow_portrait_bicubic",
    "odd_offset_bilinear",      "no_resize_bilinear",      "square_shrink_bilinear",  "resnet50_v1",
    "resnet50_v2",              "pvt_v2",                  "vit_l_16_v1",
};

}  // namespace

TEST_CASE("resample: the fast 8-bit resize is PIL's, byte for byte, as its plain reference computes it") {
  struct Size {
    int64_t h, w, out_h, out_w;
  };
  // Shrinking and enlarging, one axis or both, by integer and odd factors, to one pixel.
  const Size sizes[] = {{17, 23, 7, 5}, {9, 4, 31, 13}, {12, 30, 12, 11}, {25, 8, 6, 8},
                        {5, 5, 1, 1},   {1, 7, 3, 2},   {40, 41, 20, 60}, {3, 64, 3, 64}};
  uint64_t seed = 1;
  for (const ResampleFilter filter : {ResampleFilter::bilinear, ResampleFilter::bicubic})
    for (const Size& s : sizes) {
      const int64_t channels = seed % 2 == 0 ? 3 : 1;
      const std::vector<uint8_t> in = random_bytes(size_t(s.h * s.w * channels), seed++);
      std::vector<uint8_t> fast(size_t(s.out_h * s.out_w * channels));
      resample_uint8(in.data(), s.h, s.w, channels, fast.data(), s.out_h, s.out_w, filter);
      const std::vector<uint8_t> slow = reference::resample_uint8(in, s.h, s.w, channels, s.out_h, s.out_w, filter);
      INFO(s.h, "x", s.w, " -> ", s.out_h, "x", s.out_w, ", ", channels, " channels, filter ", int(filter));
      CHECK(fast == slow);
    }
}

TEST_CASE("resample: shrinking averages the footprint (antialiasing) and a constant image stays constant") {
  // A 1-pixel stripe pattern shrunk 4× averages to about half grey with the antialiased
  // filter; a plain bilinear tap would read only the stripes at two columns.
  std::vector<uint8_t> stripes(64 * 64);
  for (int64_t y = 0; y < 64; ++y)
    for (int64_t x = 0; x < 64; ++x) stripes[size_t(y * 64 + x)] = x % 2 == 0 ? 255 : 0;
  std::vector<uint8_t> small(16 * 16);
  resample_uint8(stripes.data(), 64, 64, 1, small.data(), 16, 16, ResampleFilter::bilinear);
  for (int64_t x = 2; x < 14; ++x) CHECK(std::abs(int(small[size_t(5 * 16 + x)]) - 128) <= 2);
  const std::vector<uint8_t> grey(30 * 20 * 3, 77);
  for (const ResampleFilter filter : {ResampleFilter::bilinear, ResampleFilter::bicubic}) {
    std::vector<uint8_t> out(13 * 41 * 3);
    resample_uint8(grey.data(), 30, 20, 3, out.data(), 13, 41, filter);
    CHECK(std::all_of(out.begin(), out.end(), [](uint8_t v) { return v == 77; }));
  }
  std::vector<uint8_t> out(4);
  CHECK_THROWS_AS(resample_uint8(grey.data(), 0, 20, 3, out.data(), 2, 2, ResampleFilter::bilinear), Error);
}

TEST_CASE("imagenet: the evaluation transform of PNGs written here is torchvision's within 1e-5") {
  TempDir dir;
  for (const char* name : kGoldenCases) {
    INFO("golden case ", std::string(name));
    const Tensor c = golden("imagenet", std::string(name) + ".case");
    const auto seed = uint32_t(c.data()[0]);
    const auto h = int64_t(c.data()[1]), w = int64_t(c.data()[2]);
    EvalPreset preset = eval_preset(kDefaultEvalPreset);
    preset.resize = int64_t(c.data()[3]);
    preset.crop = int64_t(c.data()[4]);
    preset.filter = c.data()[5] == 0 ? ResampleFilter::bilinear : ResampleFilter::bicubic;
    // The named presets' cases run through the table's own entry.
    for (const EvalPreset& p : eval_presets())
      if (std::string(p.name) == name) {
        CHECK(p.resize == preset.resize);
        CHECK(p.crop == preset.crop);
        CHECK(p.filter == preset.filter);
      }
    const std::string file = dir.file(std::string(name) + ".png");
    write_png(file, hashed_pixels(seed, h, w), h, w);
    const DecodedImage image = load_image_bytes(file, 3);
    REQUIRE(image.height == h);
    std::vector<float> out(size_t(3 * preset.crop * preset.crop));
    preprocess_image(image.pixels.data(), image.height, image.width, preset, out.data(), file);
    for (int64_t ch = 0; ch < 3; ++ch)
      for (float& v : std::span(out).subspan(size_t(ch * preset.crop * preset.crop), size_t(preset.crop * preset.crop)))
        v = (v - preset.mean[size_t(ch)]) / preset.std[size_t(ch)];
    Tensor ours = Tensor::from_vector({3, preset.crop, preset.crop}, out);
    const std::string rows_name = std::string(name) + ".rows";
    if (fixture("imagenet").tensors.count(rows_name) != 0) {  // the 224-pixel cases keep a few rows
      const Tensor rows = golden("imagenet", rows_name);
      Tensor kept = Tensor::empty({3, rows.numel(), preset.crop});
      for (int64_t ch = 0; ch < 3; ++ch)
        for (int64_t r = 0; r < rows.numel(); ++r)
          for (int64_t x = 0; x < preset.crop; ++x)
            kept.data()[(ch * rows.numel() + r) * preset.crop + x] =
                out[size_t((ch * preset.crop + int64_t(rows.data()[r])) * preset.crop + x)];
      ours = kept;
    }
    check_close(ours, golden("imagenet", std::string(name) + ".out"), 0.0, 1e-5, name);
  }
}

TEST_CASE("imagenet: the presets that name torchvision's weights have their resize, crop, filter and statistics") {
  int64_t checked = 0;
  for (const EvalPreset& p : eval_presets()) {
    if (!p.from_torchvision) continue;
    INFO("preset ", p.name);
    const Tensor t = golden("imagenet", std::string("preset.") + p.name);
    CHECK(p.resize == int64_t(t.data()[0]));
    CHECK(p.crop == int64_t(t.data()[1]));
    CHECK(int(p.filter) == int(t.data()[2]));
    for (size_t c = 0; c < 3; ++c) {
      CHECK(p.mean[c] == doctest::Approx(t.data()[3 + c]).epsilon(1e-7));
      CHECK(p.std[c] == doctest::Approx(t.data()[6 + c]).epsilon(1e-7));
    }
    ++checked;
  }
  CHECK(checked == 22);
  CHECK(std::string(eval_preset("resnet50_v2").weights).find("IMAGENET1K_V2") != std::string::npos);
  CHECK_THROWS_WITH_AS(eval_preset("resnet50_v3"), doctest::Contains("resnet50_v2"), UsageError);
}

TEST_CASE("imagenet: the shorter side is resized as torchvision computes it") {
  int64_t h = 0, w = 0;
  shorter_side_size(333, 250, 256, h, w);  // portrait: the width is the shorter side
  CHECK(h == 340);                         // int(256 · 333 / 250) = int(340.99)
  CHECK(w == 256);
  shorter_side_size(180, 500, 242, h, w);
  CHECK(h == 242);
  CHECK(w == 672);  // int(242 · 500 / 180) = int(672.2)
  shorter_side_size(64, 64, 232, h, w);
  CHECK(h == 232);
  CHECK(w == 232);
}

TEST_CASE("imagenet: the 1000 class names are torchvision's, in the heads' order") {
  const std::vector<std::string>& names = imagenet_class_names();
  REQUIRE(names.size() == 1000);
  CHECK(names[0] == "tench");
  CHECK(names[1] == "goldfish");
  CHECK(names[207] == "golden retriever");
  CHECK(names[999] == "toilet tissue");
}

TEST_CASE("imagenet: --data imagenet:ROOT reads ROOT/val/<wnid>/*.JPEG in sorted-wnid order") {
  TempDir dir;
  const std::vector<std::string> wnids = {"n01530575", "n01440764", "n01443537"};  // not in sorted order
  for (size_t c = 0; c < wnids.size(); ++c) {
    fs::create_directories(dir.path() / "val" / wnids[c]);
    for (int k = 0; k < 2; ++k) {
      const int64_t h = 40 + 7 * k, w = 52 - 5 * int64_t(c);
      // ImageNet's own files are JPEGs named .JPEG; a PNG sits beside one here.
      const std::string file = dir.file(cat("val/", wnids[c], "/ILSVRC2012_val_", c * 2 + k, k == 0 ? ".JPEG" : ".png"));
      const std::vector<uint8_t> rgb = hashed_pixels(uint32_t(c * 2 + k), h, w);
      if (k == 0) REQUIRE(stbi_write_jpg(file.c_str(), int(w), int(h), 3, rgb.data(), 90) != 0);
      else write_png(file, rgb, h, w);
    }
  }
  const std::string root = dir.path().string();
  // A small preset's crop is not available; the 224-pixel one grows these images.
  const DataSource d = open_data("imagenet:" + root + ":resnet50_v2", DataSplits::TestOnly);
  CHECK(d.images);
  CHECK(d.test->shape() == Shape{3, 224, 224});
  CHECK(d.test->num_classes() == 3);
  CHECK(d.test->size() == 6);
  CHECK(d.test->label(0) == 0);  // n01440764 sorts first
  CHECK(d.test->label(5) == 2);
  CHECK(d.mean == std::vector<float>{0.485f, 0.456f, 0.406f});
  CHECK(d.eval_transforms().size() == 1);  // the normalisation; resize and crop are the decoder's
  std::vector<float> x(size_t(3 * 224 * 224));
  d.test->get(0, x.data());
  CHECK(*std::min_element(x.begin(), x.end()) >= 0.0f);
  CHECK(*std::max_element(x.begin(), x.end()) <= 1.0f);
  // Fewer than 1000 classes: the folders' wnids name them (the names' list is by label).
  CHECK(class_names_of("imagenet:" + root) == std::vector<std::string>{"n01440764", "n01443537", "n01530575"});
  CHECK(class_names_of("imagenet:/no/such/root")[0] == "tench");
  CHECK_THROWS_WITH_AS(open_data("imagenet:" + root, DataSplits::TrainAndTest), doctest::Contains("/train is missing"),
                       Error);
  CHECK_THROWS_WITH_AS(open_data("imagenet:" + root + ":nosuch"),
                       doctest::Contains(":nosuch: unknown preset 'nosuch'; known: resnet18_v1"), UsageError);
  CHECK_THROWS_WITH_AS(open_data("imagenet:" + root + "/nothing"), doctest::Contains("no such folder"), Error);
}

TEST_CASE("imagenet: a folder of exactly 1000 classes is named by ImageNet's class names") {
  TempDir dir;
  for (int c = 0; c < 1000; ++c) fs::create_directories(dir.path() / "val" / cat("n", 1000000 + c));
  const std::vector<std::string> names = class_names_of("imagenet:" + dir.path().string());
  REQUIRE(names.size() == 1000);
  CHECK(names[0] == "tench");
  CHECK(class_name(names, 1) == "goldfish");
}

TEST_CASE("imagenet: stb decodes PIL's JPEGs within a few levels of libjpeg (measured)") {
  for (const char* name : {"a_q75", "a_q90", "b_q90"}) {
    INFO("JPEG ", std::string(name));
    const Tensor file = golden("jpeg", std::string(name) + ".jpeg");
    const Tensor pil = golden("jpeg", std::string(name) + ".pixels");
    std::vector<uint8_t> bytes(size_t(file.numel()));
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = uint8_t(file.data()[i]);
    const DecodedImage stb = decode_image_bytes(bytes.data(), bytes.size(), name, 3);
    REQUIRE(stb.height == pil.size(0));
    REQUIRE(stb.width == pil.size(1));
    double worst = 0, total = 0;
    for (int64_t i = 0; i < pil.numel(); ++i) {
      const double d = std::abs(double(stb.pixels[size_t(i)]) - double(pil.data()[i]));
      worst = std::max(worst, d), total += d;
    }
    // The same through an evaluation transform (shorter side 40, centre 32, normalised).
    EvalPreset preset = eval_preset(kDefaultEvalPreset);
    preset.resize = 40, preset.crop = 32;
    std::vector<uint8_t> pil_bytes(size_t(pil.numel()));
    for (size_t i = 0; i < pil_bytes.size(); ++i) pil_bytes[i] = uint8_t(pil.data()[i]);
    std::vector<float> ours(3 * 32 * 32), theirs(3 * 32 * 32);
    preprocess_image(stb.pixels.data(), stb.height, stb.width, preset, ours.data(), name);
    preprocess_image(pil_bytes.data(), stb.height, stb.width, preset, theirs.data(), name);
    double worst_input = 0, total_input = 0;
    for (size_t i = 0; i < ours.size(); ++i) {
      const double d = std::abs(double(ours[i]) - double(theirs[i])) / preset.std[i / (32 * 32)];
      worst_input = std::max(worst_input, d), total_input += d;
    }
    const double mean = total / double(pil.numel()), mean_input = total_input / double(ours.size());
    MESSAGE(std::string(name), ": stb vs libjpeg (PIL) pixels: max ", worst, ", mean ", mean,
            " levels; normalised input after resize and crop: max ", worst_input, ", mean ", mean_input);
    CHECK(mean < 0.5);
    CHECK(worst <= 8);
    CHECK(mean_input < 0.01);
  }
}

TEST_CASE("bench data: the loader's wait beside the model's compute, prefetching and not") {
  const adjoint::testing::CommandOutcome neither = adjoint::testing::run_adjoint({"bench", "data"});
  CHECK(neither.code == 2);
  CHECK(adjoint::testing::contains(neither.err, "give --data SPEC"));
  TempDir dir;
  for (int c = 0; c < 2; ++c) {
    fs::create_directories(dir.path() / "test" / cat("class", c));
    for (int k = 0; k < 3; ++k) write_png(dir.file(cat("test/class", c, "/", k, ".png")), hashed_pixels(uint32_t(c * 3 + k), 40, 36), 40, 36);
  }
  const adjoint::testing::CommandOutcome run = adjoint::testing::run_adjoint(
      {"--threads", "1", "bench", "data", "--data", "images:" + dir.path().string() + ":32", "--only", "resnet18",
       "--batch", "2", "--steps", "2"});
  REQUIRE_MESSAGE(run.code == 0, run.err);
  CHECK(adjoint::testing::contains(run.out, "decode and transform alone:"));
  CHECK(adjoint::testing::contains(run.out, "prefetch "));
  CHECK(adjoint::testing::contains(run.out, "no prefetch "));
}

TEST_CASE("imagenet: --preset puts image files through the preset's transform and names ImageNet's classes") {
  TempDir dir;
  ModelConfig c;
  c.arch = "bilinear_mlp";
  c.hidden = 4;
  c.num_classes = 1000;
  c.in_channels = 3;
  c.image_size = 224;
  Generator gen(3);
  const std::shared_ptr<Model> model = make_model(c, gen);
  model->train(false);
  write_safetensors(dir.file("w.safetensors"), model->state_dict());
  const int64_t h = 300, w = 257;
  write_png(dir.file("photo.png"), hashed_pixels(12, h, w), h, w);
  const adjoint::testing::CommandOutcome run = adjoint::testing::run_adjoint(
      {"predict", "--model", "bilinear_mlp", "--hidden", "4", "--weights", dir.file("w.safetensors"), "--preset",
       "pvt_v2", "--out", dir.file("p"), dir.file("photo.png")});
  REQUIRE_MESSAGE(run.code == 0, run.err);
  // The logits are the model's on the preset's tensor of the file.
  const EvalPreset& preset = eval_preset("pvt_v2");
  std::vector<float> x(3 * 224 * 224);
  const DecodedImage image = load_image_bytes(dir.file("photo.png"), 3);
  preprocess_image(image.pixels.data(), h, w, preset, x.data(), "photo");
  for (size_t i = 0; i < x.size(); ++i) x[i] = (x[i] - preset.mean[i / (224 * 224)]) / preset.std[i / (224 * 224)];
  Tensor expected;
  {
    NoGrad off;
    expected = model->forward(Tensor::from_vector({1, 3, 224, 224}, x)).contiguous();
  }
  const Tensor logits = read_safetensors(dir.file("p.safetensors")).tensors.at("logits");
  check_close(logits, expected, 1e-5, 1e-5, "predict --preset pvt_v2");
  const int64_t best = std::max_element(expected.data(), expected.data() + 1000) - expected.data();
  CHECK(adjoint::testing::contains(run.out, cat("class ", best, " (", imagenet_class_names()[size_t(best)], ")")));
  // A data set's transform is its spec's: --preset beside --data is refused.
  const adjoint::testing::CommandOutcome both = adjoint::testing::run_adjoint(
      {"explain", "--model", "bilinear_mlp", "--hidden", "4", "--weights", dir.file("w.safetensors"), "--preset",
       "pvt_v2", "--data", "imagenet:" + dir.path().string()});
  CHECK(both.code == 2);
  CHECK(adjoint::testing::contains(both.err, "--preset applies to image files; a data set names its own"));
  // A preset whose crop is not the model's input size is refused, naming both.
  c.image_size = 32;
  write_safetensors(dir.file("w32.safetensors"), make_model(c, gen)->state_dict());
  const adjoint::testing::CommandOutcome bad = adjoint::testing::run_adjoint(
      {"predict", "--model", "bilinear_mlp", "--hidden", "4", "--image-size", "32", "--weights",
       dir.file("w32.safetensors"), "--preset", "resnet50_v2", dir.file("photo.png")});
  CHECK(bad.code == 2);
  CHECK(adjoint::testing::contains(bad.err, "--preset resnet50_v2: its 224x224 RGB crop does not fit bilinear_mlp"));
}

TEST_CASE("imagenet: a thin strip that would resize to billions of pixels is refused, naming the file") {
  const std::vector<uint8_t> strip(size_t(1 * 70000 * 3), 100);
  std::vector<float> out(3 * 224 * 224);
  CHECK_THROWS_WITH_AS(preprocess_image(strip.data(), 1, 70000, eval_preset("resnet50_v1"), out.data(), "strip.png"),
                       doctest::Contains("strip.png: a 70000 × 1 image resized to 17920000 × 256 is over the limit"),
                       Error);
}
