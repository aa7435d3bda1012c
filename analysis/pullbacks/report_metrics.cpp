#include "analysis/pullbacks/report_run.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "engine/error.h"

namespace adjoint {

// The model's top class of every row of x, `batch` rows at a time.
std::vector<int64_t> predicted_in_batches(const Model& model, const Tensor& x, int64_t batch) {
  std::vector<int64_t> predicted;
  for (int64_t f = 0; f < x.size(0); f += batch) {
    const std::vector<int64_t> p = predicted_classes(model, rows(x, f, std::min(batch, x.size(0) - f)));
    predicted.insert(predicted.end(), p.begin(), p.end());
  }
  return predicted;
}

// ---- the metrics' steps ------------------------------------------------------------------

namespace {

// (N, C, H, W) → (N, 1, H, W): the signed evidence per pixel.
Tensor sum_channels(const Tensor& attr) {
  const int64_t N = attr.size(0), C = attr.size(1), HW = attr.size(2) * attr.size(3);
  Tensor out = Tensor::zeros({N, 1, attr.size(2), attr.size(3)});
  for (int64_t n = 0; n < N; ++n)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t i = 0; i < HW; ++i) out.data()[n * HW + i] += attr.data()[(n * C + c) * HW + i];
  return out;
}

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
  std::string sides;
  for (int64_t side : run.infidelity.patch_sizes) sides += cat(sides.empty() ? "" : " and ", side);
  const std::optional<InputRange>& noise = run.infidelity.noise;
  return cat(run.infidelity.patch_sizes.size() * size_t(each), " perturbations per image, the same for every method: ",
             noise ? cat("U(", noise->lo, ", ", noise->hi, ")") : std::string("uniform"), "-noise patches of side ",
             sides, ", ", each, " each");
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
                    cat(run.max_sensitivity.samples, " samples in an L-inf ball of radius ",
                        run.options.metric_settings.sensitivity_radius,
                        run.options.metric_settings.sensitivity_radius_absolute ? " in input units" : " of the range"));
}

// -- random logit: explains every image again for another class
std::optional<MetricResult> score_random_logit(const ReportRun& run, const ReportBatch& batch, const MethodMaps& maps) {
  if (run.classes < 2) return std::nullopt;
  return random_logit(maps.explainer, batch.x, batch.targets, run.classes, {run.random_logit_seed, batch.first},
                      maps.attr);
}
std::string random_logit_note(const ReportRun& run) {
  return run.classes < 2 ? "not computed: the model has one class"
                         : cat("the other class drawn from the model's ", run.classes, " with seed ", run.random_logit_seed);
}

// -- faithfulness correlation: probed on random feature subsets (or patches) set to the baseline
void probe_faithfulness_correlation_step(const ReportRun& run, ReportBatch& batch) {
  batch.faithfulness_correlation = probe_faithfulness_correlation(
      run.classifier, batch.x, batch.targets, from_example(run.faithfulness_correlation, batch.first));
}
std::optional<MetricResult> score_faithfulness_correlation(const ReportRun&, const ReportBatch& batch,
                                                           const MethodMaps& maps) {
  return faithfulness_correlation(batch.faithfulness_correlation, maps.attr);
}
std::string faithfulness_correlation_note(const ReportRun& run) {
  const FaithfulnessCorrelationOptions& o = run.faithfulness_correlation;
  return o.patch_size > 0 ? cat(o.subsets, " random square patches of side ", o.patch_size, ", set to ", o.baseline)
                          : cat(o.subsets, " random subsets of 10% of the features, set to ", o.baseline);
}

// -- faithfulness estimate: probed on the patches of a grid set to the baseline
void probe_faithfulness_estimate_step(const ReportRun& run, ReportBatch& batch) {
  batch.faithfulness_estimate = probe_faithfulness_estimate(run.classifier, batch.x, batch.targets, run.faithfulness_estimate);
}
std::optional<MetricResult> score_faithfulness_estimate(const ReportRun&, const ReportBatch& batch,
                                                        const MethodMaps& maps) {
  return faithfulness_estimate(batch.faithfulness_estimate, maps.attr);
}
// The patch metrics' grid, e.g. "4x4 grid of 56-pixel patches (3136 pixels a step)".
std::string grid_text(const ReportRun& run, int64_t side) {
  return cat((run.height + side - 1) / side, "x", (run.width + side - 1) / side, " grid of ", side, "-pixel patches (",
             side * side, " pixels a step)");
}
std::string faithfulness_estimate_note(const ReportRun& run) {
  return cat(grid_text(run, run.faithfulness_estimate.patch_size), " set to ", run.faithfulness_estimate.baseline);
}

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
  return join_notes(run.expensive_note(),
                    cat(grid_text(run, run.monotonicity.patch_size), ", ", run.monotonicity.samples, " noise samples each"));
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
}  // namespace

RandomisationResult randomisation_of(const ReportRun& run, const ReportBatch& batch, const MethodMaps& maps,
                                     const RandomisationOptions& options) {
  const ExplainerFactory factory = [method = maps.method, eo = run.options.explain](const Model& m) {
    return make_explainer(method, m, eo);
  };
  return model_parameter_randomisation(run.model, factory, batch.x_expensive, batch.targets_expensive, options,
                                       maps.attr_expensive);
}

namespace {
std::optional<MetricResult> score_randomisation(const ReportRun& run, const ReportBatch& batch, const MethodMaps& maps) {
  if (batch.expensive == 0) return std::nullopt;
  return randomisation_of(run, batch, maps, run.randomisation).mean;
}
std::string randomisation_note(const ReportRun& run) {
  return join_notes(run.expensive_note(), cat("mean Spearman correlation of |attr| over ", run.randomised, " of ",
                                              run.layers, " layers re-initialised cumulatively from the output"));
}


// -- focus: E mosaics drawn from the whole set; mosaic m is explained with batch m / B
void prepare_focus(ReportRun& run) {
  try {
    run.mosaics = make_mosaics(run.x, run.labels.empty() ? run.targets : run.labels, run.expensive,
                               run.options.metric_seed);
    // How often the model itself names the target class of a mosaic. Where it rarely does,
    // its logit for that class does not come from the target tiles, and a focus near 0.5 for
    // every method says the mosaics are not recognised, not that the methods fail to localise.
    run.recognised = recognised_mosaics(
        run.mosaics, predicted_in_batches(run.model, run.mosaics.images, run.options.batch_size));
    double recognised = 0;
    for (double r : run.recognised) recognised += r;
    run.focus_note = cat(run.expensive, " mosaics of 2x2 downscaled images drawn from the ", run.images,
                         " images (tile classes: ", run.labels.empty() ? "the explained classes" : "the data's labels",
                         "); the model's top class is the mosaic's target class on ",
                         std::round(1000.0 * recognised / double(std::max<int64_t>(run.mosaic_count(), 1))) / 10.0,
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
std::optional<ModelFigure> focus_recognition(const ReportRun& run, double confidence) {
  if (run.recognised.empty()) return std::nullopt;
  const MetricInfo info{"focus_recognition", true,
                        "share of the focus mosaics on which the model's top class is the target class"};
  return ModelFigure{{info, run.mosaic_count(), "", "mosaics"}, summarize(run.recognised, confidence)};
}

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
         const int64_t sizes = patch_sizes(c.options.metric_settings);
         return double(c.images * sizes * samples_per_size(c.options.perturbations, sizes)) * kForward;
       },
       .note = infidelity_note},
      {.info = metric_info("max_sensitivity"),
       .expensive = true,
       .by_default = true,
       .help = "how much the map changes under small input noise",
       .score = score_max_sensitivity,
       .explanations = [](const BatchCounts& c) {
         return double(c.expensive * c.options.metric_settings.sensitivity_samples);
       },
       .note = max_sensitivity_note,
       .pieces = ReportMetric::Pieces::Whole},
      {.info = metric_info("random_logit"),
       .by_default = true,
       .reads_classes = true,
       .help = "how alike the maps of the target and of a random other class are",
       .score = score_random_logit,
       .explanations = [](const BatchCounts& c) { return double(c.images); },
       .note = random_logit_note},
      {.info = metric_info("faithfulness_correlation"),
       .by_default = true,
       .help = "how the attribution of random feature subsets follows the logit drop when they are removed",
       .probe = probe_faithfulness_correlation_step,
       .score = score_faithfulness_correlation,
       .probe_passes = [](const BatchCounts& c) {
         return double(c.images * c.options.metric_settings.faithfulness_subsets) * kForward;
       },
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
         return double(c.expensive * c.options.metric_settings.monotonicity_samples) * c.patches * kForward;
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
       .note = randomisation_note,
       .pieces = ReportMetric::Pieces::ByStep},
      {.info = metric_info("focus"),
       .expensive = true,
       .on_mosaics = true,
       .help = "the share of the positive attribution on the target-class tiles of 2x2 mosaics",
       .prepare = prepare_focus,
       .score = score_focus,
       .explanations = [](const BatchCounts& c) { return double(c.expensive); },  // one mosaic per expensive image
       .note = focus_note,
       .model_figure = focus_recognition},
  };
  return table;
}

const ReportMetric* find_report_metric(const std::string& name) {
  for (const ReportMetric& m : report_metrics())
    if (m.info.name == name || (!m.alias.empty() && m.alias == name)) return &m;
  return nullptr;
}

// ---- names -------------------------------------------------------------------------------

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

}  // namespace adjoint
