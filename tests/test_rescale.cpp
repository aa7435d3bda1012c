// Random rescaling (engine/data/rescale.h) against its definition: the image resized by
// resize_bilinear to a drawn size within the range, placed wholly inside the frame at a drawn
// position, black elsewhere; the draws keyed by the example's index, so the loader's batches
// are the same at any thread count.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "engine/data/loader.h"
#include "engine/data/rescale.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "models/checkpoint.h"
#include "tests/support.h"

using namespace adjoint;
using adjoint::testing::contains;
using adjoint::testing::run_adjoint;
using adjoint::testing::TempDir;

namespace {

// Every value positive, distinct per channel and position: the placed image is exactly the
// non-zero part of the result.
std::vector<float> positive_image(int64_t channels, int64_t height, int64_t width, float offset = 1.0f) {
  std::vector<float> img(size_t(channels * height * width));
  for (size_t i = 0; i < img.size(); ++i) img[i] = offset + 0.01f * float(i);
  return img;
}

// Where the non-zero values of channel 0 of an H × W result lie.
struct Box {
  int64_t top = -1, left = -1, height = 0, width = 0;
};
Box nonzero_box(const std::vector<float>& out, int64_t height, int64_t width) {
  int64_t y0 = height, y1 = -1, x0 = width, x1 = -1;
  for (int64_t y = 0; y < height; ++y)
    for (int64_t x = 0; x < width; ++x)
      if (out[size_t(y * width + x)] != 0.0f) y0 = std::min(y0, y), y1 = std::max(y1, y), x0 = std::min(x0, x), x1 = std::max(x1, x);
  return y1 < 0 ? Box{} : Box{y0, x0, y1 - y0 + 1, x1 - x0 + 1};
}

}  // namespace

TEST_CASE("random rescale: a 2x2 image at half size is one pixel, its mean, at any of the four places") {
  const std::vector<float> img = {1, 2, 3, 4};
  const RandomRescale half({0.5, 0.5});
  std::set<size_t> places;
  for (int64_t i = 0; i < 64; ++i) {
    Generator gen = example_generator(1, 0, i);
    std::vector<float> out(4, -1.0f);
    half.apply(img.data(), {1, 2, 2}, out.data(), gen);
    // Bilinear at scale 1/2 samples the source at (0.5, 0.5): the four pixels' mean, 2.5 by hand.
    int lit = 0;
    for (size_t k = 0; k < 4; ++k) {
      if (out[k] == 0.0f) continue;
      ++lit;
      places.insert(k);
      CHECK(out[k] == 2.5f);
    }
    CHECK(lit == 1);
  }
  CHECK(places.size() == 4);
}

TEST_CASE("random rescale: the resized image at every size of the range, always inside the frame, black elsewhere") {
  const int64_t C = 2, H = 10, W = 8;
  const std::vector<float> img = positive_image(C, H, W);
  const RandomRescale rescale({0.3, 0.8});
  CHECK(rescale.min_height(H) == 3);
  CHECK(rescale.max_height(H) == 8);
  std::set<int64_t> heights;
  bool at_top = false, at_bottom = false, at_left = false, at_right = false;
  for (int64_t i = 0; i < 400; ++i) {
    Generator gen = example_generator(5, 0, i);
    std::vector<float> out(size_t(C * H * W), -1.0f);
    rescale.apply(img.data(), {C, H, W}, out.data(), gen);
    const Box b = nonzero_box(out, H, W);
    REQUIRE(b.height > 0);
    CHECK(b.height >= 3);
    CHECK(b.height <= 8);
    CHECK(b.width == std::max<int64_t>(1, std::llround(double(b.height) * W / H)));  // the aspect ratio kept
    CHECK(b.top + b.height <= H);
    CHECK(b.left + b.width <= W);
    heights.insert(b.height);
    at_top |= b.top == 0, at_bottom |= b.top + b.height == H, at_left |= b.left == 0, at_right |= b.left + b.width == W;
    // The content: resize_bilinear's image at that size and place, in every channel; 0 elsewhere.
    std::vector<float> shrunk(size_t(C * b.height * b.width));
    resize_bilinear(img.data(), C, H, W, shrunk.data(), b.height, b.width);
    for (int64_t c = 0; c < C; ++c)
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x) {
          const bool inside = y >= b.top && y < b.top + b.height && x >= b.left && x < b.left + b.width;
          const float want = inside ? shrunk[size_t((c * b.height + y - b.top) * b.width + x - b.left)] : 0.0f;
          REQUIRE(out[size_t((c * H + y) * W + x)] == want);
        }
  }
  CHECK(heights == std::set<int64_t>{3, 4, 5, 6, 7, 8});
  CHECK(at_top);
  CHECK(at_bottom);
  CHECK(at_left);
  CHECK(at_right);

  // [1, 1] is the identity.
  Generator gen(3);
  std::vector<float> out(img.size());
  RandomRescale({1, 1}).apply(img.data(), {C, H, W}, out.data(), gen);
  CHECK(out == img);
  CHECK_FALSE(RescaleRange{}.active());
  CHECK_THROWS_WITH_AS(rescale.output_shape({12}), doctest::Contains("random_rescale: expects a (C, H, W) image"), Error);
}

TEST_CASE("random rescale: a pure function of the example's key, and the loader's batches the same at any thread count") {
  const std::vector<float> img = positive_image(1, 12, 12);
  const RandomRescale rescale({0.5, 1.0});
  const auto draw = [&](uint64_t seed, int64_t epoch, int64_t index) {
    Generator gen = example_generator(seed, epoch, index);
    std::vector<float> out(img.size());
    rescale.apply(img.data(), {1, 12, 12}, out.data(), gen);
    return out;
  };
  CHECK(draw(4, 1, 9) == draw(4, 1, 9));
  int differ = 0;
  for (int64_t i = 0; i < 8; ++i) differ += draw(4, 1, i) != draw(4, 1, i + 8);
  CHECK(differ > 0);

  // 40 examples, each its own offset: batches through the loader at 1 and 2 threads, with and
  // without prefetch; every example is the transform of the example's own key.
  const int64_t n = 40, d = 144;
  std::vector<float> inputs;
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < n; ++i) {
    const std::vector<float> one = positive_image(1, 12, 12, 1.0f + float(i));
    inputs.insert(inputs.end(), one.begin(), one.end());
    labels.push_back(i % 3);
  }
  const auto data = std::make_shared<InMemoryDataset>("positive", Shape{1, 12, 12}, inputs, labels, 3);
  LoaderOptions opt;
  opt.batch_size = 8;
  opt.seed = 11;
  opt.transforms = {std::make_shared<RandomRescale>(RescaleRange{0.5, 1.0})};
  const auto stream = [&](bool prefetch, int threads) {
    const int before = num_threads();
    set_num_threads(threads);
    LoaderOptions o = opt;
    o.prefetch = prefetch;
    Loader loader(data, o);
    std::vector<float> all;
    for (int k = 0; k < 10; ++k) {  // two epochs
      const Batch b = loader.next();
      for (int64_t r = 0; r < b.size(); ++r) {
        const int64_t index = b.indices[size_t(r)];
        Generator gen = example_generator(opt.seed, b.epoch, index);
        std::vector<float> want(static_cast<size_t>(d));
        rescale.apply(inputs.data() + index * d, {1, 12, 12}, want.data(), gen);
        const std::vector<float> got(b.inputs.data() + r * d, b.inputs.data() + (r + 1) * d);
        REQUIRE(got == want);
      }
      const std::vector<float> v = b.inputs.to_vector();
      all.insert(all.end(), v.begin(), v.end());
    }
    set_num_threads(before);
    return all;
  };
  const std::vector<float> reference = stream(true, 2);
  CHECK(stream(false, 2) == reference);
  CHECK(stream(true, 1) == reference);
}

TEST_CASE("random rescale: the option reads LO,HI within (0, 1], and is refused in one line otherwise") {
  const RescaleRange r = parse_rescale_range("0.5,1");
  CHECK(r.lo == 0.5);
  CHECK(r.hi == 1.0);
  CHECK(r.active());
  CHECK(to_string(r) == "0.5,1");
  CHECK(to_string(parse_rescale_range("0.25,0.75")) == "0.25,0.75");
  for (const char* bad : {"0,1", "0.6,0.5", "0.5,1.2", "0.5", "a,b", "0.5,1,", ""})
    CHECK_THROWS_WITH_AS(parse_rescale_range(bad), doctest::Contains("option --random-rescale expects LO,HI"), UsageError);
}

TEST_CASE("train --random-rescale: recorded in the checkpoint, a resume with another range refused, bad values in one line") {
  TempDir dir;
  const std::string data = testing::write_square_images(dir);
  const std::vector<std::string> base = {"train", "--model", "resnet18", "--width", "0.0625", "--data", data,
                                         "--batch", "16", "--epochs", "2", "--out", dir.file("model")};
  std::vector<std::string> words = base;
  words.insert(words.end(), {"--random-rescale", "0.5,1", "--max-steps", "2"});
  const testing::CommandOutcome trained = run_adjoint(words);
  REQUIRE_MESSAGE(trained.code == 0, trained.err);
  CHECK(load_checkpoint(dir.file("model/checkpoint.safetensors")).metadata.at("train.random-rescale") == "0.5,1");

  words = base;
  words.insert(words.end(), {"--random-rescale", "0.6,1", "--max-steps", "3", "--resume",
                             dir.file("model/checkpoint.safetensors")});
  const testing::CommandOutcome other = run_adjoint(words);
  CHECK(other.code == 2);
  CHECK_MESSAGE(contains(other.err, "trained with --random-rescale 0.5,1, this run has --random-rescale 0.6,1"), other.err);

  // On a data set the bilinear MLP takes: the value is read first, then the data's kind.
  for (const auto& [value, message] :
       {std::pair<std::string, std::string>{"0.5", "option --random-rescale expects LO,HI"},
        {"0.5,1", "--random-rescale: modadd:5 is not an image data set"}}) {
    const testing::CommandOutcome bad =
        run_adjoint({"train", "--model", "bilinear_mlp", "--hidden", "4", "--data", "modadd:5", "--random-rescale", value,
                     "--out", dir.file("bad")});
    CHECK(bad.code == 2);
    CHECK_MESSAGE(contains(bad.err, message), bad.err);
    // The usage line, the one line of the error, the pointer to --help.
    CHECK(std::count(bad.err.begin(), bad.err.end(), '\n') == 3);
    CHECK(contains(bad.err, cat("adjoint: error: ", message)));
  }
}
