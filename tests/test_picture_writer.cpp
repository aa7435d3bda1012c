// The report's pictures are encoded by a thread of their own while the report goes on
// (analysis/pullbacks/picture_writer.h): each file must hold the bytes write_png writes
// alone, whatever the threads and the order, and an error must reach the caller.
#include <doctest/doctest.h>

#include <filesystem>
#include <string>

#include "analysis/common/heatmap.h"
#include "analysis/pullbacks/picture_writer.h"
#include "analysis/pullbacks/report.h"
#include "engine/error.h"
#include "engine/io/safetensors.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "models/model.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;
namespace fs = std::filesystem;

namespace {

// A picture whose pixels depend on `seed`, so that files swapped between paths show.
Image test_picture(int64_t seed) {
  Image image(37, 23);
  for (int64_t y = 0; y < image.height; ++y)
    for (int64_t x = 0; x < image.width; ++x)
      image.set(x, y, {uint8_t((x * 7 + seed * 31) % 256), uint8_t((y * 11 + seed) % 256), uint8_t((x * y + seed) % 256)});
  return image;
}

// Image i of a batch (N, C, H, W), contiguous.
Tensor one_image(const Tensor& batch, int64_t i) {
  const int64_t C = batch.size(1), H = batch.size(2), W = batch.size(3);
  return batch.view_as_strided({C, H, W}, {H * W, W, 1}, i * C * H * W).contiguous();
}

}  // namespace

TEST_CASE("picture writer: every file holds write_png's bytes, at 1 and 2 threads; an error reaches finish") {
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    TempDir dir;
    {
      PictureWriter writer;
      for (int64_t i = 0; i < 12; ++i) writer.write((dir.path() / cat("p", i, ".png")).string(), test_picture(i));
      writer.finish();
      for (int64_t i = 0; i < 12; ++i) {
        CAPTURE(i);
        CHECK(read_text(dir.path() / cat("p", i, ".png")) == encode_png(test_picture(i)));
      }
      // A picture that cannot be written: its error comes out of finish(), naming the path,
      // and the pictures queued beside it are still written.
      writer.write((dir.path() / "missing" / "bad.png").string(), test_picture(0));
      writer.write((dir.path() / "after.png").string(), test_picture(5));
      CHECK_THROWS_WITH_AS(writer.finish(), doctest::Contains("bad.png"), Error);
      CHECK(read_text(dir.path() / "after.png") == encode_png(test_picture(5)));
      writer.finish();  // the error was reported once
    }
  }
  set_num_threads(0);
}

TEST_CASE("explain report: the pictures written beside the methods are the renders' PNG bytes") {
  Generator gen(5);
  const auto model = make_model(grey_resnet18(0.0625, 28, 10), gen);
  model->train(false);
  const Tensor x = random_tensor({3, 1, 28, 28}, 23, -1.0f, 1.0f);
  TempDir dir;
  ReportOptions o;
  o.methods = {"gradient", "soft_pullback"};
  o.batch_size = 2;  // the second batch's pictures are drawn while its methods run
  o.out_dir = dir.path().string();
  o.normalisation = {{0.5f}, {0.5f}};
  o.explain.range = {-1.0f, 1.0f};
  const ReportResult r = explain_report(*model, x, {}, o);
  const SafetensorsFile maps = read_safetensors((dir.path() / "attributions_soft_pullback.safetensors").string());
  const Tensor attr = maps.tensors.at("attributions");
  const int64_t scale = default_scale(28, 28);
  for (int64_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    const fs::path folder = dir.path() / cat("image_000", i);
    const Tensor xi = one_image(x, i), ai = one_image(attr, i);
    CHECK(read_text(folder / "input.png") == encode_png(render_input(xi, o.normalisation, scale)));
    CHECK(read_text(folder / "soft_pullback.png") == encode_png(render_heatmap(ai, scale)));
    CHECK(read_text(folder / "soft_pullback_overlay.png") == encode_png(render_overlay(xi, ai, o.normalisation, scale)));
    CHECK(fs::exists(folder / "sheet.png"));
  }
  CHECK(r.files.size() == 3 * 6 + 2);  // per image: input, 2 × (map, overlay), sheet; then 2 attribution files
}
