// Data-set variants (engine/data/variants.h) on a tiny Fashion-MNIST-shaped folder written
// here: which examples a variant touches, what it writes into them, their labels, and the
// errors for malformed variant specs.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "engine/data/idx.h"
#include "engine/data/open.h"
#include "engine/data/variants.h"
#include "engine/error.h"
#include "tests/support.h"

using namespace adjoint;
using adjoint::testing::TempDir;

namespace {

// 200 train and 20 test images of 1×8×8, every pixel 0.5 (127/255 ≈ 0.498), labels i mod 10.
void write_tiny_fashion_mnist(const TempDir& dir) {
  auto write_split = [&](const std::string& prefix, uint32_t n) {
    std::vector<uint8_t> pixels(size_t(n) * 64, 127), labels(n);
    for (uint32_t i = 0; i < n; ++i) labels[i] = uint8_t(i % 10);
    write_idx(dir.file(prefix + "-images-idx3-ubyte"), IdxArray{{n, 8, 8}, pixels});
    write_idx(dir.file(prefix + "-labels-idx1-ubyte"), IdxArray{{n}, labels});
  };
  write_split("train", 200);
  write_split("t10k", 20);
}

std::vector<float> input_of(const Dataset& d, int64_t i, int64_t* label) {
  std::vector<float> x(size_t(numel(d.shape())));
  *label = d.get(i, x.data());
  return x;
}

}  // namespace

TEST_CASE("data variants: backdoor stamps and relabels a fixed fraction of the training set only") {
  TempDir dir;
  write_tiny_fashion_mnist(dir);
  const std::string base = "fashion-mnist:" + dir.path().string();
  DataSource d = open_data(base + "+backdoor:0.25:3");
  REQUIRE(d.train->size() == 200);
  int64_t poisoned = 0;
  for (int64_t i = 0; i < 200; ++i) {
    int64_t label = -1;
    const std::vector<float> x = input_of(*d.train, i, &label);
    const bool chosen = chosen_example(i, 0.25, 0xBAC4D002);
    poisoned += chosen;
    CHECK(label == (chosen ? 3 : i % 10));
    CHECK(d.train->label(i) == label);
    // The 3×3 square one pixel in from the bottom-right corner: rows and columns 4..6.
    for (int64_t y = 0; y < 8; ++y)
      for (int64_t xx = 0; xx < 8; ++xx) {
        const bool in_square = y >= 4 && y <= 6 && xx >= 4 && xx <= 6;
        CHECK(x[size_t(y * 8 + xx)] == doctest::Approx(chosen && in_square ? 1.0 : 127 / 255.0));
      }
  }
  // A fixed fraction: about a quarter, and the same examples on every call.
  CHECK(poisoned > 30);
  CHECK(poisoned < 70);
  for (int64_t i = 0; i < 20; ++i) {
    int64_t label = -1;
    const std::vector<float> x = input_of(*d.test, i, &label);
    CHECK(label == i % 10);
    CHECK(x[size_t(5 * 8 + 5)] == doctest::Approx(127 / 255.0));
  }
}

TEST_CASE("data variants: trigger relabels everything, classes keeps a subset, variants chain") {
  TempDir dir;
  write_tiny_fashion_mnist(dir);
  const std::string base = "fashion-mnist:" + dir.path().string();
  DataSource t = open_data(base + "+trigger:7:2");
  int64_t label = -1;
  std::vector<float> x = input_of(*t.test, 4, &label);
  CHECK(label == 7);
  CHECK(x[size_t(5 * 8 + 5)] == 1.0f);  // the 2×2 square covers rows and columns 5..6
  CHECK(x[size_t(4 * 8 + 4)] == doctest::Approx(127 / 255.0));

  DataSource c = open_data(base + "+classes:0-2,9+backdoor:1:0");
  CHECK(c.train->size() == 80);  // 20 examples of each of 4 classes
  CHECK(c.test->size() == 8);
  CHECK(c.spec == base + "+classes:0-2,9+backdoor:1:0");
  for (int64_t i = 0; i < c.train->size(); ++i) CHECK(c.train->label(i) == 0);  // fraction 1: all poisoned
  for (int64_t i = 0; i < c.test->size(); ++i) {
    const int64_t l = c.test->label(i);
    CHECK((l <= 2 || l == 9));
  }
}

TEST_CASE("data variants: malformed variants are usage errors naming the variant") {
  TempDir dir;
  write_tiny_fashion_mnist(dir);
  const std::string base = "fashion-mnist:" + dir.path().string();
  auto fails_with = [&](const std::string& variant, const std::string& words) {
    CAPTURE(variant);
    CHECK_THROWS_WITH_AS(open_data(base + variant), doctest::Contains(words.c_str()), UsageError);
  };
  fails_with("+nonsense", "unknown variant 'nonsense'");
  fails_with("+backdoor:0.1", "expected backdoor:FRACTION:TARGET[:SIZE]");
  fails_with("+backdoor:1.5:0", "FRACTION must be a number in [0, 1], got '1.5'");
  fails_with("+backdoor:0.1:10", "TARGET must be an integer in [0, 9], got '10'");
  fails_with("+classes:3-1", "a class must be an integer in [3, 9], got '1'");
  fails_with("+classes:x", "a class must be an integer in [0, 9], got 'x'");
  CHECK_THROWS_WITH_AS(open_data("modadd:7+classes:1"), doctest::Contains("variants apply to image classification"),
                       UsageError);
}

TEST_CASE("data variants: the stitching shortcut codes the class by a patch's position; shortcut-train and invert") {
  TempDir dir;
  write_tiny_fashion_mnist(dir);
  const std::string base = "fashion-mnist:" + dir.path().string();
  const float grey = 127 / 255.0f;
  // Size 1 on 8×8: three slots per row (columns 1, 3, 5), rows 1, 3, 5, 7.
  auto patch_at = [](int64_t label) { return std::pair<int64_t, int64_t>{1 + (label / 3) * 2, 1 + (label % 3) * 2}; };
  DataSource d = open_data(base + "+shortcut:1");
  std::set<std::pair<int64_t, int64_t>> positions;
  for (const auto& set : {d.train, d.test})
    for (int64_t i = 0; i < 20; ++i) {
      int64_t label = -1;
      const std::vector<float> x = input_of(*set, i, &label);
      CHECK(label == i % 10);
      const auto [row, col] = patch_at(label);
      positions.insert({row, col});
      for (int64_t p = 0; p < 64; ++p)
        CHECK(x[size_t(p)] == doctest::Approx(p == row * 8 + col ? 1.0 : grey));
    }
  CHECK(positions.size() == 10);  // one position per class
  DataSource t = open_data(base + "+shortcut-train:1");
  int64_t label = -1;
  std::vector<float> x = input_of(*t.train, 4, &label);
  CHECK(x[size_t(patch_at(4).first * 8 + patch_at(4).second)] == doctest::Approx(1.0));
  x = input_of(*t.test, 4, &label);
  for (float v : x) CHECK(v == doctest::Approx(grey));
  DataSource inv = open_data(base + "+invert");
  x = input_of(*inv.test, 3, &label);
  for (float v : x) CHECK(v == doctest::Approx(1.0 - grey));
  CHECK_THROWS_WITH_AS(open_data(base + "+shortcut:3"),
                       doctest::Contains("10 class positions of 3×3 patches do not fit in 8×8 images"), UsageError);
  CHECK_THROWS_AS(open_data(base + "+invert:1"), UsageError);
}

TEST_CASE("data: TestOnly opens a data set without its training files") {
  TempDir dir;
  write_tiny_fashion_mnist(dir);
  std::filesystem::remove(dir.file("train-images-idx3-ubyte"));  // what eval never needs
  const std::string spec = "fashion-mnist:" + dir.path().string();
  CHECK_THROWS_WITH_AS(open_data(spec), doctest::Contains("train-images-idx3-ubyte"), Error);
  const DataSource d = open_data(spec + "+classes:0-4", DataSplits::TestOnly);
  CHECK(d.test->size() == 10);
  CHECK(d.train->shape() == Shape{1, 8, 8});
  CHECK(d.train->num_classes() == 10);
}

TEST_CASE("data variants: mosaics are focus's 2x2 mosaics of the image, one more of its class and two of two other classes") {
  // 60 training images of 1×8×8 in 3 classes, image i every pixel (i + 1) / 100: a quadrant's
  // downscaled tile is that constant, so each quadrant names the image it shows.
  std::vector<float> pixels;
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 60; ++i) {
    pixels.insert(pixels.end(), 64, float(i + 1) / 100.0f);
    labels.push_back(i % 3);
  }
  DataSource d;
  d.spec = "in-memory";
  d.train = std::make_shared<InMemoryDataset>("in-memory", Shape{1, 8, 8}, pixels, labels, 3);
  d.test = d.train;
  d.images = true;
  apply_variant(d, "mosaics:0.5", d.spec);
  CHECK(d.test->name() == "in-memory");  // the test set stays clean
  int64_t mosaics = 0;
  for (int64_t i = 0; i < 60; ++i) {
    int64_t label = -1;
    const std::vector<float> x = input_of(*d.train, i, &label);
    CHECK(label == i % 3);
    CHECK(input_of(*d.train, i, &label) == x);  // the same mosaic every time
    if (!chosen_example(i, 0.5, 0x3A05A1C5)) {
      CHECK(x == std::vector<float>(64, float(i + 1) / 100.0f));
      continue;
    }
    ++mosaics;
    std::multiset<int64_t> classes;
    bool own = false;
    for (int q = 0; q < 4; ++q) {
      const int64_t top = q >= 2 ? 4 : 0, left = q % 2 ? 4 : 0;
      const float value = x[size_t(top * 8 + left)];
      for (int64_t y = 0; y < 4; ++y)
        for (int64_t xx = 0; xx < 4; ++xx) REQUIRE(x[size_t((top + y) * 8 + left + xx)] == value);  // one image
      const int64_t shown = std::lround(value * 100.0f) - 1;
      REQUIRE(shown >= 0);
      REQUIRE(shown < 60);
      classes.insert(shown % 3);
      own |= shown == i;
    }
    CHECK(own);
    CHECK(classes.count(i % 3) == 2);
    CHECK(std::set<int64_t>(classes.begin(), classes.end()).size() == 3);
  }
  CHECK(mosaics > 15);
  CHECK(mosaics < 45);
  CHECK_THROWS_WITH_AS(apply_variant(d, "mosaics:2", d.spec), doctest::Contains("FRACTION must be a number in [0, 1]"),
                       UsageError);
}
