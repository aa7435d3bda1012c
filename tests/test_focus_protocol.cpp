// Focus's protocol (docs/methods.md §1.4) in the semantic-pullbacks reproduce: the models
// learn the mosaics from training images only, and the recognition rate that gates the focus
// claims is measured on mosaics of held-out test images.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "engine/data/idx.h"
#include "engine/data/open.h"
#include "engine/io/safetensors.h"
#include "models/model_source.h"
#include "tests/support.h"
#include "tools/reproduce/paper.h"

using namespace adjoint;
using namespace adjoint::reproduce;
using adjoint::testing::CommandOutcome;
using adjoint::testing::contains;
using adjoint::testing::read_text;
using adjoint::testing::run_adjoint;
using adjoint::testing::TempDir;

namespace {

// 60 training images of 1×8×8 in three classes, image i every pixel i + 1 (of 255), and 12
// test images every pixel 250: a pixel tells which split, and which training image, it shows.
void write_split_coded_fashion_mnist(const TempDir& dir) {
  auto write_split = [&](const std::string& prefix, uint32_t n, bool train) {
    std::vector<uint8_t> pixels(size_t(n) * 64), labels(n);
    for (uint32_t i = 0; i < n; ++i) {
      std::fill_n(pixels.begin() + i * 64, 64, uint8_t(train ? i + 1 : 250));
      labels[i] = uint8_t(i % 3);
    }
    write_idx(dir.file(prefix + "-images-idx3-ubyte"), IdxArray{{n, 8, 8}, pixels});
    write_idx(dir.file(prefix + "-labels-idx1-ubyte"), IdxArray{{n}, labels});
  };
  write_split("train", 60, true);
  write_split("t10k", 12, false);
}

// The pixel code (0–255) of quadrant q of an 8×8 image whose quadrants are each one constant.
int64_t quadrant_code(const std::vector<float>& x, int q) {
  const int64_t top = q >= 2 ? 4 : 0, left = q % 2 ? 4 : 0;
  const float value = x[size_t(top * 8 + left)];
  for (int64_t y = 0; y < 4; ++y)
    for (int64_t c = 0; c < 4; ++c) REQUIRE(x[size_t((top + y) * 8 + left + c)] == value);
  return std::lround(value * 255.0f);
}

std::vector<float> input_of(const Dataset& d, int64_t i, int64_t* label) {
  std::vector<float> x(size_t(numel(d.shape())));
  *label = d.get(i, x.data());
  return x;
}

bool has_word(const std::vector<std::string>& words, const std::string& word) {
  return std::find(words.begin(), words.end(), word) != words.end();
}

// The word after `option` in a part's command line; empty where the option is not given.
std::string option_value(const std::vector<std::string>& words, const std::string& option) {
  const auto it = std::find(words.begin(), words.end(), option);
  return it == words.end() || it + 1 == words.end() ? "" : *(it + 1);
}

}  // namespace

TEST_CASE("focus protocol: training mosaics show training images only, and the test split stays plain") {
  TempDir dir;
  write_split_coded_fashion_mnist(dir);
  const std::string spec = cat("fashion-mnist:", dir.path().string(), "+mosaics:1");
  const DataSource d = open_data(spec);
  for (int64_t i = 0; i < d.train->size(); ++i) {
    int64_t label = -1;
    const std::vector<float> x = input_of(*d.train, i, &label);
    CHECK(label == i % 3);
    std::multiset<int64_t> classes;
    bool own = false;
    for (int q = 0; q < 4; ++q) {
      const int64_t code = quadrant_code(x, q);
      REQUIRE_MESSAGE(code >= 1, "training example ", i, " quadrant ", q);
      REQUIRE_MESSAGE(code <= 60, "training example ", i, " quadrant ", q, " shows a test image");
      classes.insert((code - 1) % 3);
      own |= code == i + 1;
    }
    CHECK(own);                          // its own image is one tile, its label the class of two
    CHECK(classes.count(i % 3) == 2);
  }
  // The test split, which explain scores and draws focus's mosaics from, is the plain images,
  // whether the training files are read (train, eval) or not (explain, predict).
  for (const DataSource& read : {d, open_data(spec, DataSplits::TestOnly)}) {
    REQUIRE(read.test->size() == 12);
    for (int64_t i = 0; i < read.test->size(); ++i) {
      int64_t label = -1;
      CHECK(input_of(*read.test, i, &label) == std::vector<float>(64, 250.0f / 255.0f));
      CHECK(label == i % 3);
    }
  }
}

TEST_CASE("focus protocol: the reproduce trains on mosaics of the training split and scores focus on test images") {
  const Paper& paper = find_paper("semantic-pullbacks");
  for (Scale scale : {Scale::Quick, Scale::Full}) {
    const std::string scale_label = scale_name(scale);
    CAPTURE(scale_label);
    const std::vector<Part> parts = paper.parts(scale, 2);
    int trained = 0, explained = 0;
    for (const Part& part : parts) {
      CAPTURE(part.name);
      if (part.words[0] == "train") {
        ++trained;
        // Training reads the training split, a share of it made into mosaics.
        CHECK(contains(option_value(part.words, "--data"), "+mosaics"));
        if (scale == Scale::Full) CHECK(std::stoll(option_value(part.words, "--epochs")) >= 2);
        CHECK_FALSE(has_word(part.words, "--split"));
      } else if (part.words[0] == "explain") {
        ++explained;
        // Explained on the checkpoint's test split (explain's default), which the +mosaics
        // variant leaves plain: focus's mosaics, and the recognition rate, are of held-out images.
        CHECK_FALSE(has_word(part.words, "--split"));
        CHECK(contains(option_value(part.words, "--metrics"), "focus"));
        const std::string checkpoint = option_value(part.words, "--checkpoint");
        bool from_a_training_part = false;
        for (const Part& earlier : parts)
          if (earlier.words[0] == "train" && checkpoint == cat("{parts}/", earlier.name, "/checkpoint.safetensors"))
            from_a_training_part = true;
        CHECK(from_a_training_part);
        // The full scale scores focus on enough mosaics to tell 0.8 recognition from chance.
        if (scale == Scale::Full) CHECK(std::stoll(option_value(part.words, "--expensive-count")) >= 128);
      }
    }
    CHECK(trained == 4);
    CHECK(explained == 4);
  }
}

TEST_CASE("focus protocol: explain scores a mosaic-trained checkpoint's focus on mosaics of its test images") {
  // One training step on all-mosaic training images, then explain's focus: every image it
  // explains, and so every tile of its mosaics, is a test image (all pixels 250), none a
  // training image (pixels 1–60), and the recognition rate counts those mosaics.
  TempDir dir;
  write_split_coded_fashion_mnist(dir);
  const std::string spec = cat("fashion-mnist:", dir.path().string(), "+mosaics:1");
  const CommandOutcome trained = run_adjoint({"train", "--model", "resnet18", "--width", "0.0625", "--data", spec,
                                              "--batch", "16", "--max-steps", "1", "--out", dir.file("model")});
  REQUIRE_MESSAGE(trained.code == 0, trained.err);
  const CommandOutcome explained =
      run_adjoint({"explain", "--checkpoint", dir.file("model/checkpoint.safetensors"), "--methods", "gradient",
                   "--metrics", "focus", "--count", "12", "--expensive-count", "6", "--examples", "0", "--out",
                   dir.file("explain")});
  REQUIRE_MESSAGE(explained.code == 0, explained.err);
  const SafetensorsFile maps = read_safetensors(dir.file("explain/attributions_gradient.safetensors"));
  const Tensor& inputs = maps.tensors.at("inputs");
  REQUIRE(inputs.shape() == Shape{12, 1, 8, 8});
  for (int64_t i = 1; i < inputs.numel(); ++i) REQUIRE(inputs.data()[i] == inputs.data()[0]);
  const LoadedModel loaded = load_checkpoint_model(dir.file("model/checkpoint.safetensors"));
  REQUIRE(loaded.mean.size() == 1);
  CHECK(inputs.data()[0] == doctest::Approx((250.0f / 255.0f - loaded.mean[0]) / loaded.std[0]).epsilon(1e-5));
  const std::string metrics = read_text(dir.file("explain/metrics.md"));
  CHECK_MESSAGE(contains(metrics, "(test, first 12)"), metrics);
  CHECK_MESSAGE(contains(metrics, "6 mosaics of 2x2 downscaled images drawn from the 12 images"), metrics);
  CHECK_MESSAGE(contains(metrics, "over 6 mosaics"), metrics);
}
