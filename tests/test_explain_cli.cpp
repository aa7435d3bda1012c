// Explanation reports (analysis/common/heatmap.h, analysis/pullbacks/report.h), the library path of
// `adjoint explain`: the colour map, PNG files, the metric tables and one end-to-end run
// on a tiny random model that writes every file into a temporary folder.
#include <doctest/doctest.h>
#include <stb/stb_image.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "analysis/common/heatmap.h"
#include "analysis/pullbacks/focus.h"
#include "analysis/pullbacks/report.h"
#include "engine/data/open.h"
#include "engine/error.h"
#include "engine/io/json.h"
#include "engine/random.h"
#include "engine/io/safetensors.h"
#include "models/model.h"
#include "models/model_source.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;
namespace fs = std::filesystem;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::stringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A decoded PNG, RGB.
struct Decoded {
  int width = 0, height = 0;
  std::vector<uint8_t> pixels;
};
Decoded decode_png(const fs::path& path) {
  Decoded d;
  int channels = 0;
  unsigned char* data = stbi_load(path.string().c_str(), &d.width, &d.height, &channels, 3);
  REQUIRE_MESSAGE(data != nullptr, "cannot decode ", path.string());
  d.pixels.assign(data, data + size_t(d.width) * size_t(d.height) * 3);
  stbi_image_free(data);
  return d;
}

MetricTable hand_table() {
  MetricTable t;
  t.methods = {"soft_pullback", "gradient"};
  t.metrics = {{metric_info("infidelity"), 3, "note, with a comma"}, {metric_info("faithfulness_correlation"), 3, ""}};
  t.context = {{"model", "tiny"}};
  t.rows = {{"soft_pullback", "infidelity", summarize(std::vector<double>{1, 2, 3})},
            {"gradient", "infidelity", summarize(std::vector<double>{10, 20, 30})},
            {"soft_pullback", "faithfulness_correlation", summarize(std::vector<double>{0.5, 0.6, NAN})},
            {"gradient", "faithfulness_correlation", summarize(std::vector<double>{0.1, NAN, NAN})}};
  return t;
}

}  // namespace

TEST_CASE("report: the diverging colour map is white at 0, red at +max, blue at -max") {
  CHECK(diverging_colour(0.0f, 2.0f) == Rgb{255, 255, 255});
  CHECK(diverging_colour(2.0f, 2.0f) == Rgb{255, 0, 0});
  CHECK(diverging_colour(-2.0f, 2.0f) == Rgb{0, 0, 255});
  CHECK(diverging_colour(1.0f, 2.0f) == Rgb{255, 128, 128});  // half way to red
  CHECK(diverging_colour(-1.0f, 2.0f) == Rgb{128, 128, 255});
  CHECK(diverging_colour(5.0f, 2.0f) == Rgb{255, 0, 0});  // clamped
  CHECK(diverging_colour(3.0f, 0.0f) == Rgb{255, 255, 255});  // a zero map has no scale
  CHECK(diverging_colour(NAN, 1.0f) == Rgb{255, 255, 255});
}

TEST_CASE("report: heat-maps sum channels, use a symmetric scale and enlarge by nearest neighbour") {
  // Two channels whose sum is [[2, 0], [-1, -2]]: the scale is ±2.
  const Tensor map = Tensor::from_vector({2, 2, 2}, {1, 0, -1, -1, 1, 0, 0, -1});
  const Image heat = render_heatmap(map, 3);
  REQUIRE(heat.width == 6);
  REQUIRE(heat.height == 6);
  CHECK(heat.at(0, 0) == Rgb{255, 0, 0});
  CHECK(heat.at(2, 2) == Rgb{255, 0, 0});  // the whole 3×3 block of pixel (0, 0)
  CHECK(heat.at(3, 0) == Rgb{255, 255, 255});
  CHECK(heat.at(0, 3) == Rgb{128, 128, 255});
  CHECK(heat.at(5, 5) == Rgb{0, 0, 255});
  CHECK(default_scale(28, 28) == 8);
  CHECK(default_scale(224, 224) == 1);
  CHECK(default_scale(64, 64) == 3);

  // Inputs are de-normalised: x·std + mean, clamped to [0, 1].
  const Tensor x = Tensor::from_vector({1, 1, 2}, {-1.0f, 1.0f});
  const Image in = render_input(x, {{0.5f}, {0.5f}}, 1);
  CHECK(in.at(0, 0) == Rgb{0, 0, 0});
  CHECK(in.at(1, 0) == Rgb{255, 255, 255});
  // The overlay keeps the grey input where the map is zero.
  const Image over = render_overlay(x, Tensor::from_vector({1, 1, 2}, {0.0f, 1.0f}), {{0.5f}, {0.5f}}, 1);
  CHECK(over.at(0, 0) == Rgb{0, 0, 0});
  CHECK(over.at(1, 0).r == 255);
  CHECK(over.at(1, 0).g < 255);

  CHECK_THROWS_WITH_AS(render_heatmap(Tensor::zeros({2, 2}), 1), doctest::Contains("render_heatmap"), Error);
}

TEST_CASE("report: PNG files are written atomically and decode to the same pixels") {
  TempDir dir;
  Image image(5, 3);
  image.set(0, 0, {255, 0, 0});
  image.set(4, 2, {0, 0, 255});
  image.set(2, 1, {12, 34, 56});
  const fs::path path = dir.path() / "small.png";
  write_png(path.string(), image);
  CHECK(fs::exists(path));
  for (const auto& entry : fs::directory_iterator(dir.path()))  // no temporary file is left
    CHECK(entry.path().filename().string().find(".tmp") == std::string::npos);
  const Decoded d = decode_png(path);
  REQUIRE(d.width == 5);
  REQUIRE(d.height == 3);
  CHECK(d.pixels == image.pixels);

  // A contact sheet holds its tiles below the column labels.
  const Image sheet = contact_sheet({{"input", {{Image(4, 4, {0, 0, 0}), "class 1"}}},
                                     {"soft_pullback", {{Image(4, 4, {255, 0, 0}), ""}, {Image(), ""}}}});
  CHECK(sheet.width > 8);
  CHECK(sheet.height > 4 + text_height());
  write_png((dir.path() / "sheet.png").string(), sheet);
  CHECK(decode_png(dir.path() / "sheet.png").width == sheet.width);
  CHECK_THROWS_WITH_AS(write_png((dir.path() / "no_such_dir" / "x.png").string(), image), doctest::Contains("no_such_dir"),
                       Error);
}

TEST_CASE("report: the CSV, JSON and Markdown tables have every method x metric and each direction") {
  const MetricTable t = hand_table();

  const std::vector<std::string> csv = lines_of(table_csv(t));
  REQUIRE(csv.size() == 5);  // header + 2 methods × 2 metrics
  CHECK(csv[0] == "method,metric,direction,higher_is_better,mean,std,ci_low,ci_high,count,undefined,images,note");
  CHECK(csv[1].rfind("soft_pullback,infidelity,lower is better,false,2,1,", 0) == 0);
  CHECK(csv[1].find("\"note, with a comma\"") != std::string::npos);
  CHECK(csv[3].rfind("soft_pullback,faithfulness_correlation,higher is better,true,0.55,", 0) == 0);
  CHECK(csv[4].find(",nan,nan,1,2,3,") != std::string::npos);  // one value: no std, no interval

  const Json json = parse_json(table_json(t));
  REQUIRE(json.find("metrics")->size() == 2);
  CHECK(json.find("metrics")->as_array()[0].find("direction")->as_string() == "lower is better");
  CHECK(json.find("metrics")->as_array()[1].find("higher_is_better")->as_bool());
  const Json::Array& results = json.find("results")->as_array();
  REQUIRE(results.size() == 4);
  CHECK(results[0].find("method")->as_string() == "soft_pullback");
  CHECK(results[0].find("mean")->as_number() == doctest::Approx(2.0));
  CHECK(results[0].find("ci_low")->as_number() < 2.0);
  CHECK(results[3].find("std")->is_null());  // NaN is null in JSON
  CHECK(results[3].find("undefined")->as_int() == 2);

  const std::string md = table_markdown(t);
  CHECK(md.find("| method | infidelity ↓ | faithfulness_correlation ↑ |") != std::string::npos);
  CHECK(md.find("| soft_pullback | **2** | **0.55** |") != std::string::npos);  // best of each in bold
  CHECK(md.find("| gradient | 20 | 0.1 |") != std::string::npos);
  CHECK(md.find("## infidelity ↓ (lower is better)") != std::string::npos);
  CHECK(md.find("## faithfulness_correlation ↑ (higher is better)") != std::string::npos);
  CHECK(md.find("| soft_pullback | 2 ± 1 | [") != std::string::npos);
  CHECK(md.find("95% CI") != std::string::npos);
}

TEST_CASE("report: unknown method and metric names are usage errors that list the known names") {
  CHECK_THROWS_WITH_AS(resolve_methods({"soft_pullback", "saliency"}),
                       doctest::Contains("unknown explanation method 'saliency'; known: soft_pullback, pullback"),
                       UsageError);
  CHECK_THROWS_WITH_AS(resolve_metrics({"fidelity"}), doctest::Contains("known: infidelity, max_sensitivity"), UsageError);
  CHECK_THROWS_WITH_AS(resolve_metrics({"sparseness", "sparseness"}), doctest::Contains("twice"), UsageError);
  // Columns follow the catalogue's order; "randomisation" is the short name.
  CHECK(resolve_metrics({"complexity", "randomisation", "infidelity"}) ==
        std::vector<std::string>{"infidelity", "complexity", "model_parameter_randomisation"});
  CHECK(is_expensive_metric("randomisation"));
  CHECK(!is_expensive_metric("infidelity"));
}

namespace {

// A random 1/16-width ResNet-18 for 28×28 grey images, in eval mode.
std::shared_ptr<Model> random_grey_resnet18(uint64_t seed) {
  Generator gen(seed);
  auto model = make_model(grey_resnet18(0.0625, 28, 10), gen);
  model->train(false);
  return model;
}

}  // namespace

TEST_CASE("explain cli: a report on a tiny random model writes pictures, attributions and tables") {
  const auto model = random_grey_resnet18(3);
  const Tensor x = random_tensor({2, 1, 28, 28}, 17, -1.0f, 1.0f);

  TempDir dir;
  ReportOptions o;
  o.methods = {"soft_pullback", "pullback_ascent"};
  o.metrics = {"sparseness", "infidelity"};
  o.perturbations = 10;
  o.batch_size = 1;  // two batches: the second continues the first's rows
  o.out_dir = dir.path().string();
  o.normalisation = {{0.5f}, {0.5f}};
  o.explain.range = {-1.0f, 1.0f};
  int64_t last_done = -1, last_total = -1;
  std::vector<double> work;
  const ReportResult r = explain_report(*model, x, {}, o, [&](int64_t done, int64_t total, double w, const std::string&) {
    CHECK(done >= last_done);
    last_done = done;
    last_total = total;
    work.push_back(w);
  });
  CHECK(last_done == 4);  // 2 images × 2 methods
  CHECK(last_total == 4);
  // The share of the work follows the cost model: per image, the infidelity probe costs
  // 2 × 5 forward passes (10/3 passes), the soft pullback 1 and the ascent 5 (K = 5).
  const double per_image = 10.0 / 3 + 1 + 5;
  REQUIRE(work.size() == 5);
  CHECK(work[0] == 0.0);
  CHECK(work[1] == doctest::Approx((10.0 / 3 + 1) / (2 * per_image)));
  CHECK(work[2] == doctest::Approx(0.5));
  CHECK(work[4] == doctest::Approx(1.0));
  CHECK(report_cost(o, 2, 28, 28, 1) == doctest::Approx(2 * per_image));
  REQUIRE(r.targets.size() == 2);

  for (const char* image : {"image_0000", "image_0001"})
    for (const char* file : {"input.png", "soft_pullback.png", "soft_pullback_overlay.png", "pullback_ascent.png",
                             "pullback_ascent_overlay.png", "pullback_ascent_counterfactual.png", "sheet.png"}) {
      CAPTURE(file);
      REQUIRE(fs::exists(dir.path() / image / file));
    }
  const Decoded heat = decode_png(dir.path() / "image_0000" / "soft_pullback.png");
  CHECK(heat.width == 28 * 8);
  CHECK(heat.height == 28 * 8);
  CHECK(!fs::exists(dir.path() / "image_0000" / "soft_pullback_counterfactual.png"));

  const SafetensorsFile sp = read_safetensors((dir.path() / "attributions_soft_pullback.safetensors").string());
  CHECK(sp.tensors.at("attributions").shape() == Shape{2, 1, 28, 28});
  CHECK(sp.tensors.at("inputs").shape() == Shape{2, 1, 28, 28});
  CHECK(sp.tensors.at("targets").shape() == Shape{2});
  CHECK(sp.tensors.at("targets").to_vector()[1] == float(r.targets[1]));
  // The stored map is the method's map of each image (batching does not change it).
  check_close(sp.tensors.at("attributions"), explain("soft_pullback", *model, x, r.targets), 1e-5, 1e-6,
              "stored soft pullback");
  const SafetensorsFile pa = read_safetensors((dir.path() / "attributions_pullback_ascent.safetensors").string());
  CHECK(pa.tensors.count("counterfactuals") == 1);

  const std::vector<std::string> csv = lines_of(read_text(dir.path() / "metrics.csv"));
  REQUIRE(csv.size() == 5);
  CHECK(csv[1].rfind("soft_pullback,infidelity,lower is better,", 0) == 0);
  CHECK(csv[4].rfind("pullback_ascent,sparseness,higher is better,", 0) == 0);
  CHECK(parse_json(read_text(dir.path() / "metrics.json")).find("results")->size() == 4);
  CHECK(read_text(dir.path() / "metrics.md").find("sparseness ↑") != std::string::npos);
  const MetricRow* row = r.table.find("soft_pullback", "infidelity");
  REQUIRE(row != nullptr);
  CHECK(row->summary.count == 2);
}

TEST_CASE("explain report: focus says how often the model itself names the mosaics' target class") {
  const auto model = random_grey_resnet18(4);
  const Tensor x = random_tensor({12, 1, 28, 28}, 21, -1.0f, 1.0f);
  // Half the labels the model's own classes, half another: some mosaics it names, some not.
  std::vector<int64_t> labels = predicted_classes(*model, x);
  for (size_t i = 6; i < labels.size(); ++i) labels[i] = (labels[i] + 1) % 10;

  TempDir dir;
  ReportOptions o;
  o.methods = {"gradient"};
  o.metrics = {"focus"};
  o.batch_size = 5;
  o.metric_seed = 7;
  o.out_dir = dir.path().string();
  o.explain.range = {-1.0f, 1.0f};
  const ReportResult r = explain_report(*model, x, labels, o, {});
  // The same mosaics, made and classified here.
  const Mosaics mosaics = make_mosaics(x, labels, 12, 7);
  const std::vector<int64_t> top = predicted_classes(*model, mosaics.images);
  int64_t named = 0;
  for (size_t i = 0; i < top.size(); ++i) named += top[i] == mosaics.targets[i];
  const std::string expected = cat("the model's top class is the mosaic's target class on ",
                                   std::round(1000.0 * double(named) / 12.0) / 10.0, "% of them");
  REQUIRE(r.table.metrics.size() == 1);
  CHECK_MESSAGE(contains(r.table.metrics[0].note, expected), r.table.metrics[0].note);
  CHECK(named > 0);
  CHECK(named < 12);
  // The same share is the model's figure beside the methods' rows, in the table and its files.
  REQUIRE(r.table.model_figures.size() == 1);
  CHECK(r.table.model_figures[0].column.info.name == "focus_recognition");
  CHECK(r.table.model_figures[0].summary.mean == doctest::Approx(double(named) / 12.0));
  CHECK(r.table.model_figures[0].summary.count == 12);
  const std::vector<std::string> csv = lines_of(read_text(dir.path() / "metrics.csv"));
  REQUIRE(csv.size() == 3);
  CHECK(csv[1].rfind("gradient,focus,", 0) == 0);
  char mean[32];
  std::snprintf(mean, sizeof mean, "%.4g", double(named) / 12.0);
  CHECK_MESSAGE(csv[2].rfind(cat("model,focus_recognition,higher is better,true,", mean, ","), 0) == 0, csv[2]);
  CHECK(contains(read_text(dir.path() / "metrics.md"), "## the model: focus_recognition"));
}

TEST_CASE("predict cli: a checkpoint of a named data set names its predicted classes") {
  // Trained for one step on Fashion-MNIST-shaped files: the names are Fashion-MNIST's, known
  // from the checkpoint's data spec.
  TempDir dir;
  const std::string data = write_square_images(dir);
  const CommandOutcome trained = run_adjoint({"train", "--model", "resnet18", "--width", "0.0625", "--data", data,
                                              "--batch", "16", "--max-steps", "1", "--out", dir.file("model")});
  REQUIRE_MESSAGE(trained.code == 0, trained.err);
  write_safetensors(dir.file("x.safetensors"), {{"x", Tensor::zeros({2, 1, 8, 8})}});
  const CommandOutcome named = run_adjoint({"predict", "--checkpoint", dir.file("model/checkpoint.safetensors"),
                                            "--input", dir.file("x.safetensors"), "--out", dir.file("p")});
  REQUIRE_MESSAGE(named.code == 0, named.err);
  const std::vector<std::string> names = class_names_of("fashion-mnist");
  bool found = false;
  for (size_t k = 0; k < names.size(); ++k) found |= contains(named.out, cat("0: class ", k, " (", names[k], ") (logit"));
  CHECK_MESSAGE(found, named.out);
}

TEST_CASE("explain cli: --data's images, decoded while the model loads, are the data set's; the model's error comes first") {
  // An ImageNet-shaped folder of two classes, three 256 x 256 noise PNGs each, and the
  // 1/32-width ResNet-50 that torch.save wrote for the reproduce test (two classes).
  TempDir dir;
  Generator gen(16);
  for (const char* wnid : {"n01440764", "n01443537"}) {
    fs::create_directories(dir.file(cat("imagenet/val/", wnid)));
    for (int k = 0; k < 3; ++k) {
      const Tensor noise = uniform({256 * 256 * 3}, 0.0f, 255.0f, gen);
      std::vector<uint8_t> rgb(size_t(noise.numel()));
      for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = uint8_t(noise.data()[i]);
      Image picture(256, 256);
      picture.pixels = rgb;
      write_png(dir.file(cat("imagenet/val/", wnid, "/", k, ".png")), picture);
    }
  }
  const std::string spec = "imagenet:" + dir.file("imagenet");
  const std::string weights = cat(ADJOINT_SOURCE_DIR, "/tests/goldens/reproduce_imagenet/resnet50.pth");
  const auto explain_with = [&](const std::string& weights_file, const std::string& data, const std::string& out) {
    return run_adjoint({"explain", "--model", "resnet50", "--width", "0.03125", "--imagenet-stem", "--classes", "2",
                        "--weights", weights_file, "--data", data, "--count", "5", "--methods", "gradient",
                        "--metrics", "none", "--out", dir.file(out)});
  };
  const CommandOutcome done = explain_with(weights, spec, "out");
  CAPTURE(done.err);
  REQUIRE(done.code == 0);
  const SafetensorsFile written = read_safetensors(dir.file("out/attributions_gradient.safetensors"));
  const DataSource data = open_data(spec, DataSplits::TestOnly);
  check_close(written.tensors.at("inputs"), load_examples(data, "test", 5, std::nullopt).inputs, 0, 0,
              "the inputs explained");

  // Both the weights and the images at fault: the weights' error, as when they loaded first.
  const CommandOutcome both = explain_with(dir.file("missing.pth"), "imagenet:" + dir.file("nowhere"), "both");
  CHECK(both.code == 1);
  CHECK(contains(both.err, dir.file("missing.pth")));
  CHECK(!contains(both.err, dir.file("nowhere")));
  const CommandOutcome images = explain_with(weights, "imagenet:" + dir.file("nowhere"), "images");
  CHECK(images.code != 0);
  CHECK(contains(images.err, dir.file("nowhere")));
  CHECK(!fs::exists(dir.file("both")));
  CHECK(!fs::exists(dir.file("images")));
}
