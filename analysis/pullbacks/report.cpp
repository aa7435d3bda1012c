#include "analysis/pullbacks/report.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>

#include "analysis/pullbacks/cells.h"
#include "analysis/pullbacks/focus.h"
#include "analysis/pullbacks/picture_writer.h"
#include "analysis/pullbacks/randomisation.h"
#include "analysis/pullbacks/report_run.h"
#include "engine/autograd.h"
#include "engine/data/open.h"
#include "engine/distributed/ranks.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "engine/io/files.h"
#include "engine/io/json.h"
#include "engine/io/safetensors.h"

namespace adjoint {

namespace {

// Example i of a contiguous batch (N, ...) as a tensor of one example's shape.
Tensor example(const Tensor& t, int64_t i) {
  const Shape shape(t.shape().begin() + 1, t.shape().end());
  Tensor out = Tensor::empty(shape);
  const int64_t row = out.numel();
  std::copy(t.data() + i * row, t.data() + (i + 1) * row, out.data());
  return out;
}

// Seconds since `start`.
double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs `step`, adding its wall-clock seconds to `total`.
template <class Step>
void timed(double& total, Step&& step) {
  const auto start = std::chrono::steady_clock::now();
  step();
  total += seconds_since(start);
}

// Writes rows of `part` into `whole` from row `begin` on.
void put_rows(Tensor& whole, const Tensor& part, int64_t begin) {
  const int64_t row = whole.numel() / whole.size(0);
  std::copy(part.data(), part.data() + part.numel(), whole.data() + begin * row);
}

}  // namespace

// ---- cost --------------------------------------------------------------------------------

double method_cost(const std::string& method, const ExplainOptions& o) {
  if (is_ascent(method)) return double(o.ascent_steps);
  if (method == "smoothgrad") return double(o.smoothgrad_samples);
  if (method == "integrated_gradients") return double(o.ig_steps);
  if (method == "guided_gradcam") return 2;  // Grad-CAM and guided backprop
  if (method == "deeplift") return 2;        // the batch runs with its baselines
  return 1;
}

namespace {

using MetricList = std::vector<const ReportMetric*>;

// The rows of resolved metric names, in the table's order.
MetricList metric_rows(const std::vector<std::string>& names) {
  MetricList rows;
  for (const std::string& name : names) rows.push_back(find_report_metric(name));
  return rows;
}

// The probes of a batch, shared by every method.
double probe_cost(const MetricList& metrics, const BatchCounts& counts) {
  double cost = 0;
  for (const ReportMetric* m : metrics)
    if (m->probe_passes) cost += m->probe_passes(counts);
  return cost;
}

// One method on a batch: its maps, and the explanations the metrics ask of it again.
double method_batch_cost(const std::string& method, const MetricList& metrics, const BatchCounts& counts) {
  const double one = method_cost(method, counts.options.explain);
  double cost = double(counts.images) * one;
  for (const ReportMetric* m : metrics)
    if (m->explanations) cost += m->explanations(counts) * one;
  return cost;
}

int64_t randomised_layers(const ReportOptions& o, int64_t layers) {
  return o.randomisation_layers > 0 ? std::min(o.randomisation_layers, layers) : layers;
}

// Of batch [first, first + size): how many images are in the expensive set.
int64_t expensive_in_batch(int64_t expensive, int64_t first, int64_t size) {
  return std::clamp<int64_t>(expensive - first, 0, size);
}

}  // namespace

std::vector<double> report_batch_costs(const ReportOptions& o, int64_t images, int64_t height, int64_t width,
                                       int64_t layers) {
  const std::vector<std::string> methods = o.methods.empty() ? explanation_methods() : resolve_methods(o.methods);
  const MetricList metrics = metric_rows(resolve_metrics(o.metrics));
  const int64_t E = expensive_images(o, images);
  const double patches = double(patch_count(o.metric_settings, height, width));
  const int64_t batch = std::max<int64_t>(1, o.batch_size), randomised = randomised_layers(o, layers);
  // Batch by batch, as explain_report spends it.
  std::vector<double> costs;
  for (int64_t f = 0; f < images; f += batch) {
    const int64_t b = std::min(batch, images - f);
    const BatchCounts counts{o, b, expensive_in_batch(E, f, b), patches, randomised};
    double cost = probe_cost(metrics, counts);
    for (const std::string& m : methods) cost += method_batch_cost(m, metrics, counts);
    costs.push_back(cost);
  }
  return costs;
}

namespace {

// Steps of randomisation in one piece: enough that making the method's maps again, which
// each piece does, is a small share of it (1/8), few enough that the costliest method's
// randomisation of a batch splits into many cells.
constexpr int64_t kStepsPerPiece = 8;

}  // namespace

std::vector<ReportCell> report_cells(const ReportOptions& o, int64_t images, int64_t height, int64_t width,
                                     int64_t layers) {
  const std::vector<double> batch_costs = report_batch_costs(o, images, height, width, layers);
  const std::vector<std::string> methods = o.methods.empty() ? explanation_methods() : resolve_methods(o.methods);
  const MetricList metrics = metric_rows(resolve_metrics(o.metrics));
  const int64_t E = expensive_images(o, images), randomised = randomised_layers(o, layers);
  const double patches = double(patch_count(o.metric_settings, height, width));
  std::vector<ReportCell> cells, pieces;
  const std::vector<ImageRange> batches = image_cells(images, std::max<int64_t>(1, o.batch_size));
  for (size_t b = 0; b < batches.size(); ++b) {
    const ImageRange& range = batches[b];
    ReportCell cell{range, std::nullopt, batch_costs[b]};
    const BatchCounts counts{o, range.count, expensive_in_batch(E, range.first, range.count), patches, randomised};
    for (const ReportMetric* m : metrics) {
      if (counts.expensive == 0 || !runs_in_pieces(o, *m, randomised)) continue;
      for (const std::string& method : methods) {
        const double one = method_cost(method, o.explain);
        cell.cost -= m->explanations(counts) * one;  // the metric's explanations, now the pieces'
        if (m->pieces == ReportMetric::Pieces::Whole) {
          pieces.push_back({range, MetricPiece{m->info.name, method}, (double(range.count) + m->explanations(counts)) * one});
          continue;
        }
        for (int64_t first = 0; first < randomised; first += kStepsPerPiece) {
          const int64_t steps = std::min(kStepsPerPiece, randomised - first);
          pieces.push_back({range, MetricPiece{m->info.name, method, first, steps},
                            double(range.count + counts.expensive * steps) * one});
        }
      }
    }
    cells.push_back(cell);
  }
  cells.insert(cells.end(), pieces.begin(), pieces.end());
  std::stable_sort(cells.begin(), cells.end(), [](const ReportCell& a, const ReportCell& b) { return a.cost > b.cost; });
  return cells;
}

std::vector<double> report_work_costs(const ReportOptions& o, int64_t images, int64_t height, int64_t width,
                                      int64_t layers) {
  if (!o.cells.enabled) return report_batch_costs(o, images, height, width, layers);
  std::vector<double> costs;
  for (const ReportCell& c : report_cells(o, images, height, width, layers)) costs.push_back(c.cost);
  return costs;
}

double report_cost(const ReportOptions& o, int64_t images, int64_t height, int64_t width, int64_t layers) {
  double cost = 0;
  for (double c : report_batch_costs(o, images, height, width, layers)) cost += c;
  return cost;
}

namespace {

// Without metrics nothing reads a batch's targets before its first method has run; a first
// method of one pass then finds the predicted classes in its own forward pass.
bool targets_from_first_method(const ReportOptions& o) {
  if (o.target != ReportOptions::Target::Predicted || !o.metrics.empty() || o.cells.enabled) return false;
  return explains_in_one_pass(o.methods.empty() ? explanation_methods().front() : o.methods.front());
}

}  // namespace

double report_unshared_cost(const ReportOptions& o, int64_t images) {
  const bool found_first = o.target == ReportOptions::Target::Predicted && !targets_from_first_method(o);
  return found_first ? double(images) / 3.0 : 0.0;
}

double shared_cost(const std::vector<double>& batch_costs, int64_t ranks) {
  check(ranks >= 1, "shared_cost: at least one rank, got ", ranks);
  std::vector<double> busy(size_t(std::min<int64_t>(ranks, std::max<size_t>(batch_costs.size(), 1))), 0.0);
  for (double c : batch_costs) *std::min_element(busy.begin(), busy.end()) += c;
  return *std::max_element(busy.begin(), busy.end());
}

// ---- the report's steps --------------------------------------------------------------------

namespace {

// Per-method per-metric values over the images, in image order.
using Scores = std::map<std::string, std::vector<double>>;

void append(Scores& scores, const MetricResult& r) {
  std::vector<double>& v = scores[r.info.name];
  v.insert(v.end(), r.values.begin(), r.values.end());
}

// A later batch's values after the earlier ones': every method's, every metric's.
void append(CellScores& all, const CellScores& batch) {
  for (const auto& [method, metrics] : batch)
    for (const auto& [metric, values] : metrics) {
      std::vector<double>& v = all[method][metric];
      v.insert(v.end(), values.begin(), values.end());
    }
}

std::string picture_dir(const std::string& out_dir, int64_t image) {
  char name[32];
  std::snprintf(name, sizeof name, "image_%04lld", static_cast<long long>(image));
  return (std::filesystem::path(out_dir) / name).string();
}

void check_request(const Model& model, const Tensor& x, const ReportOptions& o) {
  check(x.defined() && x.dim() == 4 && x.size(0) > 0, "explain_report: expects images (N, C, H, W), got ",
        x.defined() ? to_string(x.shape()) : std::string("undefined"));
  check(!model.training(), "explain_report: the model is in training mode; call model.train(false) first");
  check(o.batch_size >= 1, "explain_report: the batch size must be at least 1, got ", o.batch_size);
  check(o.perturbations >= 1, "explain_report: at least one infidelity perturbation per image, got ", o.perturbations);
}

// The class explained for each image: the labels, one fixed class, or the predictions.
std::vector<int64_t> explained_classes(const ReportRun& run) {
  const ReportOptions& o = run.options;
  if (o.target == ReportOptions::Target::Label) {
    check(!run.labels.empty(), "explain_report: --target label needs the images' labels (a data set)");
    return run.labels;
  }
  if (o.target == ReportOptions::Target::Fixed) {
    check(o.target_class >= 0 && o.target_class < run.classes, "explain_report: target class ", o.target_class,
          " is outside [0, ", run.classes, ")");
    return std::vector<int64_t>(size_t(run.images), o.target_class);
  }
  return predicted_in_batches(run.model, run.x, o.batch_size);
}

// The run: the images, their targets, the metrics' settings, and the metrics' preparations.
void start_run(ReportRun& run, const Tensor& x, const std::vector<int64_t>& labels, const MetricList& metrics) {
  const ReportOptions& o = run.options;
  run.classifier = [&model = run.model](const Tensor& in) {
    NoGrad off;
    return model.forward(in);
  };
  run.x = x.contiguous();
  run.labels = labels;
  run.images = run.x.size(0), run.height = run.x.size(2), run.width = run.x.size(3);
  run.expensive = expensive_images(o, run.images);
  // The class count costs a forward pass: found only for those that read it.
  const bool classes_read = o.target == ReportOptions::Target::Fixed ||
                            std::any_of(metrics.begin(), metrics.end(), [](const ReportMetric* m) { return m->reads_classes; });
  if (classes_read) {
    NoGrad off;
    run.classes = run.model.forward(rows(run.x, 0, 1)).size(1);
  }
  run.targets_from_first_method = targets_from_first_method(o);
  if (!run.targets_from_first_method) run.targets = explained_classes(run);
  run.layers = int64_t(layers_top_down(run.model).size());
  run.randomised = randomised_layers(o, run.layers);

  const MetricSettings& s = o.metric_settings;
  run.infidelity.seed = o.metric_seed;
  run.infidelity.patch_sizes = s.infidelity_patches;
  if (run.infidelity.patch_sizes.empty())
    run.infidelity.patch_sizes = {std::max<int64_t>(1, run.height / 2), std::max<int64_t>(1, run.height / 4)};
  run.infidelity.samples_per_size = samples_per_size(o.perturbations, int64_t(run.infidelity.patch_sizes.size()));
  run.infidelity.noise = s.infidelity_noise;
  run.faithfulness_correlation.seed = o.metric_seed;
  run.faithfulness_correlation.subsets = s.faithfulness_subsets;
  run.faithfulness_correlation.patch_size = s.faithfulness_patch;
  run.faithfulness_correlation.baseline = s.baseline;
  run.faithfulness_estimate.patch_size = patch_side(s, run.height);
  run.faithfulness_estimate.baseline = s.baseline;
  run.monotonicity.seed = o.metric_seed;
  run.monotonicity.samples = s.monotonicity_samples;
  run.monotonicity.patch_size = patch_side(s, run.height);
  run.max_sensitivity.seed = o.metric_seed;
  run.max_sensitivity.samples = s.sensitivity_samples;
  // The metric takes its radius as a share of the range's width.
  run.max_sensitivity.radius = s.sensitivity_radius_absolute ? s.sensitivity_radius / run.range().width() : s.sensitivity_radius;
  run.random_logit_seed = s.random_logit_seed.value_or(o.metric_seed);
  run.randomisation.seed = 42 + o.metric_seed;
  run.randomisation.max_layers = o.randomisation_layers;
  for (const ReportMetric* m : metrics)
    if (m->prepare) m->prepare(run);
}

// Batch [first, first + batch_size): its images and targets.
ReportBatch batch_of(const ReportRun& run, int64_t first) {
  ReportBatch batch;
  batch.first = first;
  batch.size = std::min(run.options.batch_size, run.images - first);
  batch.expensive = expensive_in_batch(run.expensive, first, batch.size);
  batch.x = rows(run.x, first, batch.size);
  if (batch.expensive > 0) batch.x_expensive = rows(run.x, first, batch.expensive);
  if (!run.targets_from_first_method) {  // else the first method finds them (explain_finding_targets)
    batch.targets.assign(run.targets.begin() + first, run.targets.begin() + first + batch.size);
    batch.targets_expensive.assign(run.targets.begin() + first, run.targets.begin() + first + batch.expensive);
  }
  const int64_t M = run.mosaic_count();
  batch.first_mosaic = std::min(first, M);
  batch.mosaics = std::clamp<int64_t>(M - first, 0, batch.size);
  return batch;
}

// The batch with its probes.
ReportBatch start_batch(const ReportRun& run, const MetricList& metrics, int64_t first) {
  ReportBatch batch = batch_of(run, first);
  for (const ReportMetric* m : metrics)
    if (m->probe) m->probe(run, batch);
  return batch;
}

// One method's maps of a batch (and, for the ascent methods, the counterfactuals).
MethodMaps explain_batch(const ReportRun& run, const ReportBatch& batch, const std::string& method,
                         Tensor& counterfactual) {
  MethodMaps maps{method, {}, {}, make_explainer(method, run.model, run.options.explain)};
  if (is_ascent(method)) {
    AscentResult r = ascent(run.model, batch.x, batch.targets, run.options.explain, method == "pullback_ascent");
    maps.attr = r.attribution.contiguous();
    counterfactual = r.counterfactual.contiguous();
  } else {
    maps.attr = explain(method, run.model, batch.x, batch.targets, run.options.explain).contiguous();
  }
  check(maps.attr.shape() == batch.x.shape(), "explain_report: ", method, " gave attributions ", maps.attr.shape(),
        " for inputs ", batch.x.shape());
  if (batch.expensive > 0) maps.attr_expensive = rows(maps.attr, 0, batch.expensive);
  return maps;
}

// The first method's maps of a batch whose predicted classes are not known yet: found in
// the method's own forward pass and kept in the batch for the pictures and the methods after.
MethodMaps explain_finding_targets(const ReportRun& run, ReportBatch& batch, const std::string& method) {
  MethodMaps maps{method, {}, {}, make_explainer(method, run.model, run.options.explain)};
  maps.attr = explain_predicted(method, run.model, batch.x, batch.targets, run.options.explain).contiguous();
  batch.targets_expensive.assign(batch.targets.begin(), batch.targets.begin() + batch.expensive);
  if (batch.expensive > 0) maps.attr_expensive = rows(maps.attr, 0, batch.expensive);
  return maps;
}

// The rows of the passes that hold a batch's first `shown` (pictured) images, when a method
// of one transport explains the batch in more passes than those: their maps can then come
// first and their pictures be encoded while the rest of the batch is explained. 0 otherwise.
// A whole number of passes, so that every pass holds the rows it holds in one call.
int64_t pictured_passes_rows(const ReportRun& run, const ReportBatch& batch, const std::string& method,
                             int64_t shown) {
  if (shown == 0 || !explains_in_one_pass(method)) return 0;
  const int64_t per_pass = rows_per_pass(run.options.explain, batch.x);
  const int64_t rows = (shown + per_pass - 1) / per_pass * per_pass;
  return rows < batch.size ? rows : 0;
}

// Rows [first, first + count) of a batch explained by a method of one transport; when
// finding the targets, the predicted classes of those rows are appended to batch.targets.
Tensor explain_rows(const ReportRun& run, ReportBatch& batch, const std::string& method, int64_t first, int64_t count,
                    bool finding_targets) {
  const Tensor x = rows(batch.x, first, count);
  if (!finding_targets) {
    const std::vector<int64_t> targets(batch.targets.begin() + first, batch.targets.begin() + first + count);
    return explain(method, run.model, x, targets, run.options.explain).contiguous();
  }
  std::vector<int64_t> found;
  const Tensor attr = explain_predicted(method, run.model, x, found, run.options.explain).contiguous();
  batch.targets.insert(batch.targets.end(), found.begin(), found.end());
  return attr;
}

// A method of one transport on a batch whose pictured images fill its first `pictured`
// rows (pictured_passes_rows): their maps first, then `draw(maps, no counterfactual)` hands
// their pictures to the report's PictureWriter, which encodes them while the other rows are
// explained. The maps are the bits one call on the whole batch gives: the same passes.
template <class Draw>
MethodMaps explain_pictured_first(const ReportRun& run, ReportBatch& batch, const std::string& method,
                                  int64_t pictured, bool finding_targets, ReportTimes& times, const Draw& draw) {
  MethodMaps maps{method, Tensor::empty(batch.x.shape()), {}, make_explainer(method, run.model, run.options.explain)};
  if (finding_targets) batch.targets.clear();
  Tensor head, tail;
  timed(times.methods, [&] { head = explain_rows(run, batch, method, 0, pictured, finding_targets); });
  put_rows(maps.attr, head, 0);
  draw(head, Tensor());
  timed(times.methods, [&] { tail = explain_rows(run, batch, method, pictured, batch.size - pictured, finding_targets); });
  put_rows(maps.attr, tail, pictured);
  if (finding_targets) batch.targets_expensive.assign(batch.targets.begin(), batch.targets.begin() + batch.expensive);
  if (batch.expensive > 0) maps.attr_expensive = rows(maps.attr, 0, batch.expensive);
  return maps;
}

// The pictures of a batch's first `shown` images: the inputs, then per method a heat-map,
// an overlay and the counterfactual, then one contact sheet per image. Each is handed to the
// report's PictureWriter as soon as it is drawn; the list of files keeps the order they
// were drawn in.
struct BatchPictures {
  const ReportOptions& options;
  int64_t first = 0, shown = 0, scale = 0;
  std::vector<std::string>& files;
  PictureWriter& writer;
  std::vector<Image> input_images = {};
  std::vector<std::vector<SheetColumn>> method_columns = {};

  void write(const std::string& path, const Image& image) {
    writer.write(path, image);
    files.push_back(path);
  }

  // Needs no targets: drawn before the batch's first method, which may find them.
  void inputs(const ReportBatch& batch) {
    method_columns.resize(size_t(shown));
    input_images.resize(size_t(shown));
    for_each_image([&](int64_t i) { input_images[size_t(i)] = render_input(example(batch.x, i), options.normalisation, scale); });
    for (int64_t i = 0; i < shown; ++i) {
      const std::string dir = picture_dir(options.out_dir, first + i);
      std::filesystem::create_directories(dir);
      write(dir + "/input.png", input_images[size_t(i)]);
    }
  }

  void method(const std::string& method, const ReportBatch& batch, const Tensor& attr, const Tensor& counterfactual) {
    struct Drawn {
      Image heat, overlay, counterfactual;
      double peak = 0;
    };
    std::vector<Drawn> drawn(static_cast<size_t>(shown));
    for_each_image([&](int64_t i) {
      Drawn& d = drawn[size_t(i)];
      const Tensor a = example(attr, i), xi = example(batch.x, i);
      d.heat = render_heatmap(a, scale);
      d.overlay = render_overlay(xi, a, options.normalisation, scale);
      for (float v : channel_sum(a)) d.peak = std::max(d.peak, double(std::fabs(v)));
      if (counterfactual.defined()) d.counterfactual = render_input(example(counterfactual, i), options.normalisation, scale);
    });
    for (int64_t i = 0; i < shown; ++i) {
      const std::string dir = picture_dir(options.out_dir, first + i);
      Drawn& d = drawn[size_t(i)];
      write(dir + "/" + method + ".png", d.heat);
      write(dir + "/" + method + "_overlay.png", d.overlay);
      SheetColumn column{method, {{std::move(d.heat), cat("max |a| ", number(d.peak))}, {std::move(d.overlay), ""}}};
      if (counterfactual.defined()) {
        write(dir + "/" + method + "_counterfactual.png", d.counterfactual);
        column.cells.push_back({std::move(d.counterfactual), "counterfactual x_K"});
      }
      method_columns[size_t(i)].push_back(std::move(column));
    }
  }

  // Renders the images over the threads (the report's main thread would draw them alone
  // while the methods wait); the files are then queued in the images' order.
  template <class Render>
  void for_each_image(const Render& render) const {
    parallel_for(shown, 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) render(i);
    });
  }

  // The input, labelled with the class explained, then every method's column.
  void contact_sheets(const ReportBatch& batch) {
    for (int64_t i = 0; i < shown; ++i) {
      std::vector<SheetColumn> sheet = {
          {"input", {{input_images[size_t(i)], class_name(options.class_names, batch.targets[size_t(i)])}}}};
      for (SheetColumn& column : method_columns[size_t(i)]) sheet.push_back(std::move(column));
      write(picture_dir(options.out_dir, first + i) + "/sheet.png", contact_sheet(sheet));
    }
  }
};

// attributions_<method>.safetensors: every image's map, the inputs, the targets and the
// counterfactuals of the ascent methods. Each file is written as the report goes, by the
// writer's thread: its header and inputs at once, each batch's maps as soon as a method has
// made them, so that after the last pass only that pass's maps, the targets (the predicted
// classes are known last) and the sync are left. Jobs share the files they write: a report that
// fails drops the last share, and its files' temporaries with it.
class AttributionFiles {
public:
  AttributionFiles(const ReportRun& run, const std::vector<std::string>& methods, PictureWriter& writer)
      : writer_(writer), methods_(methods) {
    const Shape maps = run.x.shape();
    for (const std::string& method : methods) {
      std::map<std::string, Shape> shapes = {{"attributions", maps}, {"inputs", maps}, {"targets", {run.images}}};
      if (is_ascent(method)) shapes["counterfactuals"] = maps;
      const std::string path =
          (std::filesystem::path(run.options.out_dir) / ("attributions_" + method + ".safetensors")).string();
      const std::map<std::string, std::string> metadata = {{"method", method}, {"model", run.model.config().arch}};
      auto file = std::make_shared<SafetensorsWriter>(path, shapes, metadata);
      files_[method] = file;
      writer_.write([file, inputs = run.x] { file->write("inputs", 0, inputs); });
    }
  }

  // Queues the rows of the maps of a batch whose first image is `first`.
  void add(const std::string& method, int64_t first, const Tensor& attr, const Tensor& counterfactual) {
    const std::shared_ptr<SafetensorsWriter>& file = files_.at(method);
    const int64_t from = first * (attr.numel() / attr.size(0));
    writer_.write([file, from, attr] { file->write("attributions", from, attr); });
    if (counterfactual.defined())
      writer_.write([file, from, counterfactual] { file->write("counterfactuals", from, counterfactual); });
  }

  // Queues the targets and the commit of each file, naming the files in `files`. Called once
  // every batch's maps are queued and written (PictureWriter::finish), as a commit checks that
  // the file is whole.
  void finish(const std::vector<int64_t>& targets, std::vector<std::string>& files) {
    Tensor target_values = Tensor::empty({int64_t(targets.size())});
    for (size_t i = 0; i < targets.size(); ++i) target_values.data()[i] = float(targets[i]);
    for (const std::string& method : methods_) {
      std::shared_ptr<SafetensorsWriter> file = files_.at(method);
      writer_.write([file, target_values] {
        file->write("targets", 0, target_values);
        file->commit();
      });
      files.push_back(file->path());
    }
  }

private:
  PictureWriter& writer_;
  std::vector<std::string> methods_;
  std::map<std::string, std::shared_ptr<SafetensorsWriter>> files_;
};

// The table: a column per metric with its note, a row per method × metric scored.
MetricTable metric_table(const ReportRun& run, const std::vector<std::string>& methods, const MetricList& metrics,
                         CellScores& scores) {
  MetricTable table;
  table.methods = methods;
  table.context = run.options.context;
  table.context.emplace_back("images", cat(run.images));
  table.context.emplace_back("input range", cat("[", run.range().lo, ", ", run.range().hi, "]"));
  table.context.emplace_back("metric seed", cat(run.options.metric_seed));
  table.context.emplace_back("metric settings", describe(run.options.metric_settings));
  for (const ReportMetric* m : metrics) {
    const int64_t images = m->on_mosaics ? run.mosaic_count() : m->expensive ? run.expensive : run.images;
    table.metrics.push_back({m->info, images, m->note ? m->note(run) : "", m->on_mosaics ? "mosaics" : "images"});
    for (const std::string& method : methods) {
      const auto it = scores[method].find(m->info.name);
      if (it == scores[method].end()) continue;
      table.rows.push_back({method, m->info.name, summarize(it->second, table.confidence)});
    }
    if (m->model_figure)
      if (std::optional<ModelFigure> f = m->model_figure(run, table.confidence)) table.model_figures.push_back(*f);
  }
  return table;
}

void write_table_files(const MetricTable& table, const std::string& out_dir, std::vector<std::string>& files) {
  const std::filesystem::path dir(out_dir);
  write_file_atomic((dir / "metrics.csv").string(), table_csv(table));
  write_file_atomic((dir / "metrics.json").string(), table_json(table));
  write_file_atomic((dir / "metrics.md").string(), table_markdown(table));
  for (const char* name : {"metrics.csv", "metrics.json", "metrics.md"}) files.push_back((dir / name).string());
}

}  // namespace

// ---- the report ----------------------------------------------------------------------------

namespace {

// What every batch of a report shares.
struct BatchWork {
  const ReportRun& run;
  const MetricList& metrics;
  const std::vector<std::string>& methods;
  int64_t pictures = 0, scale = 0;  // pictures of the first `pictures` images, enlarged `scale` times
  double patches = 0;               // for the cost model
  PictureWriter& writer;            // encodes and writes the pictures beside the report's work
  MetricList in_batch;              // the metrics scored in the batch, not in pieces: its cost
};

// Told after each method of a batch, with its maps and counterfactuals (undefined but for
// the ascent methods) and the cost spent on it.
using MethodDone = std::function<void(const std::string& method, const ReportBatch& batch, const Tensor& attr,
                                      const Tensor& counterfactual, double cost)>;

// Batch [first, first + batch_size): every method's maps scored by every metric and its
// pictures drawn (their paths appended to `files`); returns the scores.
CellScores run_batch(const BatchWork& w, int64_t first, std::vector<std::string>& files, const MethodDone& done,
                     ReportTimes& times) {
  const ReportRun& run = w.run;
  ReportBatch batch;
  timed(times.metrics, [&] { batch = start_batch(run, w.metrics, first); });  // the probes
  const BatchCounts counts{run.options, batch.size, batch.expensive, w.patches, run.randomised};
  double probes = probe_cost(w.metrics, counts);
  BatchPictures drawn{run.options, first, std::clamp<int64_t>(w.pictures - first, 0, batch.size), w.scale, files,
                      w.writer};
  timed(times.pictures, [&] { drawn.inputs(batch); });
  CellScores scores;
  for (const std::string& method : w.methods) {
    const bool finding_targets = run.targets_from_first_method && method == w.methods.front();
    const bool last = &method == &w.methods.back();
    // This method's pictures, and after the last method's the contact sheets.
    const auto draw = [&](const Tensor& attr, const Tensor& counterfactual) {
      timed(times.pictures, [&] {
        drawn.method(method, batch, attr, counterfactual);
        if (last) drawn.contact_sheets(batch);
      });
    };
    Tensor counterfactual;
    MethodMaps maps;
    const int64_t pictured = pictured_passes_rows(run, batch, method, drawn.shown);
    if (pictured > 0) {
      maps = explain_pictured_first(run, batch, method, pictured, finding_targets, times, draw);
    } else if (finding_targets) {
      timed(times.methods, [&] { maps = explain_finding_targets(run, batch, method); });
    } else {
      timed(times.methods, [&] { maps = explain_batch(run, batch, method, counterfactual); });
    }
    Scores& mine = scores[method];
    timed(times.metrics, [&] {
      for (const ReportMetric* m : w.in_batch)  // the others in cells of their own (run_piece)
        if (const std::optional<MetricResult> r = m->score(run, batch, maps)) append(mine, *r);
    });
    if (pictured == 0) draw(maps.attr, counterfactual);
    if (done) done(method, batch, maps.attr, counterfactual, probes + method_batch_cost(method, w.in_batch, counts));
    probes = 0;
  }
  if (w.methods.empty()) timed(times.pictures, [&] { drawn.contact_sheets(batch); });
  return scores;
}

// On rank 0 alone: under mpirun an error ends the whole job (the other ranks wait for rank 0
// to hand out work or have finished), as for_each_item does; in one process it is thrown.
void on_rank_zero(const std::function<void()>& step) {
  if (distributed::rank() != 0) return;
  if (distributed::size() == 1) return step();
  try {
    step();
  } catch (const UsageError& e) {
    distributed::abort(2, e.what());
  } catch (const std::exception& e) {
    distributed::abort(1, e.what());
  }
}

// One piece of a batch's expensive images (cells.h): the method's maps of the batch made
// again, as the batch's own cell makes them, then the metric's scores of them (randomisation:
// the piece's steps, their correlations by step).
CellScores run_piece(const BatchWork& w, const ImageRange& images, const MetricPiece& piece, ReportTimes& times) {
  const ReportRun& run = w.run;
  const ReportMetric& metric = *find_report_metric(piece.metric);
  const ReportBatch batch = batch_of(run, images.first);
  Tensor counterfactual;
  MethodMaps maps;
  timed(times.methods, [&] { maps = explain_batch(run, batch, piece.method, counterfactual); });
  CellScores scores;
  if (metric.pieces == ReportMetric::Pieces::Whole) {
    timed(times.metrics, [&] {
      if (const std::optional<MetricResult> r = metric.score(run, batch, maps)) scores[piece.method][piece.metric] = r->values;
    });
    return scores;
  }
  RandomisationOptions options = run.randomisation;
  options.first_step = piece.first_step;
  options.step_count = piece.steps;
  RandomisationResult r;
  timed(times.metrics, [&] { r = randomisation_of(run, batch, maps, options); });
  check(int64_t(r.per_layer.size()) == piece.steps, "explain_report: randomisation ran ", r.per_layer.size(),
        " steps of the piece's ", piece.steps);
  for (int64_t k = 0; k < piece.steps; ++k)
    scores[piece.method][piece_step_key(piece.first_step + k)] = r.per_layer[size_t(k)];
  return scores;
}

// The score entries a piece holds: the metric's name, or one per step.
std::vector<std::string> piece_keys(const MetricPiece& piece) {
  if (piece.steps == 0) return {piece.metric};
  std::vector<std::string> keys;
  for (int64_t k = 0; k < piece.steps; ++k) keys.push_back(piece_step_key(piece.first_step + k));
  return keys;
}

// A cell file read back and checked against what this report asks: its images (and piece),
// its record, its methods (a piece: its method's entries). Throws Error (malformed, or not the
// cell its name says) or, through may_reuse, UsageError (made by another run); false when
// --overwrite remakes it.
bool reusable_cell(const std::string& path, const ImageCell& cell, const std::vector<ReportCell>& cells,
                   const Provenance& wanted, const std::vector<std::string>& methods, const ReportOptions& o) {
  const std::string what = cat("images ", cell.images.first, " to ", cell.images.first + cell.images.count - 1,
                               cell.piece ? cat(", ", cell.piece->metric, " of ", cell.piece->method) : std::string());
  check(std::filesystem::path(path).filename() == cell_file_name(cell.images, cell.piece), path, ": holds ", what,
        ", not what its name says");
  if (!may_reuse("explain", path, cell.made, wanted, o.cells.overwrite, o.cells.log)) return false;
  check(std::any_of(cells.begin(), cells.end(),
                    [&](const ReportCell& c) { return c.images == cell.images && c.piece == cell.piece; }),
        path, ": ", what, " is not a cell of this report");
  if (cell.piece) {
    const auto it = cell.scores.find(cell.piece->method);
    const std::vector<std::string> keys = piece_keys(*cell.piece);
    check(cell.scores.size() == 1 && it != cell.scores.end() && it->second.size() == keys.size(), path,
          ": not the scores of ", what);
    for (const std::string& key : keys) check(it->second.count(key), path, ": no ", key);
    return true;
  }
  for (const std::string& method : methods)
    check(cell.scores.count(method), path, ": no scores of ", method);
  check(cell.scores.size() == methods.size(), path, ": scores of methods this report does not run");
  return true;
}

// The cell files already in `folder` (images_*.json), each checked: one made by another run
// refuses the report, or with --overwrite is removed so that it is made again.
void check_cells_on_disk(const std::string& folder, const std::vector<ReportCell>& cells, const Provenance& wanted,
                         const std::vector<std::string>& methods, const ReportOptions& o) {
  std::vector<std::string> paths;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    const std::string name = entry.path().filename().string();
    if (name.starts_with("images_") && name.ends_with(".json")) paths.push_back(entry.path().string());
  }
  std::sort(paths.begin(), paths.end());
  for (const std::string& path : paths) {
    bool keep = false;
    try {
      keep = reusable_cell(path, read_image_cell_text(read_text_file(path), path), cells, wanted, methods, o);
    } catch (const UsageError&) {
      throw;
    } catch (const Error& e) {
      if (!o.cells.overwrite) throw Error(cat("explain: ", e.what(), "; give --overwrite to make it again"));
      if (o.cells.log) o.cells.log(cat("remaking ", path, " (--overwrite): ", e.what()));
    }
    if (!keep) std::filesystem::remove(path);
  }
}

// The paths under `out_dir` of a cell's pictures, and back.
std::vector<std::string> relative_to(const std::string& out_dir, const std::vector<std::string>& files) {
  std::vector<std::string> out;
  for (const std::string& f : files) out.push_back(std::filesystem::path(f).lexically_relative(out_dir).string());
  return out;
}
std::vector<std::string> under(const std::string& out_dir, const std::vector<std::string>& files) {
  std::vector<std::string> out;
  for (const std::string& f : files) out.push_back((std::filesystem::path(out_dir) / f).string());
  return out;
}

// A batch's scores put back from its pieces, into `scores` (its cell's): per metric and
// method, the values of its expensive images, or for randomisation the steps in order and
// each image's mean over them as the whole test takes it.
void put_back_pieces(const ImageRange& batch, const std::vector<ReportCell>& cells, const std::string& folder,
                     const Provenance& wanted, const std::vector<std::string>& methods, const ReportRun& run,
                     CellScores& scores) {
  const int64_t expensive = expensive_in_batch(run.expensive, batch.first, batch.count);
  std::map<std::pair<std::string, std::string>, std::vector<const ReportCell*>> by_metric_method;
  for (const ReportCell& c : cells)
    if (c.piece && c.images == batch) by_metric_method[{c.piece->metric, c.piece->method}].push_back(&c);
  for (auto& [key, pieces] : by_metric_method) {
    const auto& [metric, method] = key;
    std::sort(pieces.begin(), pieces.end(),
              [](const ReportCell* a, const ReportCell* b) { return a->piece->first_step < b->piece->first_step; });
    std::vector<std::vector<double>> values;  // per entry, in order
    for (const ReportCell* piece : pieces) {
      const std::string path = (std::filesystem::path(folder) / cell_file_name(batch, piece->piece)).string();
      const ImageCell cell = read_image_cell_text(read_text_file(path), path);
      check(reusable_cell(path, cell, cells, wanted, methods, run.options), path, ": made by another run");
      for (const std::string& entry : piece_keys(*piece->piece)) {
        const std::vector<double>& v = cell.scores.at(method).at(entry);
        check(int64_t(v.size()) == expensive, path, ": ", v.size(), " values of ", entry, " for ", expensive,
              " expensive images");
        values.push_back(v);
      }
    }
    const bool by_step = pieces.front()->piece->steps > 0;
    scores[method][metric] = by_step ? mean_over_steps(values, expensive) : values.front();
  }
}

// The report in cells (ReportOptions::cells): the cells found on disk checked on rank 0, the
// others handed out over the ranks (the costliest first) and written as each is finished,
// then on rank 0 every batch's cell, with its pieces put back, read in image order into
// `scores` and `files`.
void run_in_cells(const BatchWork& w, CellScores& scores, std::vector<std::string>& files, const MethodDone& done,
                  const std::function<void(const ReportCell&)>& piece_done, ReportTimes& times) {
  const ReportOptions& o = w.run.options;
  const std::string folder = (std::filesystem::path(o.out_dir) / "cells").string();
  const std::vector<ReportCell> cells = report_cells(o, w.run.images, w.run.height, w.run.width, w.run.layers);
  const Provenance wanted = report_record(o, w.run.images);
  on_rank_zero([&] {
    std::filesystem::create_directories(folder);
    remove_stale_temporaries(folder);  // of a rank killed while writing a cell
    check_cells_on_disk(folder, cells, wanted, w.methods, o);
  });
  distributed::for_each_item(int64_t(cells.size()), [&](int64_t i) {
    const ReportCell& c = cells[size_t(i)];
    const std::string name = cell_file_name(c.images, c.piece);
    const std::string path = (std::filesystem::path(folder) / name).string();
    if (std::filesystem::exists(path)) {  // checked by rank 0 before any cell was handed out
      if (o.cells.log) o.cells.log(cat(name, ": done before"));
      return;
    }
    if (c.piece) {
      write_file_atomic(path, image_cell_text({c.images, c.piece, run_piece(w, c.images, *c.piece, times), {}, wanted}));
      if (piece_done) piece_done(c);
      return;
    }
    std::vector<std::string> drawn;
    ImageCell cell{c.images, std::nullopt, run_batch(w, c.images.first, drawn, done, times), relative_to(o.out_dir, drawn),
                   wanted};
    timed(times.pictures, [&] { w.writer.finish(); });  // a cell on disk has its pictures on disk
    write_file_atomic(path, image_cell_text(cell));
  });
  on_rank_zero([&] {
    for (const ImageRange& range : image_cells(w.run.images, o.batch_size)) {
      const std::string path = (std::filesystem::path(folder) / cell_file_name(range)).string();
      ImageCell cell = read_image_cell_text(read_text_file(path), path);
      check(reusable_cell(path, cell, cells, wanted, w.methods, o), path, ": made by another run");
      put_back_pieces(range, cells, folder, wanted, w.methods, w.run, cell.scores);
      append(scores, cell.scores);
      const std::vector<std::string> pictures = under(o.out_dir, cell.files);
      files.insert(files.end(), pictures.begin(), pictures.end());
    }
  });
}

}  // namespace

ReportResult explain_report(const Model& model, const Tensor& x_in, const std::vector<int64_t>& labels,
                            const ReportOptions& o, const ReportProgress& progress) {
  const auto start = std::chrono::steady_clock::now();
  check_request(model, x_in, o);
  const std::vector<std::string> methods = o.methods.empty() ? explanation_methods() : resolve_methods(o.methods);
  const MetricList metrics = metric_rows(resolve_metrics(o.metrics));
  const int64_t N = x_in.size(0);
  check(labels.empty() || int64_t(labels.size()) == N, "explain_report: ", labels.size(), " labels for ", N, " images");
  if (o.cells.enabled) {
    check(!o.out_dir.empty(), "explain_report: a report in cells needs a folder to write them to");
    check(!o.write_attributions, "explain_report: a report in cells keeps no maps to write as attributions");
  }
  ReportResult result;
  if (!o.out_dir.empty()) std::filesystem::create_directories(o.out_dir);
  ReportRun run{.model = model, .options = o};
  start_run(run, x_in, labels, metrics);

  const int64_t pictures = o.out_dir.empty() ? 0 : o.picture_images < 0 ? N : std::min(o.picture_images, N);
  const int64_t scale = o.scale > 0 ? o.scale : default_scale(run.height, run.width);
  PictureWriter writer;
  MetricList in_batch;
  for (const ReportMetric* m : metrics)
    if (!runs_in_pieces(o, *m, run.randomised)) in_batch.push_back(m);
  const BatchWork work{run,    metrics, methods, pictures, scale, double(patch_count(o.metric_settings, run.height, run.width)),
                       writer, in_batch};
  const bool keep_attributions = !o.out_dir.empty() && o.write_attributions;
  CellScores scores;  // method → metric → values
  std::optional<AttributionFiles> attribution_files;
  if (keep_attributions) attribution_files.emplace(run, methods, writer);

  // Progress counts maps, and follows the cost model for the share of the work done: the
  // expensive metrics make the first batches much slower than the last.
  const int64_t total = N * int64_t(methods.size());
  int64_t done = 0;
  double total_cost = 0;
  for (double c : report_work_costs(o, N, run.height, run.width, run.layers)) total_cost += c;
  double spent = 0;
  if (progress) progress(0, total, 0.0, "");
  std::vector<int64_t> found_targets;  // with targets_from_first_method: each batch's, in turn
  const MethodDone method_done = [&](const std::string& method, const ReportBatch& batch, const Tensor& attr,
                                     const Tensor& counterfactual, double cost) {
    if (run.targets_from_first_method && method == methods.front())
      found_targets.insert(found_targets.end(), batch.targets.begin(), batch.targets.end());
    if (attribution_files) attribution_files->add(method, batch.first, attr, counterfactual);
    done += batch.size;
    spent += cost;
    if (progress) progress(done, total, total_cost > 0 ? std::min(1.0, spent / total_cost) : 1.0, method);
  };
  if (o.cells.enabled) {
    const auto piece_done = [&](const ReportCell& piece) {
      spent += piece.cost;
      if (progress)
        progress(done, total, total_cost > 0 ? std::min(1.0, spent / total_cost) : 1.0,
                 cat(piece.piece->metric, " of ", piece.piece->method));
    };
    run_in_cells(work, scores, result.files, method_done, piece_done, result.times);
    if (distributed::rank() != 0) {  // rank 0 makes the table
      result.targets = run.targets;
      result.times.total = seconds_since(start);
      return result;
    }
  } else {
    for (int64_t f = 0; f < N; f += o.batch_size)
      append(scores, run_batch(work, f, result.files, method_done, result.times));
  }

  if (run.targets_from_first_method) run.targets = found_targets;
  result.targets = run.targets;
  timed(result.times.pictures, [&] { writer.finish(); });  // the last pictures
  if (attribution_files) attribution_files->finish(run.targets, result.files);  // by the writer's thread
  result.table = metric_table(run, methods, metrics, scores);
  if (!o.out_dir.empty() && o.write_tables && !metrics.empty()) write_table_files(result.table, o.out_dir, result.files);
  if (o.beside_last_files) o.beside_last_files(result.files);
  writer.finish();
  result.times.total = seconds_since(start);
  return result;
}

double picture_seconds(const ReportOptions& o, int64_t images, int64_t height, int64_t width) {
  const int64_t shown = o.picture_images < 0 ? images : std::min(o.picture_images, images);
  if (shown == 0 || o.out_dir.empty()) return 0;
  const std::vector<std::string> methods = o.methods.empty() ? explanation_methods() : resolve_methods(o.methods);
  double pictures = 1;  // the input
  for (const std::string& m : methods) pictures += is_ascent(m) ? 3 : 2;  // heat-map, overlay, counterfactual
  Generator gen(0);
  const Tensor x = normal({3, height, width}, 0.0f, 1.0f, gen), map = normal({3, height, width}, 0.0f, 1.0f, gen);
  const int64_t scale = o.scale > 0 ? o.scale : default_scale(height, width);
  const auto start = std::chrono::steady_clock::now();
  encode_png(render_overlay(x, map, o.normalisation, scale));
  const double one = seconds_since(start);
  return one * 2 * pictures * double(shown) / double(num_threads());
}

double seconds_per_image_pass(const Model& model, const Tensor& x, int64_t batch) {
  const int64_t n = std::min<int64_t>(batch, x.size(0));
  Tensor xb = x.view_as_strided({n, x.size(1), x.size(2), x.size(3)},
                                {x.size(1) * x.size(2) * x.size(3), x.size(2) * x.size(3), x.size(3), 1}, 0)
                  .contiguous();
  const std::vector<int64_t> targets = predicted_classes(model, xb);
  explain("gradient", model, xb, targets);  // warm-up: first-touch allocations
  const auto start = std::chrono::steady_clock::now();
  explain("gradient", model, xb, targets);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / double(n);
}

}  // namespace adjoint
