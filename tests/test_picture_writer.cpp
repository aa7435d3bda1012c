// The report's pictures are encoded by a thread of their own while the report goes on
// (analysis/pullbacks/picture_writer.h): each file must hold the bytes write_png writes
// alone, whatever the threads and the order, and an error must reach the caller.
#include <doctest/doctest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "analysis/common/heatmap.h"
#include "analysis/pullbacks/explain.h"
#include "analysis/pullbacks/picture_writer.h"
#include "analysis/pullbacks/report.h"
#include "engine/error.h"
#include "engine/io/files.h"
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

namespace {

// True when the two tensors have the same shape and the same values.
bool same(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && std::equal(x.data(), x.data() + x.numel(), y.data());
}

// The names of the files in `folder`, recursively, relative to it.
std::vector<std::string> files_under(const fs::path& folder) {
  std::vector<std::string> names;
  for (const auto& entry : fs::recursive_directory_iterator(folder))
    if (entry.is_regular_file()) names.push_back(fs::relative(entry.path(), folder).string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_CASE("picture writer: other files queued beside the pictures are written whole; a failure mid-way leaves nothing") {
  const std::map<std::string, Tensor> tensors = {{"maps", random_tensor({4, 3, 5, 5}, 3, -1.0f, 1.0f)},
                                                 {"targets", random_tensor({4}, 4, 0.0f, 9.0f)}};
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    TempDir dir;
    {
      PictureWriter writer;
      writer.write(dir.file("a.png"), test_picture(1));
      writer.write([&] { write_safetensors(dir.file("maps.safetensors"), tensors, {{"method", "gradient"}}); });
      writer.write(dir.file("b.png"), test_picture(2));
      writer.finish();
      const SafetensorsFile back = read_safetensors(dir.file("maps.safetensors"));
      for (const auto& [name, t] : tensors) CHECK(same(back.tensors.at(name), t));
      CHECK(read_text(dir.path() / "b.png") == encode_png(test_picture(2)));

      // A file whose writing fails half-way (an error after its first bytes): finish() throws
      // it, the files queued beside it are written, and neither the file nor a temporary of it
      // is left.
      writer.write([&] {
        AtomicFile file(dir.file("half.bin"), "test");
        file.write(std::string(1000, 'x'));
        throw Error(cat("test: ", file.path(), ": failed after 1000 bytes"));
      });
      writer.write(dir.file("c.png"), test_picture(3));
      CHECK_THROWS_WITH_AS(writer.finish(), doctest::Contains("half.bin"), Error);
      CHECK(read_text(dir.path() / "c.png") == encode_png(test_picture(3)));
      writer.write([&] { write_safetensors(dir.file("missing/maps.safetensors"), tensors, {}); });
      CHECK_THROWS_WITH_AS(writer.finish(), doctest::Contains("missing/maps.safetensors"), Error);
      CHECK(files_under(dir.path()) == std::vector<std::string>{"a.png", "b.png", "c.png", "maps.safetensors"});
      writer.finish();  // each error is reported once
    }
  }
  set_num_threads(2);
  {  // A writer destroyed with files still queued writes them (its thread runs them) first.
    TempDir dir;
    {
      PictureWriter writer;
      for (int i = 0; i < 4; ++i)
        writer.write([&, i] { write_safetensors(dir.file(cat("m", i, ".safetensors")), tensors, {}); });
    }
    for (int i = 0; i < 4; ++i) CHECK(read_safetensors(dir.file(cat("m", i, ".safetensors"))).tensors.size() == 2);
  }
  set_num_threads(0);
}

TEST_CASE("explain report: beside_last_files runs once, after the pictures and tables, beside the maps' files") {
  Generator gen(5);
  const auto model = make_model(grey_resnet18(0.0625, 28, 10), gen);
  model->train(false);
  const Tensor x = random_tensor({3, 1, 28, 28}, 23, -1.0f, 1.0f);
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    TempDir dir;
    ReportOptions o;
    o.methods = {"gradient", "soft_pullback"};
    o.metrics = {"sparseness"};
    o.batch_size = 2;
    o.out_dir = dir.path().string();
    o.normalisation = {{0.5f}, {0.5f}};
    o.explain.range = {-1.0f, 1.0f};
    int calls = 0;
    std::vector<std::string> given;
    o.beside_last_files = [&](const std::vector<std::string>& files) {
      ++calls;
      given = files;
      for (const std::string& file : files)  // every picture and table is whole on disk by now
        if (!file.ends_with(".safetensors")) {
          CAPTURE(file);
          CHECK(fs::exists(file));
          CHECK(!fs::exists(file + cat(".tmp.", ::getpid())));
        }
    };
    const ReportResult r = explain_report(*model, x, {}, o);
    CHECK(calls == 1);
    CHECK(given == r.files);
    CHECK(r.files.size() == 3 * 6 + 2 + 3);  // pictures, 2 attribution files, 3 tables
    // The maps' files were written beside it, and are whole when the report returns.
    for (const std::string& method : o.methods) {
      const SafetensorsFile maps = read_safetensors(dir.file("attributions_" + method + ".safetensors"));
      CHECK(same(maps.tensors.at("inputs"), x));
      CHECK(maps.tensors.at("attributions").shape() == x.shape());
    }
  }
  set_num_threads(0);
}

TEST_CASE("explain report: the maps' files, written as the batches finish, are whole; a report stopped leaves none") {
  Generator gen(5);
  const auto model = make_model(grey_resnet18(0.0625, 28, 10), gen);
  model->train(false);
  const Tensor x = random_tensor({5, 1, 28, 28}, 31, -1.0f, 1.0f);
  const std::vector<std::string> methods = {"gradient", "gradient_ascent"};
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    ReportOptions o;
    o.methods = methods;
    o.batch_size = 2;  // three batches, the last of one image
    o.explain.ascent_steps = 1;
    o.normalisation = {{0.5f}, {0.5f}};
    o.explain.range = {-1.0f, 1.0f};
    TempDir dir;
    o.out_dir = dir.path().string();
    o.picture_images = 0;
    const ReportResult r = explain_report(*model, x, {}, o);
    // Every image's gradient in its place: the whole batch's, made here.
    const Tensor gradient = explain("gradient", *model, x, r.targets, o.explain);
    const std::vector<float> expected = gradient.to_vector();
    float largest = 0;
    for (float v : expected) largest = std::max(largest, std::abs(v));
    REQUIRE(largest > 0);
    for (const std::string& method : methods) {
      CAPTURE(method);
      const SafetensorsFile maps = read_safetensors(dir.file("attributions_" + method + ".safetensors"));
      CHECK(same(maps.tensors.at("inputs"), x));
      CHECK(maps.tensors.at("attributions").shape() == x.shape());
      CHECK(maps.tensors.at("targets").to_vector() == std::vector<float>(r.targets.begin(), r.targets.end()));
      CHECK(maps.tensors.count("counterfactuals") == (method == "gradient_ascent" ? 1 : 0));
      if (method != "gradient") continue;
      const std::vector<float> written = maps.tensors.at("attributions").to_vector();
      int64_t misplaced = 0;
      for (size_t k = 0; k < expected.size(); ++k) misplaced += std::abs(written[k] - expected[k]) > 1e-4f * largest;
      CHECK(misplaced == 0);
    }

    // Stopped after the second batch's first method (the progress callback throws): the
    // files begun are dropped with their temporaries.
    TempDir stopped;
    o.out_dir = stopped.path().string();
    const auto stop = [](int64_t done, int64_t, double, const std::string&) {
      if (done >= 4) throw Error("stopped");
    };
    CHECK_THROWS_WITH_AS(explain_report(*model, x, {}, o, stop), "stopped", Error);
    CHECK(files_under(stopped.path()).empty());
  }
  set_num_threads(0);
}

TEST_CASE("explain report: a maps' file that cannot be written fails the report by name and leaves no temporary") {
  Generator gen(5);
  const auto model = make_model(grey_resnet18(0.0625, 28, 10), gen);
  model->train(false);
  const Tensor x = random_tensor({2, 1, 28, 28}, 29, -1.0f, 1.0f);
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    set_num_threads(threads);
    TempDir dir;
    // A folder where the file should go: the temporary is written, then cannot be renamed.
    fs::create_directories(dir.path() / "attributions_gradient.safetensors");
    ReportOptions o;
    o.methods = {"gradient", "soft_pullback"};
    o.out_dir = dir.path().string();
    o.normalisation = {{0.5f}, {0.5f}};
    o.explain.range = {-1.0f, 1.0f};
    int calls = 0;
    o.beside_last_files = [&](const std::vector<std::string>&) { ++calls; };
    CHECK_THROWS_WITH_AS(explain_report(*model, x, {}, o), doctest::Contains("attributions_gradient.safetensors"), Error);
    CHECK(calls == 1);
    for (const std::string& name : files_under(dir.path())) {
      CAPTURE(name);
      CHECK(name.find(".tmp.") == std::string::npos);
    }
    // The other method's file and every picture are whole.
    CHECK(read_safetensors(dir.file("attributions_soft_pullback.safetensors")).tensors.size() == 3);
    CHECK(read_text(dir.path() / "image_0001" / "sheet.png").starts_with("\x89PNG"));
  }
  set_num_threads(0);
}
