// What `adjoint explain` does around the methods at ImageNet's size: a model whose weights a
// file brings is built without drawing the weights the file overwrites; a metric undefined on
// every image (guided Grad-CAM's map of zeros) is shown as not computable, with the reason.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <set>
#include <map>
#include <string>

#include "engine/autograd.h"
#include "engine/io/files.h"
#include "engine/io/safetensors.h"
#include "engine/random.h"
#include "analysis/pullbacks/explain.h"
#include "analysis/pullbacks/report.h"
#include "models/layers.h"
#include "models/model.h"
#include "models/model_source.h"
#include "tests/support.h"

namespace adjoint {
namespace {

bool same_bits(const Tensor& a, const Tensor& b) {
  const Tensor x = a.contiguous(), y = b.contiguous();
  return x.shape() == y.shape() && std::memcmp(x.data(), y.data(), size_t(x.numel()) * sizeof(float)) == 0;
}

// A VGG-11-BN of an eighth of the width on 16×16 inputs (7 classes), in eval mode, six
// normal images drawn after its weights, and the classes it predicts for them.
struct SmallBatch {
  std::shared_ptr<Model> model;
  Tensor x;
  std::vector<int64_t> expected;
};
SmallBatch small_vgg_batch(uint64_t seed) {
  ModelConfig c;
  c.arch = "vgg11_bn";
  c.width = 0.125;
  c.num_classes = 7;
  c.image_size = 16;
  Generator gen(seed);
  SmallBatch out;
  out.model = make_model(c, gen);
  out.model->train(false);
  out.x = normal({6, 3, 16, 16}, 0.0f, 1.0f, gen);
  out.expected = predicted_classes(*out.model, out.x);
  return out;
}

}  // namespace

TEST_CASE("Generator::without_draws: zeros of the shape, and the counters a drawing generator would use") {
  Generator drawing(5), skipping = Generator::without_draws();
  const Tensor u = uniform({3, 7}, -1.0f, 1.0f, skipping), n = normal({11}, 0.0f, 2.0f, skipping);
  for (const Tensor& t : {u, n})
    for (int64_t i = 0; i < t.numel(); ++i) CHECK(t.data()[i] == 0.0f);
  uniform({3, 7}, -1.0f, 1.0f, drawing);
  normal({11}, 0.0f, 2.0f, drawing);
  CHECK(skipping.offset() == drawing.offset());
  CHECK(skipping.offset() == 32);
  // A generator made the ordinary way still draws.
  Generator seeded(5);
  const Tensor drawn = uniform({64}, -1.0f, 1.0f, seeded);
  int64_t nonzero = 0;
  for (int64_t i = 0; i < drawn.numel(); ++i) nonzero += drawn.data()[i] != 0.0f;
  CHECK(nonzero == 64);
}

TEST_CASE("load_weights_model: built without draws, the file's weights bit for bit and the seeded model's logits") {
  testing::TempDir dir;
  ModelConfig c;
  c.arch = "resnet50";
  c.small_stem = false;
  c.width = 0.0625;
  c.num_classes = 5;
  c.image_size = 64;
  Generator gen(91);
  const std::shared_ptr<Model> seeded = make_model(c, gen);
  seeded->train(false);
  write_safetensors(dir.file("w.safetensors"), seeded->state_dict());

  const LoadedModel loaded = load_weights_model(c, dir.file("w.safetensors"));
  const std::map<std::string, Tensor> want = seeded->state_dict(), got = loaded.model->state_dict();
  REQUIRE(got.size() == want.size());
  for (const auto& [name, tensor] : want) {
    CAPTURE(name);
    REQUIRE(got.count(name));
    CHECK(same_bits(got.at(name), tensor));
  }
  Generator inputs(4);
  const Tensor x = normal({2, 3, 64, 64}, 0.0f, 1.0f, inputs);
  NoGrad off;
  const Tensor expected = seeded->forward(x), logits = loaded.model->forward(x);
  CHECK(same_bits(logits, expected));
  double largest = 0;
  for (int64_t i = 0; i < expected.numel(); ++i) largest = std::max(largest, double(std::fabs(expected.data()[i])));
  CHECK(largest > 0);  // not a model of zeros on both sides

  // A file that misses a tensor is refused, so no weight is left at the zeros it was built with.
  std::map<std::string, Tensor> short_of_one = want;
  short_of_one.erase("fc.weight");
  write_safetensors(dir.file("short.safetensors"), short_of_one);
  CHECK_THROWS_WITH_AS(load_weights_model(c, dir.file("short.safetensors")), doctest::Contains("fc.weight"), Error);
}

TEST_CASE("report tables: a metric undefined on every image is not computable, with its reason, never a NaN") {
  // As on the test's ImageNet folder with random weights: guided Grad-CAM's maps are zero
  // wherever Grad-CAM's ReLU leaves nothing, and random logit (a correlation with a map of
  // zeros) and focus (no positive mass) are undefined on all three images.
  const double nan = std::nan("");
  MetricTable t;
  t.methods = {"gradient", "guided_gradcam"};
  for (const char* name : {"random_logit", "focus"}) {
    t.metrics.push_back({metric_info(name), 3, "", "images"});
    t.rows.push_back({"gradient", name, summarize(std::vector<double>{0.25, 0.5, 0.75})});
    t.rows.push_back({"guided_gradcam", name, summarize(std::vector<double>{nan, nan, nan})});
  }
  t.metrics.push_back({metric_info("infidelity"), 3, "", "images"});  // one value defined: a mean, no spread
  t.rows.push_back({"gradient", "infidelity", summarize(std::vector<double>{2.0, 3.0, 4.0})});
  t.rows.push_back({"guided_gradcam", "infidelity", summarize(std::vector<double>{1.5, nan, nan})});

  const std::string md = table_markdown(t);
  CAPTURE(md);
  CHECK(md.find("nan") == std::string::npos);
  CHECK(md.find("| guided_gradcam | not computable | not computable | **1.5** |") != std::string::npos);
  CHECK(md.find("| guided_gradcam | not computable | — | 0 | 3 |") != std::string::npos);
  CHECK(md.find("| guided_gradcam | 1.5 ± — | — | 1 | 2 |") != std::string::npos);
  CHECK(md.find("Not computable for guided_gradcam: the metric is undefined on every one of its images, as it is for "
                "either map constant, as a map of zeros is") != std::string::npos);
  CHECK(md.find("as it is for a map with no positive value") != std::string::npos);
  CHECK(md.find("| gradient | 0.5 ± 0.25 | [") != std::string::npos);  // defined rows as before
  // The machine-readable tables keep their spelling of undefined: nan in CSV, null in JSON.
  CHECK(table_csv(t).find("guided_gradcam,focus,higher is better,true,nan,nan,nan,nan,0,3,") != std::string::npos);
}

TEST_CASE("shared_cost: batches handed in order to the rank free first; no more ranks busy than batches") {
  CHECK(shared_cost({4, 1, 2}, 1) == 7);
  // Two ranks: 4 to rank 0; 1 then 2 to rank 1 (free first), which ends at 3.
  CHECK(shared_cost({4, 1, 2}, 2) == 4);
  // The first batch carries the expensive metrics: it bounds the time at any rank count.
  CHECK(shared_cost({10, 1, 1, 1, 1}, 2) == 10);
  CHECK(shared_cost({3, 3, 3}, 64) == 3);
  CHECK(shared_cost({2, 2, 2, 2, 2}, 2) == 6);  // 5 batches on 2 ranks: 3 on one of them
  // The explain --evaluate batches of 1000 images at 224 pixels over 8 and 64 ranks: 20
  // batches of 50, of which the first two hold the 100 images of the expensive metrics.
  ReportOptions o;
  o.methods = {"gradient"};
  o.metrics = {"infidelity", "max_sensitivity"};
  o.batch_size = 50;
  o.expensive_count = 100;
  const std::vector<double> batches = report_batch_costs(o, 1000, 224, 224, 1);
  REQUIRE(batches.size() == 20);
  CHECK(batches[0] > batches[2]);
  CHECK(batches[1] == batches[0]);
  double sum = 0;
  for (double b : batches) sum += b;
  CHECK(sum == doctest::Approx(report_cost(o, 1000, 224, 224, 1)));
  CHECK(shared_cost(batches, 64) == batches[0]);
  CHECK(shared_cost(batches, 20) == batches[0]);
  CHECK(shared_cost(batches, 8) > sum / 8);
  CHECK(report_unshared_cost(o, 1000) == doctest::Approx(1000.0 / 3));  // the targets' forward pass
  o.metrics = {};  // the gradient, first, finds them in its own forward pass
  CHECK(report_unshared_cost(o, 1000) == 0);
  o.methods = {"smoothgrad", "gradient"};
  CHECK(report_unshared_cost(o, 1000) == doctest::Approx(1000.0 / 3));
  o.target = ReportOptions::Target::Label;
  CHECK(report_unshared_cost(o, 1000) == 0);
}

TEST_CASE("report_cells: max-sensitivity and randomisation (8 steps a piece) apart per method, so that more ranks share the work") {
  // The paper's evaluation of a ResNet-50-like model (107 layers): 1000 images in batches of
  // 50, every metric on the first 100, with a one-pass method and the 50-pass SmoothGrad.
  ReportOptions o;
  o.methods = {"gradient", "smoothgrad"};
  for (const ReportMetric& m : report_metrics()) o.metrics.push_back(m.info.name);
  o.batch_size = 50;
  o.expensive_count = 100;
  const int64_t layers = 107;
  const std::vector<double> batches = report_batch_costs(o, 1000, 224, 224, layers);
  double whole = 0;
  for (double b : batches) whole += b;
  // Without cells (one process, explain without --evaluate): the batches as they are.
  CHECK(report_work_costs(o, 1000, 224, 224, layers) == batches);

  o.cells.enabled = true;
  const std::vector<ReportCell> cells = report_cells(o, 1000, 224, 224, layers);
  const int64_t steps_pieces = (layers + 7) / 8;  // 14: 13 of 8 steps and one of 3
  REQUIRE(int64_t(cells.size()) == 20 + 2 * 2 * (1 + steps_pieces));
  double sum = 0, randomisation_of_first = 0, made_again = 0, made_again_first = 0;
  for (size_t i = 0; i < cells.size(); ++i) {
    if (i > 0) CHECK(cells[i - 1].cost >= cells[i].cost);  // handed out costliest first
    sum += cells[i].cost;
    if (!cells[i].piece) continue;
    const MetricPiece& piece = *cells[i].piece;
    CHECK(cells[i].images.first < 100);  // pieces of the expensive images' batches only
    const double one = piece.method == "smoothgrad" ? 50 : 1;
    made_again += 50 * one;  // each piece makes its method's maps of the batch again
    if (piece.metric == "max_sensitivity") {
      CHECK(piece.steps == 0);
      CHECK(cells[i].cost == doctest::Approx((50 + 50 * 10) * one));  // 10 samples of each image
      continue;
    }
    CHECK(piece.metric == "model_parameter_randomisation");
    if (piece.first_step + piece.steps == layers) CHECK(piece.steps == 3);
    if (cells[i].images.first == 0) {
      randomisation_of_first += cells[i].cost;
      made_again_first += 50 * one;
    }
  }
  // The pieces' explanations are the metrics': the work is the batches' plus the maps made again.
  CHECK(sum == doctest::Approx(whole + made_again));
  CHECK(randomisation_of_first == doctest::Approx(50.0 * layers * 51 + made_again_first));
  // Over ranks the work now divides past the two expensive batches: at 64 ranks the job lasts
  // a fraction of what the first batch alone took.
  std::vector<double> costs;
  for (const ReportCell& c : cells) costs.push_back(c.cost);
  CHECK(shared_cost(batches, 8) == batches[0]);
  CHECK(shared_cost(costs, 8) < 0.7 * batches[0]);
  CHECK(shared_cost(costs, 64) < 0.5 * shared_cost(costs, 8));
  CHECK(shared_cost(costs, 64) >= sum / 64);
}

TEST_CASE("explain: the methods of one transport in passes of max_batch rows, each example's map as alone") {
  const SmallBatch small = small_vgg_batch(9);
  const std::shared_ptr<Model>& model = small.model;
  const Tensor& x = small.x;
  const std::vector<int64_t>& expected = small.expected;
  const int64_t row = x.numel() / 6;
  ExplainOptions passes;
  passes.max_batch = 4;  // a pass of 4, then one of 2
  ExplainOptions by_elements;
  by_elements.max_pass_elements = 5 * row / 2;  // two examples a pass
  for (const char* method : {"gradient", "soft_pullback", "pullback", "guided_backprop", "input_x_gradient",
                             "guided_gradcam"}) {
    CAPTURE(method);
    const Tensor whole = explain(method, *model, x, expected);
    REQUIRE(testing::max_abs(whole) > 0);
    // The definition: each example explained on its own.
    for (int64_t n = 0; n < 6; ++n) {
      const Tensor one = x.view_as_strided({1, 3, 16, 16}, {row, 256, 16, 1}, n * row).contiguous();
      const Tensor alone = explain(method, *model, one, {expected[size_t(n)]});
      const Tensor mine = whole.view_as_strided({1, 3, 16, 16}, {row, 256, 16, 1}, n * row).contiguous();
      testing::check_close(mine, alone, 1e-5, 1e-6 * testing::max_abs(alone) + 1e-9, cat(method, " example ", n));
    }
    CHECK(same_bits(explain(method, *model, x, expected, passes), whole));
    CHECK(same_bits(explain(method, *model, x, expected, by_elements), whole));
  }
  // A batch that is a view into a larger tensor (rows 1 to 6 of 7) splits into its own rows.
  Tensor larger = Tensor::empty({7, 3, 16, 16});
  std::copy(x.data(), x.data() + x.numel(), larger.data() + row);
  const Tensor view = larger.view_as_strided(x.shape(), {row, 256, 16, 1}, row);
  CHECK(same_bits(explain("gradient", *model, view, expected, passes), explain("gradient", *model, x, expected)));
  // The first method of a report finds the predicted classes pass by pass, in order.
  std::vector<int64_t> predicted;
  const Tensor maps = explain_predicted("gradient", *model, x, predicted, passes);
  CHECK(predicted == expected);
  CHECK(same_bits(maps, explain("gradient", *model, x, expected)));
}

TEST_CASE("explain_predicted: the predicted classes read off the method's own forward pass, the same maps") {
  const SmallBatch small = small_vgg_batch(8);
  const std::shared_ptr<Model>& model = small.model;
  const Tensor& x = small.x;
  const std::vector<int64_t>& expected = small.expected;
  CHECK(std::set<int64_t>(expected.begin(), expected.end()).size() > 1);  // not one class for all
  for (const char* method : {"gradient", "soft_pullback", "pullback", "guided_backprop"}) {
    CAPTURE(method);
    REQUIRE(explains_in_one_pass(method));
    std::vector<int64_t> predicted;
    const Tensor maps = explain_predicted(method, *model, x, predicted);
    CHECK(predicted == expected);
    CHECK(same_bits(maps, explain(method, *model, x, expected)));
  }
  CHECK_FALSE(explains_in_one_pass("smoothgrad"));
  std::vector<int64_t> unused;
  CHECK_THROWS_WITH_AS(explain_predicted("smoothgrad", *model, x, unused), doctest::Contains("not one transport"), Error);

  // A report without metrics takes them from its first method, batch by batch: the same
  // targets and maps as one that finds them first (a metric makes it do so).
  testing::TempDir dir;
  ReportOptions o;
  o.methods = {"gradient", "input_x_gradient"};
  o.batch_size = 4;
  o.out_dir = dir.file("fused");
  const ReportResult fused = explain_report(*model, x, {}, o);
  CHECK(fused.targets == expected);
  o.metrics = {"sparseness"};
  o.out_dir = dir.file("first");
  const ReportResult first = explain_report(*model, x, {}, o);
  CHECK(first.targets == expected);
  for (const char* method : {"gradient", "input_x_gradient"}) {
    CAPTURE(method);
    const std::string file = cat("/attributions_", method, ".safetensors");
    const SafetensorsFile a = read_safetensors(dir.file("fused") + file), b = read_safetensors(dir.file("first") + file);
    CHECK(same_bits(a.tensors.at("attributions"), b.tensors.at("attributions")));
    CHECK(same_bits(a.tensors.at("targets"), b.tensors.at("targets")));
  }
  CHECK(std::filesystem::exists(dir.file("fused/image_0005/input.png")));
}

TEST_CASE("explain_report: the pictured images' passes first, their pictures drawn before the rest; the same files") {
  const SmallBatch small = small_vgg_batch(10);
  const std::shared_ptr<Model>& model = small.model;
  const Tensor& x = small.x;
  const std::vector<int64_t>& expected = small.expected;
  testing::TempDir dir;
  const auto bytes = [](const std::string& path) { return read_text_file(path); };
  for (const bool with_metric : {false, true}) {  // targets from the first method, or found first
    CAPTURE(with_metric);
    ReportOptions o;
    o.methods = {"gradient", "guided_backprop", "smoothgrad"};
    o.explain.smoothgrad_samples = 2;
    o.metrics = with_metric ? std::vector<std::string>{"sparseness"} : std::vector<std::string>{};
    o.batch_size = 6;
    o.picture_images = 3;    // in the first two passes of two: explained first, then the last pass
    o.explain.max_batch = 2;
    o.out_dir = dir.file(cat("passes_", with_metric));
    const ReportResult passes = explain_report(*model, x, {}, o);
    o.explain.max_batch = 64;  // one pass: the pictures after the whole batch's maps
    o.out_dir = dir.file(cat("whole_", with_metric));
    const ReportResult whole = explain_report(*model, x, {}, o);
    CHECK(passes.targets == expected);
    CHECK(whole.targets == expected);
    REQUIRE(passes.files.size() == whole.files.size());
    for (size_t i = 0; i < passes.files.size(); ++i) {  // the same files in the same order, the same bytes
      const std::string name = std::filesystem::path(passes.files[i]).lexically_relative(dir.file(cat("passes_", with_metric))).string();
      CAPTURE(name);
      CHECK(name == std::filesystem::path(whole.files[i]).lexically_relative(dir.file(cat("whole_", with_metric))).string());
      if (name.ends_with(".png") || name.ends_with(".safetensors")) CHECK(bytes(passes.files[i]) == bytes(whole.files[i]));
    }
    CHECK(std::filesystem::exists(dir.file(cat("passes_", with_metric, "/image_0002/sheet.png"))));
    CHECK_FALSE(std::filesystem::exists(dir.file(cat("passes_", with_metric, "/image_0003"))));
    if (with_metric) CHECK(passes.table.rows.size() == 3);
  }
}

TEST_CASE("redraw_normal: a drawing generator's N(0, std²) in place; without draws, the zeros kept and the same counters") {
  Generator drawing(7), reference(7), skipping = Generator::without_draws();
  Tensor drawn = Tensor::zeros({6, 3, 3, 3}), kept = Tensor::zeros({6, 3, 3, 3});
  redraw_normal(drawn, 0.5f, drawing);
  redraw_normal(kept, 0.5f, skipping);
  const Tensor want = normal({6, 3, 3, 3}, 0.0f, 0.5f, reference);
  int64_t nonzero = 0;
  for (int64_t i = 0; i < drawn.numel(); ++i) {
    CHECK(drawn.data()[i] == want.data()[i]);
    CHECK(kept.data()[i] == 0.0f);
    nonzero += drawn.data()[i] != 0.0f;
  }
  CHECK(nonzero == drawn.numel());
  CHECK(skipping.offset() == drawing.offset());
  CHECK(skipping.offset() == 162);
}

}  // namespace adjoint
