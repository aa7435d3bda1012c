#include "analysis/pullbacks/report.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <optional>

#include "analysis/pullbacks/cells.h"
#include "analysis/pullbacks/focus.h"
#include "analysis/pullbacks/randomisation.h"
#include "engine/autograd.h"
#include "engine/data/open.h"
#include "engine/distributed.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "engine/io/files.h"
#include "engine/io/json.h"
#include "engine/io/safetensors.h"

namespace adjoint {

namespace {

// ---- formatting ----------------------------------------------------------------------

std::string number(double v) {
  if (std::isnan(v)) return "nan";
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

// Numbers for JSON, where NaN and infinity have no spelling: null.
Json json_number(double v) { return std::isfinite(v) ? Json(v) : Json(); }

std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) out += c == '"' ? std::string("\"\"") : std::string(1, c);
  return out + "\"";
}

// Markdown cells cannot hold a bare '|'.
std::string md_cell(const std::string& s) {
  std::string out;
  for (char c : s) out += c == '|' ? std::string("\\|") : std::string(1, c);
  return out;
}

// ---- tensors ---------------------------------------------------------------------------

// A copy of rows [begin, begin + count) of a contiguous batch.
Tensor rows(const Tensor& t, int64_t begin, int64_t count) {
  Shape shape = t.shape();
  const int64_t row = t.numel() / shape[0];
  shape[0] = count;
  Tensor out = Tensor::empty(shape);
  std::copy(t.data() + begin * row, t.data() + (begin + count) * row, out.data());
  return out;
}

// Example i of a contiguous batch (N, ...) as a tensor of one example's shape.
Tensor example(const Tensor& t, int64_t i) {
  const Shape shape(t.shape().begin() + 1, t.shape().end());
  Tensor out = Tensor::empty(shape);
  const int64_t row = out.numel();
  std::copy(t.data() + i * row, t.data() + (i + 1) * row, out.data());
  return out;
}

// Writes rows of `part` into `whole` from row `begin` on.
void put_rows(Tensor& whole, const Tensor& part, int64_t begin) {
  const int64_t row = whole.numel() / whole.size(0);
  std::copy(part.data(), part.data() + part.numel(), whole.data() + begin * row);
}

// (N, C, H, W) → (N, 1, H, W): the signed evidence per pixel.
Tensor sum_channels(const Tensor& attr) {
  const int64_t N = attr.size(0), C = attr.size(1), HW = attr.size(2) * attr.size(3);
  Tensor out = Tensor::zeros({N, 1, attr.size(2), attr.size(3)});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < HW; ++i) out.data()[n * HW + i] += attr.data()[(n * C + c) * HW + i];
  return out;
}

bool is_ascent(const std::string& method) { return method == "pullback_ascent" || method == "gradient_ascent"; }

// Defaults of the metrics as the report runs them (analysis/pullbacks/metrics.h).
constexpr int64_t kSensitivitySamples = 10;
constexpr int64_t kFaithfulnessSubsets = 50;
constexpr int64_t kMonotonicitySamples = 10;

int64_t patch_count(int64_t height, int64_t width) {
  const int64_t side = (height + 7) / 8;  // ceil(H/8): the metrics' default patch side
  return ((height + side - 1) / side) * ((width + side - 1) / side);
}

int64_t samples_per_size(int64_t perturbations) { return std::max<int64_t>(1, (perturbations + 1) / 2); }

}  // namespace

// ---- tables --------------------------------------------------------------------------------

const MetricRow* MetricTable::find(const std::string& method, const std::string& metric) const {
  for (const MetricRow& r : rows)
    if (r.method == method && r.metric == metric) return &r;
  return nullptr;
}

std::string direction_arrow(const MetricInfo& info) { return info.higher_is_better ? "↑" : "↓"; }

std::string table_csv(const MetricTable& t) {
  std::string out = "method,metric,direction,higher_is_better,mean,std,ci_low,ci_high,count,undefined,images,note\n";
  for (const MetricColumn& col : t.metrics)
    for (const std::string& method : t.methods) {
      const MetricRow* r = t.find(method, col.info.name);
      if (!r) continue;
      const Summary& s = r->summary;
      out += cat(csv_field(method), ",", col.info.name, ",", col.info.direction(), ",",
                 col.info.higher_is_better ? "true" : "false", ",", number(s.mean), ",", number(s.std), ",",
                 number(s.ci_low), ",", number(s.ci_high), ",", s.count, ",", s.undefined, ",", col.images, ",",
                 csv_field(col.note), "\n");
    }
  return out;
}

std::string table_json(const MetricTable& t) {
  Json root = Json::object();
  Json context = Json::object();
  for (const auto& [key, value] : t.context) context[key] = value;
  root["context"] = context;
  root["confidence"] = t.confidence;
  root["methods"] = Json::array();
  for (const std::string& m : t.methods) root["methods"].push_back(m);
  root["metrics"] = Json::array();
  for (const MetricColumn& col : t.metrics)
    root["metrics"].push_back(Json(Json::Object{{"name", col.info.name},
                                                {"higher_is_better", col.info.higher_is_better},
                                                {"direction", col.info.direction()},
                                                {"arrow", direction_arrow(col.info)},
                                                {"description", col.info.description},
                                                {"images", col.images},
                                                {"note", col.note}}));
  root["results"] = Json::array();
  for (const MetricColumn& col : t.metrics)
    for (const std::string& method : t.methods) {
      const MetricRow* r = t.find(method, col.info.name);
      if (!r) continue;
      const Summary& s = r->summary;
      root["results"].push_back(Json(Json::Object{{"method", method},
                                                  {"metric", col.info.name},
                                                  {"mean", json_number(s.mean)},
                                                  {"std", json_number(s.std)},
                                                  {"ci_low", json_number(s.ci_low)},
                                                  {"ci_high", json_number(s.ci_high)},
                                                  {"count", s.count},
                                                  {"undefined", s.undefined}}));
    }
  return to_json(root, 2) + "\n";
}

std::string table_markdown(const MetricTable& t) {
  std::string out = "# Explanation quality\n\n";
  for (const auto& [key, value] : t.context) out += cat("- ", key, ": ", value, "\n");
  if (!t.context.empty()) out += "\n";
  const int ci = int(std::lround(100 * t.confidence));

  // The best mean of each metric, in bold in the summary grid.
  std::map<std::string, std::string> best;
  for (const MetricColumn& col : t.metrics) {
    double best_mean = NAN;
    for (const std::string& method : t.methods) {
      const MetricRow* r = t.find(method, col.info.name);
      if (!r || std::isnan(r->summary.mean)) continue;
      const double m = r->summary.mean;
      if (std::isnan(best_mean) || (col.info.higher_is_better ? m > best_mean : m < best_mean)) {
        best_mean = m;
        best[col.info.name] = method;
      }
    }
  }

  out += "## Summary\n\nMean over images; ↑ higher is better, ↓ lower is better; the best method of each metric in bold.\n\n";
  out += "| method |";
  for (const MetricColumn& col : t.metrics) out += cat(" ", col.info.name, " ", direction_arrow(col.info), " |");
  out += "\n|---|";
  for (size_t i = 0; i < t.metrics.size(); ++i) out += "---:|";
  out += "\n";
  for (const std::string& method : t.methods) {
    out += cat("| ", md_cell(method), " |");
    for (const MetricColumn& col : t.metrics) {
      const MetricRow* r = t.find(method, col.info.name);
      const std::string v = r ? number(r->summary.mean) : "—";
      const auto b = best.find(col.info.name);
      out += b != best.end() && b->second == method ? cat(" **", v, "** |") : cat(" ", v, " |");
    }
    out += "\n";
  }

  for (const MetricColumn& col : t.metrics) {
    out += cat("\n## ", col.info.name, " ", direction_arrow(col.info), " (", col.info.direction(), ")\n\n",
               col.info.description, ". ", col.images, " ", col.unit, col.note.empty() ? "" : "; " + col.note, ".\n\n");
    out += cat("| method | mean ± std | ", ci, "% CI | n | undefined |\n|---|---:|---:|---:|---:|\n");
    for (const std::string& method : t.methods) {
      const MetricRow* r = t.find(method, col.info.name);
      if (!r) {
        out += cat("| ", md_cell(method), " | — | — | 0 | — |\n");
        continue;
      }
      const Summary& s = r->summary;
      out += cat("| ", md_cell(method), " | ", number(s.mean), " ± ", number(s.std), " | [", number(s.ci_low), ", ",
                 number(s.ci_high), "] | ", s.count, " | ", s.undefined, " |\n");
    }
  }
  return out;
}

// ---- what the metrics' steps work on -----------------------------------------------------

// Everything the metrics share over one report, set up once by start_run.
struct ReportRun {
  const Model& model;
  const ReportOptions& options;
  Classifier classifier{};                   // the model's logits, recording off
  Tensor x{};                                // (N, C, H, W), contiguous
  std::vector<int64_t> labels{}, targets{};  // labels may be empty
  int64_t images = 0, height = 0, width = 0;
  int64_t expensive = 0;                     // E: the expensive metrics run on the first E images
  int64_t classes = 0;
  int64_t layers = 0, randomised = 0;        // the model's layers; those randomisation re-initialises
  // The metrics' settings, seeded by options.metric_seed (first_example is set per batch).
  InfidelityOptions infidelity{};
  FaithfulnessCorrelationOptions faithfulness_correlation{};
  MonotonicityOptions monotonicity{};
  MaxSensitivityOptions max_sensitivity{};
  RandomisationOptions randomisation{};
  // Focus: mosaics drawn once from the whole set (its prepare step), and how.
  Mosaics mosaics{};
  std::string focus_note{};

  InputRange range() const { return options.explain.range; }
  int64_t mosaic_count() const { return mosaics.images.defined() ? mosaics.images.size(0) : 0; }
  // "first E of the N images" when the expensive metrics run on part of the set.
  std::string expensive_note() const {
    return expensive < images ? cat("first ", expensive, " of the ", images, " images") : "";
  }
};

// One batch: images [first, first + size), of which the first `expensive` are in the
// expensive set; mosaics [first_mosaic, first_mosaic + mosaics); the batch's probes.
struct ReportBatch {
  int64_t first = 0, size = 0, expensive = 0;
  Tensor x, x_expensive;
  std::vector<int64_t> targets, targets_expensive;
  int64_t first_mosaic = 0, mosaics = 0;
  InfidelityProbe infidelity;
  FaithfulnessCorrelationProbe faithfulness_correlation;
  PatchProbe faithfulness_estimate, monotonicity;
};

// One method's maps of a batch, and how to explain again (for the metrics that do).
struct MethodMaps {
  std::string method;
  Tensor attr, attr_expensive;  // the batch's maps; the rows of its expensive images
  Explainer explainer;
};

// What a batch's cost depends on.
struct BatchCounts {
  const ReportOptions& options;
  int64_t images = 0, expensive = 0;  // of the batch
  double patches = 0;                 // per image, in the patch metrics' grid
  int64_t randomised = 0;             // layers re-initialised by randomisation
};

// ---- the metrics' steps ------------------------------------------------------------------

namespace {

// A metric's options with the draws keyed from the batch's first image on.
template <class Options>
Options from_example(Options options, int64_t first) {
  options.first_example = first;
  return options;
}

std::string join_notes(const std::string& a, const std::string& b) {
  return a.empty() ? b : b.empty() ? a : a + "; " + b;
}

// Mosaics m ∈ [begin, begin + count) of a set.
Mosaics mosaic_rows(const Mosaics& all, int64_t begin, int64_t count) {
  Mosaics out;
  out.images = rows(all.images, begin, count);
  out.targets.assign(all.targets.begin() + begin, all.targets.begin() + begin + count);
  out.target_tiles.assign(all.target_tiles.begin() + begin, all.target_tiles.begin() + begin + count);
  out.sources.assign(all.sources.begin() + begin, all.sources.begin() + begin + count);
  return out;
}

constexpr double kForward = 1.0 / 3.0;  // a forward pass is about a third of forward + backward

// -- infidelity: probed on the batch, noise patches of sides H/2 and H/4
void probe_infidelity_step(const ReportRun& run, ReportBatch& batch) {
  batch.infidelity = probe_infidelity(run.classifier, batch.x, batch.targets, run.range(),
                                      from_example(run.infidelity, batch.first));
}
std::optional<MetricResult> score_infidelity(const ReportRun&, const ReportBatch& batch, const MethodMaps& maps) {
  return infidelity(batch.infidelity, maps.attr);
}
std::string infidelity_note(const ReportRun& run) {
  const int64_t each = run.infidelity.samples_per_size;
  return cat(2 * each, " perturbations per image, the same for every method: ", "uniform-noise patches of side ",
             std::max<int64_t>(1, run.height / 2), " and ", std::max<int64_t>(1, run.height / 4), ", ", each, " each");
}

// -- max-sensitivity: explains the expensive images again under noise
std::optional<MetricResult> score_max_sensitivity(const ReportRun& run, const ReportBatch& batch,
                                                  const MethodMaps& maps) {
  if (batch.expensive == 0) return std::nullopt;
  return max_sensitivity(maps.explainer, batch.x_expensive, batch.targets_expensive, run.range(),
                         from_example(run.max_sensitivity, batch.first), maps.attr_expensive);
}
std::string max_sensitivity_note(const ReportRun& run) {
  return join_notes(run.expensive_note(),
                    cat(kSensitivitySamples, " samples in an L-inf ball of radius 0.02 of the range"));
}

// -- random logit: explains every image again for another class
std::optional<MetricResult> score_random_logit(const ReportRun& run, const ReportBatch& batch, const MethodMaps& maps) {
  if (run.classes < 2) return std::nullopt;
  return random_logit(maps.explainer, batch.x, batch.targets, run.classes, {run.options.metric_seed, batch.first},
                      maps.attr);
}
std::string random_logit_note(const ReportRun& run) {
  return run.classes < 2 ? "not computed: the model has one class" : "";
}

// -- faithfulness correlation: probed on random feature subsets set to 0
void probe_faithfulness_correlation_step(const ReportRun& run, ReportBatch& batch) {
  batch.faithfulness_correlation = probe_faithfulness_correlation(
      run.classifier, batch.x, batch.targets, from_example(run.faithfulness_correlation, batch.first));
}
std::optional<MetricResult> score_faithfulness_correlation(const ReportRun&, const ReportBatch& batch,
                                                           const MethodMaps& maps) {
  return faithfulness_correlation(batch.faithfulness_correlation, maps.attr);
}
std::string faithfulness_correlation_note(const ReportRun&) {
  return cat(kFaithfulnessSubsets, " random subsets of 10% of the features, set to 0");
}

// -- faithfulness estimate: probed on the patches of an 8x8 grid set to 0
void probe_faithfulness_estimate_step(const ReportRun& run, ReportBatch& batch) {
  batch.faithfulness_estimate = probe_faithfulness_estimate(run.classifier, batch.x, batch.targets);
}
std::optional<MetricResult> score_faithfulness_estimate(const ReportRun&, const ReportBatch& batch,
                                                        const MethodMaps& maps) {
  return faithfulness_estimate(batch.faithfulness_estimate, maps.attr);
}
std::string faithfulness_estimate_note(const ReportRun&) { return "8x8 grid of patches set to 0"; }

// -- monotonicity correlation: probed on the expensive images' noised patches
void probe_monotonicity_step(const ReportRun& run, ReportBatch& batch) {
  if (batch.expensive == 0) return;
  batch.monotonicity = probe_monotonicity(run.classifier, batch.x_expensive, batch.targets_expensive, run.range(),
                                          from_example(run.monotonicity, batch.first));
}
std::optional<MetricResult> score_monotonicity(const ReportRun&, const ReportBatch& batch, const MethodMaps& maps) {
  if (batch.expensive == 0) return std::nullopt;
  return monotonicity_correlation(batch.monotonicity, maps.attr_expensive);
}
std::string monotonicity_note(const ReportRun& run) {
  return join_notes(run.expensive_note(), cat("8x8 grid of patches, ", kMonotonicitySamples, " noise samples each"));
}

// -- sparseness and complexity: of the pixel maps (channels summed)
std::optional<MetricResult> score_sparseness(const ReportRun&, const ReportBatch&, const MethodMaps& maps) {
  return sparseness(sum_channels(maps.attr));
}
std::optional<MetricResult> score_complexity(const ReportRun&, const ReportBatch&, const MethodMaps& maps) {
  return complexity(sum_channels(maps.attr));
}
std::string pixel_map_note(const ReportRun&) { return "pixel maps (summed over channels)"; }

// -- model-parameter randomisation: explains the expensive images once per layer
std::optional<MetricResult> score_randomisation(const ReportRun& run, const ReportBatch& batch, const MethodMaps& maps) {
  if (batch.expensive == 0) return std::nullopt;
  const ExplainerFactory factory = [method = maps.method, eo = run.options.explain](const Model& m) {
    return make_explainer(method, m, eo);
  };
  return model_parameter_randomisation(run.model, factory, batch.x_expensive, batch.targets_expensive,
                                       run.randomisation, maps.attr_expensive)
      .mean;
}
std::string randomisation_note(const ReportRun& run) {
  return join_notes(run.expensive_note(), cat("mean Spearman correlation of |attr| over ", run.randomised, " of ",
                                              run.layers, " layers re-initialised cumulatively from the output"));
}

// The model's top class of every row of x, `batch` rows at a time.
std::vector<int64_t> predicted_in_batches(const Model& model, const Tensor& x, int64_t batch) {
  std::vector<int64_t> predicted;
  for (int64_t f = 0; f < x.size(0); f += batch) {
    const std::vector<int64_t> p = predicted_classes(model, rows(x, f, std::min(batch, x.size(0) - f)));
    predicted.insert(predicted.end(), p.begin(), p.end());
  }
  return predicted;
}

// -- focus: E mosaics drawn from the whole set; mosaic m is explained with batch m / B
void prepare_focus(ReportRun& run) {
  try {
    run.mosaics = make_mosaics(run.x, run.labels.empty() ? run.targets : run.labels, run.expensive,
                               run.options.metric_seed);
    // How often the model itself names the target class of a mosaic. Where it rarely does,
    // its logit for that class does not come from the target tiles, and a focus near 0.5 for
    // every method says the mosaics are not recognised, not that the methods fail to localise.
    const int64_t count = run.mosaic_count();
    const std::vector<int64_t> top = predicted_in_batches(run.model, run.mosaics.images, run.options.batch_size);
    int64_t recognised = 0;
    for (size_t i = 0; i < top.size(); ++i) recognised += top[i] == run.mosaics.targets[i];
    run.focus_note = cat(run.expensive, " mosaics of 2x2 downscaled images drawn from the ", run.images,
                         " images (tile classes: ", run.labels.empty() ? "the explained classes" : "the data's labels",
                         "); the model's top class is the mosaic's target class on ",
                         std::round(1000.0 * double(recognised) / double(std::max<int64_t>(count, 1))) / 10.0,
                         "% of them");
  } catch (const Error& e) {
    run.focus_note = cat("not computed: ", e.what());
  }
}
std::optional<MetricResult> score_focus(const ReportRun& run, const ReportBatch& batch, const MethodMaps& maps) {
  if (batch.mosaics == 0) return std::nullopt;
  const Mosaics part = mosaic_rows(run.mosaics, batch.first_mosaic, batch.mosaics);
  return focus(part, maps.explainer(part.images, part.targets));
}
std::string focus_note(const ReportRun& run) { return run.focus_note; }

}  // namespace

// ---- the metric table ----------------------------------------------------------------------

const std::vector<ReportMetric>& report_metrics() {
  static const std::vector<ReportMetric> table = {
      {.info = metric_info("infidelity"),
       .by_default = true,
       .help = "how well <attr, x - x'> predicts the logit drop under noise patches",
       .probe = probe_infidelity_step,
       .score = score_infidelity,
       .probe_passes = [](const BatchCounts& c) {
         return double(c.images * 2 * samples_per_size(c.options.perturbations)) * kForward;
       },
       .note = infidelity_note},
      {.info = metric_info("max_sensitivity"),
       .expensive = true,
       .by_default = true,
       .help = "how much the map changes under small input noise",
       .score = score_max_sensitivity,
       .explanations = [](const BatchCounts& c) { return double(c.expensive * kSensitivitySamples); },
       .note = max_sensitivity_note},
      {.info = metric_info("random_logit"),
       .by_default = true,
       .help = "how alike the maps of the target and of a random other class are",
       .score = score_random_logit,
       .explanations = [](const BatchCounts& c) { return double(c.images); },
       .note = random_logit_note},
      {.info = metric_info("faithfulness_correlation"),
       .by_default = true,
       .help = "how the attribution of random feature subsets follows the logit drop when they are removed",
       .probe = probe_faithfulness_correlation_step,
       .score = score_faithfulness_correlation,
       .probe_passes = [](const BatchCounts& c) { return double(c.images * kFaithfulnessSubsets) * kForward; },
       .note = faithfulness_correlation_note},
      {.info = metric_info("faithfulness_estimate"),
       .by_default = true,
       .help = "how the attribution of each patch follows the logit drop when it is removed",
       .probe = probe_faithfulness_estimate_step,
       .score = score_faithfulness_estimate,
       .probe_passes = [](const BatchCounts& c) { return double(c.images) * c.patches * kForward; },
       .note = faithfulness_estimate_note},
      {.info = metric_info("monotonicity_correlation"),
       .expensive = true,
       .by_default = true,
       .help = "how the rank of each patch's |attr| follows the logit's change when it is noised",
       .probe = probe_monotonicity_step,
       .score = score_monotonicity,
       .probe_passes = [](const BatchCounts& c) {
         return double(c.expensive * kMonotonicitySamples) * c.patches * kForward;
       },
       .note = monotonicity_note},
      {.info = metric_info("sparseness"),
       .by_default = true,
       .help = "how concentrated the map is (Gini index)",
       .score = score_sparseness,
       .note = pixel_map_note},
      {.info = metric_info("complexity"),
       .by_default = true,
       .help = "how spread out the map is (entropy)",
       .score = score_complexity,
       .note = pixel_map_note},
      {.info = metric_info("model_parameter_randomisation"),
       .alias = "randomisation",
       .expensive = true,
       .help = "how alike the maps stay as the model's layers are re-initialised",
       .score = score_randomisation,
       .explanations = [](const BatchCounts& c) { return double(c.expensive * c.randomised); },
       .note = randomisation_note},
      {.info = metric_info("focus"),
       .expensive = true,
       .on_mosaics = true,
       .help = "the share of the positive attribution on the target-class tiles of 2x2 mosaics",
       .prepare = prepare_focus,
       .score = score_focus,
       .explanations = [](const BatchCounts& c) { return double(c.expensive); },  // one mosaic per expensive image
       .note = focus_note},
  };
  return table;
}

const ReportMetric* find_report_metric(const std::string& name) {
  for (const ReportMetric& m : report_metrics())
    if (m.info.name == name || (!m.alias.empty() && m.alias == name)) return &m;
  return nullptr;
}

// ---- names -------------------------------------------------------------------------------

std::vector<std::string> report_metric_names() {
  std::vector<std::string> names;
  for (const ReportMetric& m : report_metrics()) names.push_back(m.info.name);
  return names;
}

std::vector<std::string> resolve_metrics(const std::vector<std::string>& names) {
  const std::vector<ReportMetric>& table = report_metrics();
  std::vector<bool> chosen(table.size(), false);
  for (const std::string& given : names) {
    const ReportMetric* m = find_report_metric(given);
    if (!m) {
      std::string list, aliases;
      for (const ReportMetric& k : table) {
        list += (list.empty() ? "" : ", ") + k.info.name;
        if (!k.alias.empty()) aliases += cat(k.alias, " for ", k.info.name, "; ");
      }
      throw UsageError(cat("unknown metric '", given, "'; known: ", list, " (", aliases, "none for no metrics)"));
    }
    const size_t i = size_t(m - table.data());
    if (chosen[i]) throw UsageError(cat("metric '", given, "' named twice"));
    chosen[i] = true;
  }
  std::vector<std::string> out;  // in the table's order, the order of the report's columns
  for (size_t i = 0; i < table.size(); ++i)
    if (chosen[i]) out.push_back(table[i].info.name);
  return out;
}

std::vector<std::string> resolve_methods(const std::vector<std::string>& names) {
  const std::vector<std::string> known = explanation_methods();
  std::vector<std::string> out;
  for (const std::string& given : names) {
    if (std::find(known.begin(), known.end(), given) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      throw UsageError(cat("unknown explanation method '", given, "'; known: ", list));
    }
    if (std::find(out.begin(), out.end(), given) != out.end()) throw UsageError(cat("method '", given, "' named twice"));
    out.push_back(given);
  }
  return out;
}

bool is_expensive_metric(const std::string& metric) {
  const ReportMetric* m = find_report_metric(metric);
  return m && m->expensive;
}

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

// The images of the expensive set: the first expensive_count (0: all).
int64_t expensive_images(const ReportOptions& o, int64_t images) {
  return o.expensive_count > 0 ? std::min(o.expensive_count, images) : images;
}

// Of batch [first, first + size): how many images are in the expensive set.
int64_t expensive_in_batch(int64_t expensive, int64_t first, int64_t size) {
  return std::clamp<int64_t>(expensive - first, 0, size);
}

}  // namespace

double report_cost(const ReportOptions& o, int64_t images, int64_t height, int64_t width, int64_t layers) {
  const std::vector<std::string> methods = o.methods.empty() ? explanation_methods() : resolve_methods(o.methods);
  const MetricList metrics = metric_rows(resolve_metrics(o.metrics));
  const int64_t E = expensive_images(o, images);
  const double patches = double(patch_count(height, width));
  const int64_t batch = std::max<int64_t>(1, o.batch_size), randomised = randomised_layers(o, layers);
  // Batch by batch, as explain_report spends it.
  double cost = 0;
  for (int64_t f = 0; f < images; f += batch) {
    const int64_t b = std::min(batch, images - f);
    const BatchCounts counts{o, b, expensive_in_batch(E, f, b), patches, randomised};
    cost += probe_cost(metrics, counts);
    for (const std::string& m : methods) cost += method_batch_cost(m, metrics, counts);
  }
  return cost;
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
  {
    NoGrad off;
    run.classes = run.model.forward(rows(run.x, 0, 1)).size(1);
  }
  run.targets = explained_classes(run);
  run.layers = int64_t(layers_top_down(run.model).size());
  run.randomised = randomised_layers(o, run.layers);

  run.infidelity.seed = o.metric_seed;
  run.infidelity.samples_per_size = samples_per_size(o.perturbations);
  run.faithfulness_correlation.seed = o.metric_seed;
  run.faithfulness_correlation.subsets = kFaithfulnessSubsets;
  run.monotonicity.seed = o.metric_seed;
  run.monotonicity.samples = kMonotonicitySamples;
  run.max_sensitivity.seed = o.metric_seed;
  run.max_sensitivity.samples = kSensitivitySamples;
  run.randomisation.seed = 42 + o.metric_seed;
  run.randomisation.max_layers = o.randomisation_layers;
  for (const ReportMetric* m : metrics)
    if (m->prepare) m->prepare(run);
}

// Batch [first, first + batch_size) with its probes.
ReportBatch start_batch(const ReportRun& run, const MetricList& metrics, int64_t first) {
  ReportBatch batch;
  batch.first = first;
  batch.size = std::min(run.options.batch_size, run.images - first);
  batch.expensive = expensive_in_batch(run.expensive, first, batch.size);
  batch.x = rows(run.x, first, batch.size);
  batch.targets.assign(run.targets.begin() + first, run.targets.begin() + first + batch.size);
  if (batch.expensive > 0) batch.x_expensive = rows(run.x, first, batch.expensive);
  batch.targets_expensive.assign(run.targets.begin() + first, run.targets.begin() + first + batch.expensive);
  const int64_t M = run.mosaic_count();
  batch.first_mosaic = std::min(first, M);
  batch.mosaics = std::clamp<int64_t>(M - first, 0, batch.size);
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

// The pictures of a batch's first `shown` images: the inputs, then per method a heat-map,
// an overlay and the counterfactual, then one contact sheet per image.
struct BatchPictures {
  const ReportOptions& options;
  int64_t first = 0, shown = 0, scale = 0;
  std::vector<std::string>& files;
  std::vector<std::vector<SheetColumn>> sheets;
  std::vector<std::pair<std::string, Image>> pending;  // drawn, not yet encoded

  // Queued here and encoded by encode_pending, one picture per thread: PNG compression is
  // most of a picture's cost. The list of files keeps the order they were drawn in.
  void write(const std::string& path, const Image& image) {
    pending.emplace_back(path, image);
    files.push_back(path);
  }

  void encode_pending() {
    parallel_for(int64_t(pending.size()), 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) write_png(pending[size_t(i)].first, pending[size_t(i)].second);
    });
    pending.clear();
  }

  void inputs(const ReportBatch& batch) {
    sheets.resize(size_t(shown));
    for (int64_t i = 0; i < shown; ++i) {
      const std::string dir = picture_dir(options.out_dir, first + i);
      std::filesystem::create_directories(dir);
      const Image input = render_input(example(batch.x, i), options.normalisation, scale);
      write(dir + "/input.png", input);
      sheets[size_t(i)].push_back({"input", {{input, class_name(options.class_names, batch.targets[size_t(i)])}}});
    }
    encode_pending();
  }

  void method(const std::string& method, const ReportBatch& batch, const Tensor& attr, const Tensor& counterfactual) {
    for (int64_t i = 0; i < shown; ++i) {
      const std::string dir = picture_dir(options.out_dir, first + i);
      const Tensor a = example(attr, i), xi = example(batch.x, i);
      const Image heat = render_heatmap(a, scale), overlay = render_overlay(xi, a, options.normalisation, scale);
      write(dir + "/" + method + ".png", heat);
      write(dir + "/" + method + "_overlay.png", overlay);
      double peak = 0;
      for (float v : channel_sum(a)) peak = std::max(peak, double(std::fabs(v)));
      SheetColumn column{method, {{heat, cat("max |a| ", number(peak))}, {overlay, ""}}};
      if (counterfactual.defined()) {
        const Image cf = render_input(example(counterfactual, i), options.normalisation, scale);
        write(dir + "/" + method + "_counterfactual.png", cf);
        column.cells.push_back({cf, "counterfactual x_K"});
      }
      sheets[size_t(i)].push_back(std::move(column));
    }
    encode_pending();
  }

  void contact_sheets() {
    for (int64_t i = 0; i < shown; ++i)
      write(picture_dir(options.out_dir, first + i) + "/sheet.png", contact_sheet(sheets[size_t(i)]));
    encode_pending();
  }
};

// attributions_<method>.safetensors: every image's map, the inputs, the targets and the
// counterfactuals of the ascent methods.
void write_attribution_files(const ReportRun& run, const std::vector<std::string>& methods,
                             std::map<std::string, Tensor>& attributions,
                             std::map<std::string, Tensor>& counterfactuals, std::vector<std::string>& files) {
  Tensor target_values = Tensor::empty({run.images});
  for (int64_t i = 0; i < run.images; ++i) target_values.data()[i] = float(run.targets[size_t(i)]);
  for (const std::string& method : methods) {
    std::map<std::string, Tensor> tensors = {
        {"attributions", attributions[method]}, {"inputs", run.x}, {"targets", target_values}};
    if (counterfactuals.count(method)) tensors["counterfactuals"] = counterfactuals[method];
    const std::string path =
        (std::filesystem::path(run.options.out_dir) / ("attributions_" + method + ".safetensors")).string();
    write_safetensors(path, tensors, {{"method", method}, {"model", run.model.config().arch}});
    files.push_back(path);
  }
}

// The table: a column per metric with its note, a row per method × metric scored.
MetricTable metric_table(const ReportRun& run, const std::vector<std::string>& methods, const MetricList& metrics,
                         CellScores& scores) {
  MetricTable table;
  table.methods = methods;
  table.context = run.options.context;
  table.context.emplace_back("images", cat(run.images));
  table.context.emplace_back("input range", cat("[", run.range().lo, ", ", run.range().hi, "]"));
  table.context.emplace_back("metric seed", cat(run.options.metric_seed));
  for (const ReportMetric* m : metrics) {
    const int64_t images = m->on_mosaics ? run.mosaic_count() : m->expensive ? run.expensive : run.images;
    table.metrics.push_back({m->info, images, m->note ? m->note(run) : "", m->on_mosaics ? "mosaics" : "images"});
    for (const std::string& method : methods) {
      const auto it = scores[method].find(m->info.name);
      if (it == scores[method].end()) continue;
      table.rows.push_back({method, m->info.name, summarize(it->second, table.confidence)});
    }
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

// ---- the record of a report's cells -------------------------------------------------------

namespace {

std::string joined(const std::vector<std::string>& items) {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

// The shortest text that reads back as the same float: 0.6, not 0.6000000238418579.
std::string float_text(float value) {
  char text[32];
  const auto [end, ec] = std::to_chars(text, text + sizeof text, value);
  return std::string(text, end);
}

std::string joined(const std::vector<float>& values) {
  std::string out;
  for (float v : values) {
    if (!out.empty()) out += ',';
    out += float_text(v);
  }
  return out;
}

std::string target_name(const ReportOptions& o) {
  switch (o.target) {
    case ReportOptions::Target::Predicted: return "predicted";
    case ReportOptions::Target::Label: return "label";
    case ReportOptions::Target::Fixed: return cat(o.target_class);
  }
  return "";
}

struct RecordEntry {
  const char* key;  // the option's name where it is one
  std::string (*value)(const ReportOptions& o, int64_t images);
};

// Every option that changes a cell's numbers or its pictures. The image count is one: the
// focus mosaics are drawn from the whole set, and the expensive set is part of it.
const RecordEntry kRecordEntries[] = {
    {"images", [](const ReportOptions&, int64_t n) { return cat(n); }},
    {"methods", [](const ReportOptions& o, int64_t) {
       return joined(o.methods.empty() ? explanation_methods() : resolve_methods(o.methods));
     }},
    {"metrics", [](const ReportOptions& o, int64_t) { return joined(resolve_metrics(o.metrics)); }},
    {"target", [](const ReportOptions& o, int64_t) { return target_name(o); }},
    {"batch", [](const ReportOptions& o, int64_t) { return cat(o.batch_size); }},
    {"perturbations", [](const ReportOptions& o, int64_t) { return cat(o.perturbations); }},
    {"expensive-count", [](const ReportOptions& o, int64_t n) { return cat(expensive_images(o, n)); }},
    {"randomisation-layers", [](const ReportOptions& o, int64_t) { return cat(o.randomisation_layers); }},
    {"seed", [](const ReportOptions& o, int64_t) { return cat(o.metric_seed, " explain ", o.explain.seed); }},
    {"tau-relu", [](const ReportOptions& o, int64_t) { return float_text(o.explain.temperatures.relu); }},
    {"tau-gelu", [](const ReportOptions& o, int64_t) { return float_text(o.explain.temperatures.gelu); }},
    {"tau-silu", [](const ReportOptions& o, int64_t) { return float_text(o.explain.temperatures.silu); }},
    {"tau-maxpool", [](const ReportOptions& o, int64_t) { return float_text(o.explain.temperatures.max_pool); }},
    {"tau-attention", [](const ReportOptions& o, int64_t) { return float_text(o.explain.temperatures.attention); }},
    {"ascent-steps", [](const ReportOptions& o, int64_t) { return cat(o.explain.ascent_steps); }},
    {"ascent-alpha", [](const ReportOptions& o, int64_t) { return float_text(o.explain.ascent_alpha); }},
    {"clip", [](const ReportOptions& o, int64_t) { return std::string(o.explain.ascent_clip ? "yes" : "no"); }},
    {"range", [](const ReportOptions& o, int64_t) {
       return cat(float_text(o.explain.range.lo), ",", float_text(o.explain.range.hi));
     }},
    {"smoothgrad-samples", [](const ReportOptions& o, int64_t) {
       return cat(o.explain.smoothgrad_samples, " sigma ", float_text(o.explain.smoothgrad_sigma));
     }},
    {"ig-steps", [](const ReportOptions& o, int64_t) { return cat(o.explain.ig_steps, " ", o.explain.ig_rule); }},
    {"baseline", [](const ReportOptions& o, int64_t) {
       return o.explain.baseline.defined() ? cat("given ", o.explain.baseline.shape()) : std::string("zeros");
     }},
    {"gradcam-block", [](const ReportOptions& o, int64_t) { return o.explain.gradcam_block; }},
    {"max-batch", [](const ReportOptions& o, int64_t) { return cat(o.explain.max_batch); }},
    {"examples", [](const ReportOptions& o, int64_t n) {
       return cat(o.picture_images < 0 ? n : std::min(o.picture_images, n));
     }},
    {"normalisation", [](const ReportOptions& o, int64_t) {
       return cat("mean ", joined(o.normalisation.mean), " std ", joined(o.normalisation.std));
     }},
    {"scale", [](const ReportOptions& o, int64_t) { return cat(o.scale); }},
};

}  // namespace

Provenance report_record(const ReportOptions& o, int64_t images) {
  Provenance record = o.cells.identity;
  for (const RecordEntry& e : kRecordEntries) record[e.key] = e.value(o, images);
  return record;
}

// ---- the report ----------------------------------------------------------------------------

namespace {

// What every batch of a report shares.
struct BatchWork {
  const ReportRun& run;
  const MetricList& metrics;
  const std::vector<std::string>& methods;
  int64_t pictures = 0, scale = 0;  // pictures of the first `pictures` images, enlarged `scale` times
  double patches = 0;               // for the cost model
};

// Told after each method of a batch, with its maps and counterfactuals (undefined but for
// the ascent methods) and the cost spent on it.
using MethodDone = std::function<void(const std::string& method, const ReportBatch& batch, const Tensor& attr,
                                      const Tensor& counterfactual, double cost)>;

// Batch [first, first + batch_size): every method's maps scored by every metric and its
// pictures drawn (their paths appended to `files`); returns the scores.
CellScores run_batch(const BatchWork& w, int64_t first, std::vector<std::string>& files, const MethodDone& done) {
  const ReportRun& run = w.run;
  const ReportBatch batch = start_batch(run, w.metrics, first);
  const BatchCounts counts{run.options, batch.size, batch.expensive, w.patches, run.randomised};
  double probes = probe_cost(w.metrics, counts);
  BatchPictures drawn{run.options, first, std::clamp<int64_t>(w.pictures - first, 0, batch.size), w.scale, files, {}};
  drawn.inputs(batch);
  CellScores scores;
  for (const std::string& method : w.methods) {
    Tensor counterfactual;
    const MethodMaps maps = explain_batch(run, batch, method, counterfactual);
    Scores& mine = scores[method];
    for (const ReportMetric* m : w.metrics)
      if (const std::optional<MetricResult> r = m->score(run, batch, maps)) append(mine, *r);
    drawn.method(method, batch, maps.attr, counterfactual);
    if (done) done(method, batch, maps.attr, counterfactual, probes + method_batch_cost(method, w.metrics, counts));
    probes = 0;
  }
  drawn.contact_sheets();
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

// A cell file read back and checked against what this report asks: its images, its record,
// its methods. Throws Error (malformed, or not the images its name says) or, through
// may_reuse, UsageError (made by another run); false when --overwrite remakes it.
bool reusable_cell(const std::string& path, const ImageCell& cell, const std::vector<ImageRange>& cells,
                   const Provenance& wanted, const std::vector<std::string>& methods, const ReportOptions& o) {
  check(std::filesystem::path(path).filename() == cell_file_name(cell.images), path, ": holds images ",
        cell.images.first, " to ", cell.images.first + cell.images.count - 1, ", not those its name says");
  if (!may_reuse("explain", path, cell.made, wanted, o.cells.overwrite, o.cells.log)) return false;
  check(std::find(cells.begin(), cells.end(), cell.images) != cells.end(), path, ": images ", cell.images.first,
        " to ", cell.images.first + cell.images.count - 1, " are not a batch of this report");
  for (const std::string& method : methods)
    check(cell.scores.count(method), path, ": no scores of ", method);
  check(cell.scores.size() == methods.size(), path, ": scores of methods this report does not run");
  return true;
}

// The cell files already in `folder` (images_*.json), each checked: one made by another run
// refuses the report, or with --overwrite is removed so that it is made again.
void check_cells_on_disk(const std::string& folder, const std::vector<ImageRange>& cells, const Provenance& wanted,
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

// The report in cells (ReportOptions::cells): the cells found on disk checked on rank 0, the
// others handed out over the ranks and written as each is finished, then on rank 0 every
// cell read back in image order into `scores` and `files`.
void run_in_cells(const BatchWork& w, CellScores& scores, std::vector<std::string>& files, const MethodDone& done) {
  const ReportOptions& o = w.run.options;
  const std::string folder = (std::filesystem::path(o.out_dir) / "cells").string();
  const std::vector<ImageRange> cells = image_cells(w.run.images, o.batch_size);
  const Provenance wanted = report_record(o, w.run.images);
  on_rank_zero([&] {
    std::filesystem::create_directories(folder);
    remove_stale_temporaries(folder);  // of a rank killed while writing a cell
    check_cells_on_disk(folder, cells, wanted, w.methods, o);
  });
  distributed::for_each_item(int64_t(cells.size()), [&](int64_t i) {
    const ImageRange& range = cells[size_t(i)];
    const std::string path = (std::filesystem::path(folder) / cell_file_name(range)).string();
    if (std::filesystem::exists(path)) {  // checked by rank 0 before any cell was handed out
      if (o.cells.log) o.cells.log(cat(cell_file_name(range), ": done before"));
      return;
    }
    std::vector<std::string> drawn;
    ImageCell cell{range, run_batch(w, range.first, drawn, done), relative_to(o.out_dir, drawn), wanted};
    write_file_atomic(path, image_cell_text(cell));
  });
  on_rank_zero([&] {
    for (const ImageRange& range : cells) {
      const std::string path = (std::filesystem::path(folder) / cell_file_name(range)).string();
      const ImageCell cell = read_image_cell_text(read_text_file(path), path);
      check(reusable_cell(path, cell, cells, wanted, w.methods, o), path, ": made by another run");
      append(scores, cell.scores);
      const std::vector<std::string> pictures = under(o.out_dir, cell.files);
      files.insert(files.end(), pictures.begin(), pictures.end());
    }
  });
}

}  // namespace

ReportResult explain_report(const Model& model, const Tensor& x_in, const std::vector<int64_t>& labels,
                            const ReportOptions& o, const ReportProgress& progress) {
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
  result.targets = run.targets;

  const int64_t pictures = o.out_dir.empty() ? 0 : o.picture_images < 0 ? N : std::min(o.picture_images, N);
  const int64_t scale = o.scale > 0 ? o.scale : default_scale(run.height, run.width);
  const BatchWork work{run, metrics, methods, pictures, scale, double(patch_count(run.height, run.width))};
  const bool keep_attributions = !o.out_dir.empty() && o.write_attributions;
  CellScores scores;  // method → metric → values
  std::map<std::string, Tensor> all_attributions, all_counterfactuals;
  if (keep_attributions)
    for (const std::string& m : methods) {
      all_attributions[m] = Tensor::empty(run.x.shape());
      if (is_ascent(m)) all_counterfactuals[m] = Tensor::empty(run.x.shape());
    }

  // Progress counts maps, and follows the cost model for the share of the work done: the
  // expensive metrics make the first batches much slower than the last.
  const int64_t total = N * int64_t(methods.size());
  int64_t done = 0;
  const double total_cost = report_cost(o, N, run.height, run.width, run.layers);
  double spent = 0;
  if (progress) progress(0, total, 0.0, "");
  const MethodDone method_done = [&](const std::string& method, const ReportBatch& batch, const Tensor& attr,
                                     const Tensor& counterfactual, double cost) {
    if (keep_attributions) {
      put_rows(all_attributions[method], attr, batch.first);
      if (counterfactual.defined()) put_rows(all_counterfactuals[method], counterfactual, batch.first);
    }
    done += batch.size;
    spent += cost;
    if (progress) progress(done, total, total_cost > 0 ? std::min(1.0, spent / total_cost) : 1.0, method);
  };
  if (o.cells.enabled) {
    run_in_cells(work, scores, result.files, method_done);
    if (distributed::rank() != 0) return result;  // rank 0 makes the table
  } else {
    for (int64_t f = 0; f < N; f += o.batch_size) append(scores, run_batch(work, f, result.files, method_done));
  }

  if (keep_attributions) write_attribution_files(run, methods, all_attributions, all_counterfactuals, result.files);
  result.table = metric_table(run, methods, metrics, scores);
  if (!o.out_dir.empty() && o.write_tables && !metrics.empty()) write_table_files(result.table, o.out_dir, result.files);
  return result;
}

}  // namespace adjoint
