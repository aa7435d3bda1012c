// The data layer: file formats (IDX, CIFAR-10, image folders), synthetic datasets,
// transforms and the Loader's reproducibility guarantees. Every file is written here,
// into a temporary folder; only the Fashion-MNIST check reads an installed dataset.
#include <doctest/doctest.h>
#include <stb/stb_image_write.h>
#include <zlib.h>

#include <algorithm>
#include <filesystem>
#include <cmath>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "engine/data/cifar.h"
#include "engine/data/dataset.h"
#include "engine/data/idx.h"
#include "engine/data/image_folder.h"
#include "engine/data/loader.h"
#include "engine/data/open.h"
#include "engine/data/synthetic.h"
#include "engine/data/transform.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "tests/support.h"

using namespace adjoint;
using adjoint::testing::TempDir;
namespace fs = std::filesystem;

namespace {

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

std::vector<uint8_t> bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Deterministic byte pattern so every pixel is distinguishable.
std::vector<uint8_t> pattern(size_t n, int salt) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 37 + static_cast<size_t>(salt) * 11) % 256);
  return v;
}

std::vector<float> example_input(const Dataset& d, int64_t i, int64_t* label = nullptr) {
  std::vector<float> x(static_cast<size_t>(numel(d.shape())));
  std::vector<int64_t> t(static_cast<size_t>(d.target_length()));
  d.get(i, x.data(), t.data());
  if (label) *label = t[0];
  return x;
}

// Images whose pixels encode (index, position): lets loader tests see every example.
class IndexedImages : public Dataset {
public:
  IndexedImages(int64_t n, Shape shape) : n_(n), shape_(std::move(shape)) {}
  std::string name() const override { return "indexed-images"; }
  int64_t size() const override { return n_; }
  Shape shape() const override { return shape_; }
  int64_t num_classes() const override { return 3; }
  void get(int64_t index, float* input, int64_t* targets) const override {
    check_index(index);
    for (int64_t p = 0; p < numel(shape_); ++p) input[p] = static_cast<float>(index) + 0.001f * static_cast<float>(p);
    targets[0] = index % 3;
  }

private:
  int64_t n_;
  Shape shape_;
};

// doctest's matcher wants its own string type.
doctest::Contains contains(const std::string& text) { return doctest::Contains(text.c_str()); }

}  // namespace

TEST_CASE("data: IDX files round trip, gzipped and raw") {
  TempDir dir;
  IdxArray images{{3, 2, 4}, pattern(24, 1)};
  IdxArray labels{{3}, {7, 0, 9}};
  for (const std::string suffix : {"", ".gz"}) {
    CAPTURE(suffix);
    write_idx(dir.file("img" + suffix), images);
    write_idx(dir.file("lab" + suffix), labels);
    const IdxArray back = read_idx(dir.file("img" + suffix));
    CHECK(back.dims == images.dims);
    CHECK(back.data == images.data);
    // The gzipped file really is compressed (zlib's magic), the raw one starts with the IDX magic.
    const std::vector<uint8_t> head = bytes_of(dir.file("img" + suffix));
    if (suffix.empty()) CHECK((head[0] == 0 && head[2] == 0x08 && head[3] == 3));
    else CHECK((head[0] == 0x1f && head[1] == 0x8b));

    IdxDataset d(dir.file("img" + suffix), dir.file("lab" + suffix), "tiny");
    CHECK(d.size() == 3);
    CHECK(d.shape() == Shape{1, 2, 4});
    CHECK(d.num_classes() == 10);
    for (int64_t i = 0; i < 3; ++i) {
      int64_t label = -1;
      const std::vector<float> x = example_input(d, i, &label);
      CHECK(label == labels.data[static_cast<size_t>(i)]);
      CHECK(d.label(i) == label);
      for (int64_t p = 0; p < 8; ++p) CHECK(x[static_cast<size_t>(p)] == images.data[static_cast<size_t>(i * 8 + p)] / 255.0f);
    }
  }
  // The split layout: gzipped train files, raw test files, found by name.
  write_idx(dir.file("train-images-idx3-ubyte.gz"), images);
  write_idx(dir.file("train-labels-idx1-ubyte.gz"), labels);
  write_idx(dir.file("t10k-images-idx3-ubyte"), IdxArray{{1, 2, 4}, pattern(8, 2)});
  write_idx(dir.file("t10k-labels-idx1-ubyte"), IdxArray{{1}, {4}});
  const auto train = fashion_mnist("train", dir.path().string());
  const auto test = mnist("test", dir.path().string());
  CHECK(train->size() == 3);
  CHECK(train->name() == "fashion-mnist/train");
  CHECK(test->size() == 1);
  CHECK(test->label(0) == 4);
  CHECK_THROWS_WITH_AS(fashion_mnist("valid", dir.path().string()), doctest::Contains("unknown split 'valid'"), Error);
  CHECK_THROWS_WITH_AS(fashion_mnist("train", dir.file("nowhere")), doctest::Contains("no such file"), Error);
}

TEST_CASE("data: corrupt IDX files are errors naming the file and the fault") {
  TempDir dir;
  const IdxArray images{{2, 3, 3}, pattern(18, 3)};
  const IdxArray labels{{2}, {1, 2}};
  write_idx(dir.file("good-img"), images);
  write_idx(dir.file("good-lab"), labels);
  write_idx(dir.file("good-img.gz"), images);
  const std::vector<uint8_t> raw = bytes_of(dir.file("good-img"));

  auto expect = [&](const std::string& name, const std::vector<uint8_t>& bytes, const std::string& what) {
    CAPTURE(name);
    write_bytes(dir.file(name), bytes);
    CHECK_THROWS_WITH_AS(read_idx(dir.file(name)), contains(dir.file(name)), Error);
    CHECK_THROWS_WITH_AS(read_idx(dir.file(name)), contains(what), Error);
  };
  std::vector<uint8_t> bad = raw;
  bad[0] = 0x12;
  expect("wrong-magic", bad, "not an IDX file");
  bad = raw;
  bad[2] = 0x0D;  // float type code
  expect("wrong-type", bad, "type code");
  expect("truncated-data", std::vector<uint8_t>(raw.begin(), raw.end() - 5), "truncated IDX data");
  expect("truncated-header", std::vector<uint8_t>(raw.begin(), raw.begin() + 9), "truncated IDX header");
  // Found by fuzzing (fuzz/fuzz_idx.cpp): four extents of 65536 multiply to 2^64, which
  // overflowed to 0 and matched an empty data section.
  expect("overflowing-extents", {0, 0, 8, 4, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0},
         "truncated IDX data (header [65536, 65536, 65536, 65536] needs more than the 0 bytes found)");
  expect("tiny", std::vector<uint8_t>(raw.begin(), raw.begin() + 2), "no header");
  bad = raw;
  bad.push_back(0);
  expect("trailing", bad, "unexpected bytes");

  // A gzip stream cut in half: zlib notices the missing end.
  const std::vector<uint8_t> gz = bytes_of(dir.file("good-img.gz"));
  write_bytes(dir.file("cut.gz"), std::vector<uint8_t>(gz.begin(), gz.begin() + static_cast<long>(gz.size() / 2)));
  CHECK_THROWS_WITH_AS(read_idx(dir.file("cut.gz")), contains(dir.file("cut.gz")), Error);
  // Corrupted compressed bytes (past the gzip header): a data or CRC error.
  bad = gz;
  for (size_t i = 12; i < bad.size() - 8; ++i) bad[i] ^= 0x5A;
  write_bytes(dir.file("garbled.gz"), bad);
  CHECK_THROWS_WITH_AS(read_idx(dir.file("garbled.gz")), contains(dir.file("garbled.gz")), Error);

  // Consistency between the two files of a dataset.
  write_idx(dir.file("three-lab"), IdxArray{{3}, {0, 1, 2}});
  CHECK_THROWS_WITH_AS(IdxDataset(dir.file("good-img"), dir.file("three-lab"), "x"),
                       doctest::Contains("3 labels for 2 images"), Error);
  write_idx(dir.file("big-lab"), IdxArray{{2}, {1, 10}});
  CHECK_THROWS_WITH_AS(IdxDataset(dir.file("good-img"), dir.file("big-lab"), "x"),
                       doctest::Contains("label 10 of example 1"), Error);
  CHECK_THROWS_WITH_AS(IdxDataset(dir.file("good-lab"), dir.file("good-lab"), "x"),
                       doctest::Contains("images must have 3 dimensions"), Error);
  CHECK_THROWS_WITH_AS(read_idx(dir.file("absent")), doctest::Contains("absent: no such file"), Error);
  IdxDataset good(dir.file("good-img"), dir.file("good-lab"), "good");
  std::vector<float> x(9);
  CHECK_THROWS_WITH_AS(good.get(2, x.data()), doctest::Contains("good: example 2 is out of range [0, 2)"), Error);
}

TEST_CASE("data: CIFAR-10 binary batches round trip") {
  TempDir dir;
  constexpr size_t record = 3073;
  // Batch b holds two records with labels b-1 and 9-(b-1); the test batch three.
  auto batch = [&](int salt, std::vector<uint8_t> labels) {
    std::vector<uint8_t> bytes;
    for (size_t r = 0; r < labels.size(); ++r) {
      bytes.push_back(labels[r]);
      const std::vector<uint8_t> pixels = pattern(3072, salt * 10 + static_cast<int>(r));
      bytes.insert(bytes.end(), pixels.begin(), pixels.end());
    }
    return bytes;
  };
  for (int b = 1; b <= 5; ++b)
    write_bytes(dir.file("data_batch_" + std::to_string(b) + ".bin"),
                batch(b, {static_cast<uint8_t>(b - 1), static_cast<uint8_t>(10 - b)}));
  write_bytes(dir.file("test_batch.bin"), batch(7, {3, 1, 4}));

  const auto train = cifar10(dir.path().string(), "train");
  const auto test = cifar10(dir.path().string(), "test");
  CHECK(train->size() == 10);
  CHECK(test->size() == 3);
  CHECK(train->shape() == Shape{3, 32, 32});
  CHECK(train->name() == "cifar10/train");
  int64_t label = -1;
  const std::vector<float> x = example_input(*train, 7, &label);  // batch 4, record 1
  CHECK(label == 6);
  const std::vector<uint8_t> expected = pattern(3072, 4 * 10 + 1);
  for (size_t i = 0; i < 3072; ++i) REQUIRE(x[i] == expected[i] / 255.0f);
  CHECK(test->label(2) == 4);

  std::vector<uint8_t> cut = batch(7, {3, 1});
  cut.resize(record + 100);
  write_bytes(dir.file("test_batch.bin"), cut);
  CHECK_THROWS_WITH_AS(cifar10(dir.path().string(), "test"), contains(dir.file("test_batch.bin")), Error);
  CHECK_THROWS_WITH_AS(cifar10(dir.path().string(), "test"), doctest::Contains("100 bytes left over"), Error);
  write_bytes(dir.file("test_batch.bin"), batch(7, {3, 12}));
  CHECK_THROWS_WITH_AS(cifar10(dir.path().string(), "test"), doctest::Contains("label 12 of record 1"), Error);
  fs::remove(dir.path() / "data_batch_3.bin");
  CHECK_THROWS_WITH_AS(cifar10(dir.path().string(), "train"), doctest::Contains("data_batch_3.bin: no such file"),
                       Error);
}

TEST_CASE("data: image folder of PNGs, sorted classes, channel conversion and resize") {
  TempDir dir;
  constexpr int w = 6, h = 4;
  // Interleaved RGB pixels of image (class c, number k).
  auto rgb = [](int c, int k) {
    std::vector<uint8_t> px(w * h * 3);
    for (int i = 0; i < w * h * 3; ++i) px[static_cast<size_t>(i)] = static_cast<uint8_t>((i * 13 + c * 70 + k * 31) % 256);
    return px;
  };
  const std::vector<std::string> classes = {"b_dog", "a_cat"};  // written out of order
  for (size_t c = 0; c < classes.size(); ++c) {
    fs::create_directories(dir.path() / classes[c]);
    for (int k = 0; k < 2; ++k) {
      const std::string file = dir.file(classes[c] + "/img" + std::to_string(k) + ".png");
      REQUIRE(stbi_write_png(file.c_str(), w, h, 3, rgb(static_cast<int>(c), k).data(), w * 3) != 0);
    }
  }
  write_bytes(dir.file("a_cat/notes.txt"), {'h', 'i'});  // not an image: ignored

  ImageFolder full(dir.path().string(), 3, h, w);
  CHECK(full.size() == 4);
  CHECK(full.classes() == std::vector<std::string>{"a_cat", "b_dog"});
  CHECK(full.num_classes() == 2);
  CHECK(full.shape() == Shape{3, h, w});
  // Example 1 is a_cat/img1.png, written as class index 1 above; example 2 is b_dog/img0.png.
  int64_t label = -1;
  std::vector<float> x = example_input(full, 1, &label);
  CHECK(label == 0);
  CHECK(full.file(1).find("a_cat/img1.png") != std::string::npos);
  const std::vector<uint8_t> px = rgb(1, 1);
  for (int c = 0; c < 3; ++c)
    for (int i = 0; i < w * h; ++i) REQUIRE(x[static_cast<size_t>(c * w * h + i)] == px[static_cast<size_t>(i * 3 + c)] / 255.0f);
  CHECK(full.label(2) == 1);

  // Grey conversion is stb's (luma-weighted); resizing follows resize_bilinear exactly.
  ImageFolder grey(dir.path().string(), 1, h, w);
  const std::vector<float> g = example_input(grey, 1);
  CHECK(g.size() == size_t(w * h));
  CHECK(g[0] > 0.0f);
  ImageFolder small(dir.path().string(), 3, 2, 3);
  const std::vector<float> s = example_input(small, 1);
  std::vector<float> expected(3 * 2 * 3);
  resize_bilinear(x.data(), 3, h, w, expected.data(), 2, 3);
  CHECK(s == expected);

  // An unreadable image keeps its place in the list (the indices and labels after it do not
  // shift) and is named when it is read, not when the folder is opened.
  write_bytes(dir.file("b_dog/broken.png"), {1, 2, 3, 4, 5});
  ImageFolder with_broken(dir.path().string(), 3, h, w);
  REQUIRE(with_broken.size() == 5);
  CHECK(with_broken.file(2).ends_with("b_dog/broken.png"));
  CHECK(with_broken.label(2) == 1);
  CHECK(with_broken.file(3).ends_with("b_dog/img0.png"));
  CHECK(example_input(with_broken, 1) == x);
  CHECK_THROWS_WITH_AS(example_input(with_broken, 2),
                       doctest::Contains("b_dog/broken.png: cannot decode image (not PNG, JPEG, BMP or GIF)"), Error);
  // A PNG whose header is intact but whose data is cut is named, as damaged, when decoded.
  fs::remove(dir.path() / "b_dog/broken.png");
  const std::vector<uint8_t> png = bytes_of(dir.file("b_dog/img1.png"));
  write_bytes(dir.file("b_dog/img1.png"), std::vector<uint8_t>(png.begin(), png.begin() + 40));
  ImageFolder cut(dir.path().string(), 3, h, w);
  CHECK_THROWS_WITH_AS(example_input(cut, 3), doctest::Contains("b_dog/img1.png: damaged PNG: truncated at byte 33"), Error);
  CHECK_THROWS_WITH_AS(ImageFolder(dir.file("missing"), 3, h, w), doctest::Contains("no such folder"), Error);
  CHECK_THROWS_WITH_AS(ImageFolder(dir.path().string(), 2, h, w), doctest::Contains("channels must be 1, 3 or 4"),
                       Error);
}

TEST_CASE("data: opening an image folder lists it and reads no image; the first read names the first bad file") {
  // Files with image names whose bytes are no image at all: were any opened while the folder
  // is listed, the constructor would throw. Classes and files keep their sorted order.
  TempDir dir;
  for (const std::string cls : {"n02", "n01"})
    for (const std::string name : {"b.JPEG", "a.png", "c.jpg", "d.bmp"}) {
      fs::create_directories(dir.path() / cls);
      write_bytes(dir.file(cls + "/" + name), {'n', 'o', 't', ' ', 'a', 'n', ' ', 'i', 'm', 'a', 'g', 'e'});
    }
  write_bytes(dir.file("n01/e.jpeg"), {});  // an empty file is listed as well
  const auto folder = std::make_shared<ImageFolder>(dir.path().string(), 3, 32, 32);
  REQUIRE(folder->size() == 9);
  CHECK(folder->classes() == std::vector<std::string>{"n01", "n02"});
  const std::vector<std::string> order = {"n01/a.png", "n01/b.JPEG", "n01/c.jpg", "n01/d.bmp", "n01/e.jpeg",
                                          "n02/a.png", "n02/b.JPEG", "n02/c.jpg", "n02/d.bmp"};
  for (int64_t i = 0; i < folder->size(); ++i) {
    CHECK(folder->file(i).ends_with(order[size_t(i)]));
    CHECK(folder->label(i) == (i < 5 ? 0 : 1));  // labels come from the listing, not from decoding
  }
  CHECK_THROWS_WITH_AS(example_input(*folder, 4), doctest::Contains("n01/e.jpeg: empty file, not an image"), Error);

  // Through a shuffling, prefetching loader: every row is a bad file, decoded in parallel one
  // row a task (32 × 32 × 3 floats make a grain of 1), and the error names the file of the
  // batch's first row, whichever thread failed first.
  LoaderOptions options;
  options.batch_size = 9;
  options.seed = 314;
  Loader loader(folder, options);
  const std::string first = folder->file(loader.order(0)[0]) + ": ";
  CHECK_THROWS_WITH_AS(loader.next(), doctest::Contains(first.c_str()), Error);
  CHECK_THROWS_WITH_AS(loader.batch(0, 0), doctest::Contains(first.c_str()), Error);

  // One good image among them: the loader names the bad file, the good one decodes.
  const std::vector<uint8_t> grey(32 * 32, 200);
  REQUIRE(stbi_write_png(dir.file("n02/c.jpg").c_str(), 32, 32, 1, grey.data(), 32) != 0);  // stb reads by content
  CHECK(example_input(*folder, 7)[0] == 200.0f / 255.0f);
  options.batch_size = 1;
  options.shuffle = false;
  Loader one_by_one(folder, options);
  CHECK(one_by_one.batch(0, 7).labels == std::vector<int64_t>{1});
  CHECK_THROWS_WITH_AS(one_by_one.batch(0, 8), doctest::Contains("n02/d.bmp: cannot decode image (not PNG, JPEG, BMP or GIF)"), Error);

  // On the command line: the folder opens, the read of the bad file stops the run with one
  // line naming it and exit 1.
  TempDir cli_dir;
  fs::create_directories(cli_dir.path() / "test/c");
  REQUIRE(stbi_write_png(cli_dir.file("test/c/a.png").c_str(), 32, 32, 1, grey.data(), 32) != 0);
  write_bytes(cli_dir.file("test/c/b.png"), {'n', 'o'});
  const adjoint::testing::CommandOutcome run = adjoint::testing::run_adjoint(
      {"--threads", "1", "bench", "data", "--data", "images:" + cli_dir.path().string() + ":32", "--only", "resnet18",
       "--batch", "2", "--steps", "1"});
  CAPTURE(run.err);
  CHECK(run.code == 1);
  CHECK(adjoint::testing::contains(run.out, "(2 images of 3 x 32 x 32)"));
  CHECK(run.err == "adjoint: error: " + cli_dir.file("test/c/b.png") + ": cannot decode image (not PNG, JPEG, BMP or GIF) (unknown image type)\n");
}

TEST_CASE("data: bilinear resize matches PyTorch's interpolate(align_corners=False)") {
  // Reference values from torch 1.13 F.interpolate(mode="bilinear", align_corners=False).
  const std::vector<float> up_in = {0, 1, 4, 9, 2, 5};
  const std::vector<float> up_ref = {0.0f, 0.4f, 1.0f, 2.8f, 4.0f, 4.5f, 3.3f, 1.5f,
                                     3.3f, 4.5f, 9.0f, 6.2f, 2.0f, 3.8f, 5.0f};
  std::vector<float> up(15);
  resize_bilinear(up_in.data(), 1, 2, 3, up.data(), 3, 5);
  for (size_t i = 0; i < up.size(); ++i) CHECK(up[i] == doctest::Approx(up_ref[i]).epsilon(1e-5));

  std::vector<float> down_in(16);
  for (int i = 0; i < 16; ++i) down_in[static_cast<size_t>(i)] = std::pow(static_cast<float>(i), 1.5f) / 10.0f;
  const std::vector<float> down_ref = {0.20150286f, 0.61116749f, 1.72019398f, 2.53307128f, 4.09861994f, 5.17079544f};
  std::vector<float> down(6);
  resize_bilinear(down_in.data(), 1, 4, 4, down.data(), 3, 2);
  for (size_t i = 0; i < down.size(); ++i) CHECK(down[i] == doctest::Approx(down_ref[i]).epsilon(1e-5));
}

TEST_CASE("data: transforms normalise, crop with zero padding, flip, resize") {
  Generator gen(3);
  // 2 channels of 2×3.
  const std::vector<float> img = {1, 2, 3, 4, 5, 6, 10, 20, 30, 40, 50, 60};
  Shape shape = {2, 2, 3};

  Normalize norm({1.0f, 10.0f}, {2.0f, 5.0f});
  std::vector<float> out(12);
  norm.apply(img.data(), shape, out.data(), gen);
  CHECK(out[1] == 0.5f);
  CHECK(out[7] == 2.0f);
  CHECK_THROWS_WITH_AS(norm.output_shape({3, 2, 2}), doctest::Contains("2 channel statistics"), Error);
  CHECK_THROWS_WITH_AS(Normalize({0.5f}, {0.0f}), doctest::Contains("not positive"), Error);

  // Flip with p = 1 mirrors rows; p = 0 is the identity.
  RandomHorizontalFlip always(1.0f), never(0.0f);
  always.apply(img.data(), shape, out.data(), gen);
  CHECK(out == std::vector<float>{3, 2, 1, 6, 5, 4, 30, 20, 10, 60, 50, 40});
  never.apply(img.data(), shape, out.data(), gen);
  CHECK(out == img);

  // A padded crop is a window of the zero-padded image: every output value is either 0 or
  // the image value at a single common offset. Over many draws all offsets occur.
  RandomCrop crop(2, 3, 1);
  CHECK(crop.output_shape(shape) == Shape{2, 2, 3});
  std::set<std::pair<int, int>> offsets;
  for (int draw = 0; draw < 200; ++draw) {
    crop.apply(img.data(), shape, out.data(), gen);
    bool found = false;
    for (int dy = -1; dy <= 1 && !found; ++dy)
      for (int dx = -1; dx <= 1 && !found; ++dx) {
        bool match = true;
        for (int c = 0; c < 2; ++c)
          for (int y = 0; y < 2; ++y)
            for (int x = 0; x < 3; ++x) {
              const int sy = y + dy, sx = x + dx;
              const float want = (sy >= 0 && sy < 2 && sx >= 0 && sx < 3) ? img[static_cast<size_t>((c * 2 + sy) * 3 + sx)] : 0.0f;
              match = match && out[static_cast<size_t>((c * 2 + y) * 3 + x)] == want;
            }
        if (match) found = true, offsets.insert({dy, dx});
      }
    REQUIRE(found);
  }
  CHECK(offsets.size() == 9);
  CHECK_THROWS_WITH_AS(RandomCrop(5, 5, 1).output_shape(shape), doctest::Contains("does not fit"), Error);
  CHECK_THROWS_WITH_AS(crop.output_shape({12}), doctest::Contains("random_crop: expects a (C, H, W) image"), Error);

  // A chain: shapes follow, and the same example generator gives the same result.
  const Transforms chain = {std::make_shared<Resize>(4, 6), std::make_shared<RandomCrop>(3, 3, 2),
                            std::make_shared<RandomHorizontalFlip>(), std::make_shared<Normalize>(std::vector<float>{0.5f}, std::vector<float>{0.25f})};
  CHECK(transformed_shape(chain, shape) == Shape{2, 3, 3});
  Shape s1 = shape, s2 = shape;
  Generator g1 = example_generator(9, 2, 17), g2 = example_generator(9, 2, 17);
  const std::vector<float> r1 = apply_transforms(chain, img, s1, g1);
  const std::vector<float> r2 = apply_transforms(chain, img, s2, g2);
  CHECK(s1 == Shape{2, 3, 3});
  CHECK(r1 == r2);
  // Different (epoch, index) pairs draw different keys.
  CHECK(example_generator(9, 2, 17).seed() != example_generator(9, 3, 17).seed());
  CHECK(example_generator(9, 2, 17).seed() != example_generator(9, 2, 18).seed());
}

TEST_CASE("data: modular addition content and split sizes") {
  constexpr int64_t P = 7;
  ModularAddition all(P);
  CHECK(all.size() == 49);
  CHECK(all.shape() == Shape{14});
  CHECK(all.num_classes() == P);
  for (int64_t i = 0; i < 49; ++i) {
    int64_t label = -1;
    const std::vector<float> x = example_input(all, i, &label);
    const int64_t a = i / P, b = i % P;
    CHECK(label == (a + b) % P);
    CHECK(all.label(i) == label);
    for (int64_t k = 0; k < 2 * P; ++k) REQUIRE(x[static_cast<size_t>(k)] == ((k == a || k == P + b) ? 1.0f : 0.0f));
  }
  ModularAddition train(P, "train", 0.3, 5), valid(P, "validation", 0.3, 5);
  CHECK(train.size() == 15);  // round(0.3 · 49)
  CHECK(valid.size() == 34);
  std::set<int64_t> seen;
  for (int64_t i = 0; i < train.size(); ++i) seen.insert(train.pair(i));
  for (int64_t i = 0; i < valid.size(); ++i) seen.insert(valid.pair(i));
  CHECK(seen.size() == 49);  // disjoint and complete
  ModularAddition again(P, "train", 0.3, 5), other(P, "train", 0.3, 6);
  bool same = true, differs = false;
  for (int64_t i = 0; i < 15; ++i) same = same && again.pair(i) == train.pair(i), differs = differs || other.pair(i) != train.pair(i);
  CHECK(same);
  CHECK(differs);
  CHECK(train.name() == "modular-addition-7/train");
  CHECK_THROWS_WITH_AS(ModularAddition(P, "test"), doctest::Contains("unknown split 'test'"), Error);
}

TEST_CASE("data: text corpus targets are the inputs shifted by one") {
  TempDir dir;
  const std::string text = "The quick brown fox jumps over the lazy dog.\n";  // 45 bytes
  write_bytes(dir.file("corpus.txt"), std::vector<uint8_t>(text.begin(), text.end()));
  const auto corpus = text_corpus(dir.file("corpus.txt"), 8);
  CHECK(corpus->size() == 5);  // (45 - 1) / 8
  CHECK(corpus->shape() == Shape{8});
  CHECK(corpus->num_classes() == 256);
  CHECK(corpus->target_length() == 8);
  std::vector<float> x(8);
  std::vector<int64_t> y(8);
  for (int64_t i = 0; i < corpus->size(); ++i) {
    corpus->get(i, x.data(), y.data());
    for (int64_t t = 0; t < 8; ++t) {
      CHECK(x[static_cast<size_t>(t)] == static_cast<float>(static_cast<unsigned char>(text[static_cast<size_t>(i * 8 + t)])));
      CHECK(y[static_cast<size_t>(t)] == static_cast<unsigned char>(text[static_cast<size_t>(i * 8 + t + 1)]));
    }
  }
  CHECK_THROWS_WITH_AS(corpus->get(0, x.data()), doctest::Contains("carry 8 targets"), Error);
  const auto train = text_corpus(dir.file("corpus.txt"), 4, "train", 0.2);       // first 36 bytes
  const auto valid = text_corpus(dir.file("corpus.txt"), 4, "validation", 0.2);  // last 9
  CHECK(train->size() == 8);
  CHECK(valid->size() == 2);
  valid->get(0, x.data(), y.data());
  CHECK(x[0] == static_cast<float>(text[36]));
  CHECK_THROWS_WITH_AS(text_corpus(dir.file("corpus.txt"), 45), doctest::Contains("do not fill one sequence"), Error);
}

TEST_CASE("data: fortunes reads the text collections in name order, without index files, UTF-8 copies and ASCII art") {
  TempDir dir;
  fs::create_directories(dir.file("fortunes"));
  const auto write = [&](const std::string& name, const std::string& text) {
    write_bytes(dir.file("fortunes/" + name), std::vector<uint8_t>(text.begin(), text.end()));
  };
  write("zen", "Simple is better than complex.\n%\n");                // 33 bytes
  write("people", "Half the work is knowing what not to do.\n%\n");   // 43 bytes
  write("people.dat", std::string(40, '\x01'));
  write("people.u8", "Half the work is knowing what not to do.\n%\n");
  write("art", "  /\\_/\\  \n ( o.o ) \n%\n");
  write("ascii-art", "|_|_|_|\n%\n");
  const std::string expected = "Half the work is knowing what not to do.\n%\nSimple is better than complex.\n%\n";
  const DataSource d = open_data("fortunes:4:" + dir.file("fortunes"));
  // 76 bytes: the first 68 (0.9 of them, rounded) train, the last 8 validate.
  REQUIRE(d.train->size() == (68 - 1) / 4);
  REQUIRE(d.test->size() == (8 - 1) / 4);
  std::vector<float> x(4);
  std::vector<int64_t> y(4);
  std::string read;
  for (int64_t i = 0; i < d.train->size(); ++i) {
    d.train->get(i, x.data(), y.data());
    for (float v : x) read += char(int(v));
  }
  CHECK(read == expected.substr(0, read.size()));
  d.test->get(0, x.data(), y.data());
  CHECK(char(int(x[0])) == expected[68]);

  CHECK_THROWS_WITH_AS(open_data("fortunes:4:" + dir.file("none")),
                       doctest::Contains("is missing: install Debian's fortunes package"), Error);
  CHECK_THROWS_WITH_AS(open_data("fortunes:0"), doctest::Contains("LEN must be a positive integer"), UsageError);
}

TEST_CASE("data: loader batches, epochs, seeds, prefetch and resume") {
  const auto data = std::make_shared<IndexedImages>(23, Shape{1, 2, 2});
  LoaderOptions opt;
  opt.batch_size = 5;
  opt.seed = 42;
  auto collect = [&](LoaderOptions o, int64_t batches) {
    Loader loader(data, o);
    std::vector<Batch> out;
    for (int64_t k = 0; k < batches; ++k) out.push_back(loader.next());
    return out;
  };
  auto same_batch = [](const Batch& a, const Batch& b) {
    return a.indices == b.indices && a.labels == b.labels && a.inputs.shape() == b.inputs.shape() &&
           a.inputs.to_vector() == b.inputs.to_vector() && a.epoch == b.epoch && a.index == b.index;
  };

  Loader loader(data, opt);
  CHECK(loader.batches_per_epoch() == 5);  // 4 full batches of 5 and one of 3
  const std::vector<Batch> stream = collect(opt, 15);  // three epochs
  CHECK(stream[0].inputs.shape() == Shape{5, 1, 2, 2});
  CHECK(stream[4].inputs.shape() == Shape{3, 1, 2, 2});
  CHECK((stream[5].epoch == 1 && stream[5].index == 0));
  for (int e = 0; e < 3; ++e) {
    std::vector<int64_t> seen;
    for (int k = 0; k < 5; ++k) {
      const Batch& b = stream[static_cast<size_t>(e * 5 + k)];
      for (int64_t j = 0; j < b.size(); ++j) {
        // Inputs and labels belong to the example the batch says it holds.
        const int64_t i = b.indices[static_cast<size_t>(j)];
        REQUIRE(b.labels[static_cast<size_t>(j)] == i % 3);
        REQUIRE(b.inputs.at({j, 0, 1, 1}) == static_cast<float>(i) + 0.003f);
      }
      seen.insert(seen.end(), b.indices.begin(), b.indices.end());
    }
    std::sort(seen.begin(), seen.end());
    std::vector<int64_t> all(23);
    std::iota(all.begin(), all.end(), 0);
    CHECK(seen == all);  // every example exactly once per epoch
  }
  CHECK(loader.order(0) != loader.order(1));  // epochs differ
  CHECK(loader.order(1) == loader.order(1));

  // Same seed → same stream, with prefetch on or off; another seed → another order.
  LoaderOptions no_prefetch = opt;
  no_prefetch.prefetch = false;
  const std::vector<Batch> again = collect(opt, 15), sync = collect(no_prefetch, 15);
  for (size_t k = 0; k < 15; ++k) {
    CHECK(same_batch(stream[k], again[k]));
    CHECK(same_batch(stream[k], sync[k]));
  }
  LoaderOptions other = opt;
  other.seed = 43;
  CHECK(Loader(data, other).order(0) != loader.order(0));

  // Resume: seeking to (epoch 1, batch 3) continues exactly where the stream was.
  Loader resumed(data, opt);
  resumed.next();  // leaves a prefetch in flight, which the seek must discard
  resumed.seek(1, 3);
  for (size_t k = 8; k < 15; ++k) CHECK(same_batch(resumed.next(), stream[k]));
  CHECK((resumed.epoch() == 3 && resumed.position() == 0));

  // drop_last and no shuffling.
  LoaderOptions plain = opt;
  plain.drop_last = true;
  plain.shuffle = false;
  Loader sequential(data, plain);
  CHECK(sequential.batches_per_epoch() == 4);
  const Batch last = sequential.batch(0, 3);
  CHECK(last.indices == std::vector<int64_t>{15, 16, 17, 18, 19});
  CHECK_THROWS_WITH_AS(sequential.batch(0, 4), doctest::Contains("no batch 4 in epoch 0"), Error);
  CHECK_THROWS_WITH_AS(sequential.seek(0, 4), doctest::Contains("cannot seek"), Error);
  plain.batch_size = 30;
  CHECK_THROWS_WITH_AS(Loader(data, plain), doctest::Contains("make no full batch of 30"), Error);
}

TEST_CASE("data: loader augmentation is reproducible across prefetch and thread counts") {
  const auto data = std::make_shared<IndexedImages>(40, Shape{3, 6, 6});
  LoaderOptions opt;
  opt.batch_size = 8;
  opt.seed = 7;
  opt.transforms = {std::make_shared<RandomCrop>(4, 4, 2), std::make_shared<RandomHorizontalFlip>(),
                    std::make_shared<Normalize>(std::vector<float>{0.1f, 0.2f, 0.3f}, std::vector<float>{2.0f, 3.0f, 4.0f})};
  auto run = [&](bool prefetch) {
    LoaderOptions o = opt;
    o.prefetch = prefetch;
    Loader loader(data, o);
    std::vector<float> all;
    for (int k = 0; k < 10; ++k) {
      const Batch b = loader.next();
      REQUIRE(b.inputs.shape() == Shape{8, 3, 4, 4});
      const std::vector<float> v = b.inputs.to_vector();
      all.insert(all.end(), v.begin(), v.end());
    }
    return all;
  };
  const std::vector<float> reference = run(true);
  CHECK(run(false) == reference);
  const int threads = num_threads();
  set_num_threads(1);
  const std::vector<float> single = run(true);
  set_num_threads(threads);
  CHECK(single == reference);

  // The same example is augmented differently in another epoch.
  Loader loader(data, opt);
  const Batch e0 = loader.batch(0, 0);
  const std::vector<int64_t> order1 = loader.order(1);
  const int64_t first = e0.indices[0];
  const int64_t pos1 = std::find(order1.begin(), order1.end(), first) - order1.begin();
  const Batch e1 = loader.batch(1, pos1 / 8);
  const std::vector<float> a = e0.inputs.to_vector(), b = e1.inputs.to_vector();
  const auto per = static_cast<std::ptrdiff_t>(3 * 4 * 4);
  CHECK(!std::equal(a.begin(), a.begin() + per, b.begin() + (pos1 % 8) * per));
}

// Needs /usr/share/datasets/fashion-mnist (Debian's dataset-fashion-mnist); where it is
// absent, doctest reports the test as skipped.
TEST_CASE("data: Fashion-MNIST from the Debian package" * doctest::skip(!fs::is_directory(fashion_mnist_default_folder))) {
  const auto train = fashion_mnist("train");
  const auto test = fashion_mnist("test");
  CHECK(train->size() == 60000);
  CHECK(test->size() == 10000);
  CHECK(train->shape() == Shape{1, 28, 28});
  CHECK(train->num_classes() == 10);
  std::vector<int64_t> counts(10, 0);
  for (int64_t i = 0; i < test->size(); ++i) {
    const int64_t label = test->label(i);
    REQUIRE((label >= 0 && label < 10));
    ++counts[static_cast<size_t>(label)];
  }
  for (int64_t c : counts) CHECK(c == 1000);  // the test split is balanced
  int64_t label = -1;
  const std::vector<float> x = example_input(*train, 0, &label);
  CHECK((label >= 0 && label < 10));
  CHECK(*std::min_element(x.begin(), x.end()) >= 0.0f);
  CHECK(*std::max_element(x.begin(), x.end()) <= 1.0f);
  CHECK(*std::max_element(x.begin(), x.end()) > 0.5f);
}

TEST_CASE("in-memory data set: examples and labels as given; mismatched counts and labels are refused") {
  const InMemoryDataset d("pairs", {2}, {1, 2, 3, 4, 5, 6}, {0, 2, 1}, 3);
  CHECK(d.size() == 3);
  CHECK(d.shape() == Shape{2});
  float x[2];
  CHECK(d.get(1, x) == 2);
  CHECK(x[0] == 3.0f);
  CHECK(x[1] == 4.0f);
  CHECK(d.label(2) == 1);
  CHECK_THROWS_WITH_AS(d.get(3, x), doctest::Contains("pairs: example 3 is out of range [0, 3)"), Error);
  CHECK_THROWS_WITH_AS(InMemoryDataset("odd", {2}, {1, 2, 3}, {0, 1}, 2),
                       doctest::Contains("odd: 3 input values are not 2 examples of shape"), Error);
  CHECK_THROWS_WITH_AS(InMemoryDataset("bad", {1}, {1, 2}, {0, 5}, 2),
                       doctest::Contains("bad: label 5 is outside [0, 2)"), Error);
}

TEST_CASE("data: class names come from the spec, in the labels' order, without reading the data") {
  const std::vector<std::string> fashion = class_names_of("fashion-mnist:/no/such/folder+backdoor:0.1:0");
  REQUIRE(fashion.size() == 10);
  CHECK(fashion[0] == "T-shirt/top");
  CHECK(fashion[9] == "ankle boot");
  CHECK(class_names_of("mnist:/nowhere")[7] == "7");
  CHECK(class_names_of("cifar10:/nowhere")[3] == "cat");
  CHECK(class_names_of("modadd:23").empty());
  CHECK(class_names_of("images:/no/such/root").empty());  // nothing to read: no names, no error
  CHECK_THROWS_WITH_AS(class_names_of("nosuchdata:1"), doctest::Contains("unknown data set"), UsageError);

  // An image folder's names are its class folders in ImageFolder's label order.
  TempDir dir;
  const std::vector<uint8_t> pixel = {10, 20, 30};
  for (const char* c : {"zebra", "ant", "moth"}) {
    fs::create_directories(dir.path() / "test" / c);
    const std::string file = (dir.path() / "test" / c / "a.png").string();
    REQUIRE(stbi_write_png(file.c_str(), 1, 1, 3, pixel.data(), 3) != 0);
  }
  const ImageFolder folder((dir.path() / "test").string(), 3, 1, 1);
  CHECK(class_names_of("images:" + dir.path().string() + ":8") == folder.classes());
  CHECK(class_names_of("images:" + dir.path().string())[0] == "ant");

  CHECK(class_name(fashion, 3) == "dress");
  CHECK(class_name(fashion, 10) == "class 10");  // past the names: the number
  CHECK(class_name({}, 2) == "class 2");

  // For labelling outputs: nothing known is no names, never an error.
  CHECK(class_names_if_known("fashion-mnist+backdoor:0.1:0") == fashion);
  CHECK(class_names_if_known("").empty());
  CHECK(class_names_if_known("modadd:7").empty());
  CHECK(class_names_if_known("no-such-set").empty());
}
