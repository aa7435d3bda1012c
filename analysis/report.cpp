#include "analysis/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include "analysis/focus.h"
#include "analysis/randomisation.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/files.h"
#include "engine/json.h"
#include "engine/safetensors.h"

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

// The canonical names: "randomisation" is the short form of the catalogue's name.
std::string canonical_metric(const std::string& name) {
  return name == "randomisation" ? "model_parameter_randomisation" : name;
}

// Defaults of the metrics as the report runs them (analysis/metrics.h).
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
               col.info.description, ". ", col.images, col.info.name == "focus" ? " mosaics" : " images", col.note.empty() ? "" : "; " + col.note, ".\n\n");
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

// ---- names -------------------------------------------------------------------------------

std::vector<std::string> report_metric_names() {
  std::vector<std::string> names;
  for (const MetricInfo& info : metric_catalogue()) names.push_back(info.name);
  return names;
}

std::vector<std::string> resolve_metrics(const std::vector<std::string>& names) {
  const std::vector<std::string> known = report_metric_names();
  std::vector<bool> chosen(known.size(), false);
  for (const std::string& given : names) {
    const auto it = std::find(known.begin(), known.end(), canonical_metric(given));
    if (it == known.end()) {
      std::string list;
      for (const std::string& k : known) list += (list.empty() ? "" : ", ") + k;
      throw UsageError(cat("unknown metric '", given, "'; known: ", list, " (randomisation for the model-parameter ",
                           "randomisation; none for no metrics)"));
    }
    const size_t i = size_t(it - known.begin());
    if (chosen[i]) throw UsageError(cat("metric '", given, "' named twice"));
    chosen[i] = true;
  }
  std::vector<std::string> out;  // in the catalogue's order, the order of the table's columns
  for (size_t i = 0; i < known.size(); ++i)
    if (chosen[i]) out.push_back(known[i]);
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
  const std::string m = canonical_metric(metric);
  return m == "max_sensitivity" || m == "monotonicity_correlation" || m == "model_parameter_randomisation" ||
         m == "focus";
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

constexpr double kForward = 1.0 / 3.0;  // a forward pass is about a third of forward + backward

// The probes of a batch of b images (e of them in the expensive set), shared by every method.
double probe_cost(const std::vector<std::string>& metrics, const ReportOptions& o, int64_t b, int64_t e,
                  double patches) {
  double cost = 0;
  for (const std::string& m : metrics) {
    if (m == "infidelity") cost += double(b * 2 * samples_per_size(o.perturbations)) * kForward;
    if (m == "faithfulness_correlation") cost += double(b * kFaithfulnessSubsets) * kForward;
    if (m == "faithfulness_estimate") cost += double(b) * patches * kForward;
    if (m == "monotonicity_correlation") cost += double(e * kMonotonicitySamples) * patches * kForward;
  }
  return cost;
}

// One method on a batch: its maps, and the metrics that explain again (focus explains one
// mosaic per expensive image).
double method_batch_cost(const std::string& method, const std::vector<std::string>& metrics, const ReportOptions& o,
                         int64_t b, int64_t e, int64_t randomised) {
  const double one = method_cost(method, o.explain);
  double cost = double(b) * one;
  for (const std::string& m : metrics) {
    if (m == "max_sensitivity") cost += double(e * kSensitivitySamples) * one;
    if (m == "random_logit") cost += double(b) * one;
    if (m == "model_parameter_randomisation") cost += double(e * randomised) * one;
    if (m == "focus") cost += double(e) * one;
  }
  return cost;
}

int64_t randomised_layers(const ReportOptions& o, int64_t layers) {
  return o.randomisation_layers > 0 ? std::min(o.randomisation_layers, layers) : layers;
}

}  // namespace

double report_cost(const ReportOptions& o, int64_t images, int64_t height, int64_t width, int64_t layers) {
  const std::vector<std::string> methods = o.methods.empty() ? explanation_methods() : resolve_methods(o.methods);
  const std::vector<std::string> metrics = resolve_metrics(o.metrics);
  const int64_t E = o.expensive_count > 0 ? std::min(o.expensive_count, images) : images;
  const double patches = double(patch_count(height, width));
  const int64_t batch = std::max<int64_t>(1, o.batch_size), randomised = randomised_layers(o, layers);
  // Batch by batch, as explain_report spends it.
  double cost = 0;
  for (int64_t f = 0; f < images; f += batch) {
    const int64_t b = std::min(batch, images - f), e = std::clamp<int64_t>(E - f, 0, b);
    cost += probe_cost(metrics, o, b, e, patches);
    for (const std::string& m : methods) cost += method_batch_cost(m, metrics, o, b, e, randomised);
  }
  return cost;
}

// ---- the report ----------------------------------------------------------------------------

namespace {

// Per-method per-metric values over the images, in image order.
using Scores = std::map<std::string, std::vector<double>>;

void append(Scores& scores, const MetricResult& r) {
  std::vector<double>& v = scores[r.info.name];
  v.insert(v.end(), r.values.begin(), r.values.end());
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

std::string picture_dir(const std::string& out_dir, int64_t image) {
  char name[32];
  std::snprintf(name, sizeof name, "image_%04lld", static_cast<long long>(image));
  return (std::filesystem::path(out_dir) / name).string();
}

}  // namespace

ReportResult explain_report(const Model& model, const Tensor& x_in, const std::vector<int64_t>& labels,
                            const ReportOptions& o, const ReportProgress& progress) {
  check(x_in.defined() && x_in.dim() == 4 && x_in.size(0) > 0, "explain_report: expects images (N, C, H, W), got ",
        x_in.defined() ? to_string(x_in.shape()) : std::string("undefined"));
  check(!model.training(), "explain_report: the model is in training mode; call model.train(false) first");
  check(o.batch_size >= 1, "explain_report: the batch size must be at least 1, got ", o.batch_size);
  check(o.perturbations >= 1, "explain_report: at least one infidelity perturbation per image, got ", o.perturbations);
  const std::vector<std::string> methods = o.methods.empty() ? explanation_methods() : resolve_methods(o.methods);
  const std::vector<std::string> metrics = resolve_metrics(o.metrics);
  const auto wants = [&](const char* m) { return std::find(metrics.begin(), metrics.end(), m) != metrics.end(); };

  const Tensor x = x_in.contiguous();
  const int64_t N = x.size(0), H = x.size(2), W = x.size(3);
  check(labels.empty() || int64_t(labels.size()) == N, "explain_report: ", labels.size(), " labels for ", N, " images");
  const int64_t E = o.expensive_count > 0 ? std::min(o.expensive_count, N) : N;
  const int64_t pictures = o.out_dir.empty() ? 0 : o.picture_images < 0 ? N : std::min(o.picture_images, N);
  const int64_t scale = o.scale > 0 ? o.scale : default_scale(H, W);
  const bool keep_attributions = !o.out_dir.empty() && o.write_attributions;
  const InputRange range = o.explain.range;
  const Classifier classifier = [&model](const Tensor& in) {
    NoGrad off;
    return model.forward(in);
  };

  ReportResult result;
  if (!o.out_dir.empty()) std::filesystem::create_directories(o.out_dir);
  const auto wrote = [&](const std::string& path) { result.files.push_back(path); };

  // The class explained for each image, and the number of classes.
  int64_t classes = 0;
  {
    NoGrad off;
    classes = model.forward(rows(x, 0, 1)).size(1);
  }
  if (o.target == ReportOptions::Target::Label) {
    check(!labels.empty(), "explain_report: --target label needs the images' labels (a data set)");
    result.targets = labels;
  } else if (o.target == ReportOptions::Target::Fixed) {
    check(o.target_class >= 0 && o.target_class < classes, "explain_report: target class ", o.target_class,
          " is outside [0, ", classes, ")");
    result.targets.assign(size_t(N), o.target_class);
  } else {
    for (int64_t f = 0; f < N; f += o.batch_size) {
      const std::vector<int64_t> p = predicted_classes(model, rows(x, f, std::min(o.batch_size, N - f)));
      result.targets.insert(result.targets.end(), p.begin(), p.end());
    }
  }
  const std::vector<int64_t>& targets = result.targets;

  // Focus mosaics, built once from the whole set; mosaic m is scored with batch m / B.
  Mosaics mosaics;
  std::string focus_note;
  if (wants("focus")) {
    try {
      mosaics = make_mosaics(x, labels.empty() ? targets : labels, E, o.metric_seed);
      focus_note = cat(E, " mosaics of 2x2 downscaled images drawn from the ", N, " images (tile classes: ",
                       labels.empty() ? "the explained classes" : "the data's labels", ")");
    } catch (const Error& e) {
      focus_note = cat("not computed: ", e.what());
    }
  }
  const int64_t M = mosaics.images.defined() ? mosaics.images.size(0) : 0;

  InfidelityOptions infidelity_options;
  infidelity_options.seed = o.metric_seed;
  infidelity_options.samples_per_size = samples_per_size(o.perturbations);
  FaithfulnessCorrelationOptions fc_options;
  fc_options.seed = o.metric_seed;
  fc_options.subsets = kFaithfulnessSubsets;
  MonotonicityOptions mono_options;
  mono_options.seed = o.metric_seed;
  mono_options.samples = kMonotonicitySamples;
  MaxSensitivityOptions sens_options;
  sens_options.seed = o.metric_seed;
  sens_options.samples = kSensitivitySamples;
  RandomisationOptions rand_options;
  rand_options.seed = 42 + o.metric_seed;
  rand_options.max_layers = o.randomisation_layers;

  std::map<std::string, Scores> scores;  // method → metric → values
  std::map<std::string, Tensor> all_attributions, all_counterfactuals;
  if (keep_attributions)
    for (const std::string& m : methods) {
      all_attributions[m] = Tensor::empty(x.shape());
      if (is_ascent(m)) all_counterfactuals[m] = Tensor::empty(x.shape());
    }

  // Progress counts maps, and follows the cost model for the share of the work done: the
  // expensive metrics make the first batches much slower than the last.
  const int64_t total = N * int64_t(methods.size());
  int64_t done = 0;
  const double patches = double(patch_count(H, W));
  const int64_t layers = int64_t(layers_top_down(model).size());
  const int64_t randomised = randomised_layers(o, layers);
  const double total_cost = report_cost(o, N, H, W, layers);
  double spent = 0;
  if (progress) progress(0, total, 0.0, "");
  for (int64_t f = 0; f < N; f += o.batch_size) {
    const int64_t b = std::min(o.batch_size, N - f);
    const int64_t e = std::clamp<int64_t>(E - f, 0, b);  // images of this batch within the expensive set
    const int64_t mf = std::min(f, M), mb = std::clamp<int64_t>(M - f, 0, b);  // mosaics of this batch
    const Tensor xb = rows(x, f, b);
    const std::vector<int64_t> tb(targets.begin() + f, targets.begin() + f + b);
    const Tensor xe = e > 0 ? rows(x, f, e) : Tensor();
    const std::vector<int64_t> te(targets.begin() + f, targets.begin() + f + e);

    // Probes: the model's responses to this batch's perturbations, shared by every method.
    InfidelityProbe infidelity_probe;
    FaithfulnessCorrelationProbe fc_probe;
    PatchProbe fe_probe, mono_probe;
    infidelity_options.first_example = fc_options.first_example = f;
    mono_options.first_example = sens_options.first_example = f;
    if (wants("infidelity")) infidelity_probe = probe_infidelity(classifier, xb, tb, range, infidelity_options);
    if (wants("faithfulness_correlation")) fc_probe = probe_faithfulness_correlation(classifier, xb, tb, fc_options);
    if (wants("faithfulness_estimate")) fe_probe = probe_faithfulness_estimate(classifier, xb, tb);
    if (wants("monotonicity_correlation") && e > 0)
      mono_probe = probe_monotonicity(classifier, xe, te, range, mono_options);
    spent += probe_cost(metrics, o, b, e, patches);

    // Pictures of this batch's images, per method, for the contact sheets.
    const int64_t shown = std::clamp<int64_t>(pictures - f, 0, b);
    std::vector<std::vector<SheetColumn>> sheets(static_cast<size_t>(shown));
    for (int64_t i = 0; i < shown; ++i) {
      const std::string dir = picture_dir(o.out_dir, f + i);
      std::filesystem::create_directories(dir);
      const Image input = render_input(example(xb, i), o.normalisation, scale);
      write_png(dir + "/input.png", input);
      wrote(dir + "/input.png");
      sheets[size_t(i)].push_back({"input", {{input, cat("class ", tb[size_t(i)])}}});
    }

    for (const std::string& method : methods) {
      Tensor attr, counterfactual;
      if (is_ascent(method)) {
        AscentResult r = ascent(model, xb, tb, o.explain, method == "pullback_ascent");
        attr = r.attribution.contiguous();
        counterfactual = r.counterfactual.contiguous();
      } else {
        attr = explain(method, model, xb, tb, o.explain).contiguous();
      }
      check(attr.shape() == xb.shape(), "explain_report: ", method, " gave attributions ", attr.shape(),
            " for inputs ", xb.shape());
      const Explainer explainer = make_explainer(method, model, o.explain);
      const Tensor attr_e = e > 0 ? rows(attr, 0, e) : Tensor();
      Scores& s = scores[method];
      if (wants("infidelity")) append(s, infidelity(infidelity_probe, attr));
      if (wants("max_sensitivity") && e > 0) append(s, max_sensitivity(explainer, xe, te, range, sens_options, attr_e));
      if (wants("random_logit") && classes >= 2)
        append(s, random_logit(explainer, xb, tb, classes, {o.metric_seed, f}, attr));
      if (wants("faithfulness_correlation")) append(s, faithfulness_correlation(fc_probe, attr));
      if (wants("faithfulness_estimate")) append(s, faithfulness_estimate(fe_probe, attr));
      if (wants("monotonicity_correlation") && e > 0) append(s, monotonicity_correlation(mono_probe, attr_e));
      if (wants("sparseness") || wants("complexity")) {
        const Tensor pixels = sum_channels(attr);
        if (wants("sparseness")) append(s, sparseness(pixels));
        if (wants("complexity")) append(s, complexity(pixels));
      }
      if (wants("model_parameter_randomisation") && e > 0) {
        const ExplainOptions eo = o.explain;
        const ExplainerFactory factory = [method, eo](const Model& m) { return make_explainer(method, m, eo); };
        append(s, model_parameter_randomisation(model, factory, xe, te, rand_options, attr_e).mean);
      }
      if (wants("focus") && mb > 0) {
        const Mosaics part = mosaic_rows(mosaics, mf, mb);
        append(s, focus(part, explainer(part.images, part.targets)));
      }

      if (keep_attributions) {
        put_rows(all_attributions[method], attr, f);
        if (counterfactual.defined()) put_rows(all_counterfactuals[method], counterfactual, f);
      }
      for (int64_t i = 0; i < shown; ++i) {
        const std::string dir = picture_dir(o.out_dir, f + i);
        const Tensor a = example(attr, i), xi = example(xb, i);
        const Image heat = render_heatmap(a, scale), overlay = render_overlay(xi, a, o.normalisation, scale);
        write_png(dir + "/" + method + ".png", heat);
        write_png(dir + "/" + method + "_overlay.png", overlay);
        wrote(dir + "/" + method + ".png");
        wrote(dir + "/" + method + "_overlay.png");
        double peak = 0;
        for (float v : channel_sum(a)) peak = std::max(peak, double(std::fabs(v)));
        SheetColumn column{method, {{heat, cat("max |a| ", number(peak))}, {overlay, ""}}};
        if (counterfactual.defined()) {
          const Image cf = render_input(example(counterfactual, i), o.normalisation, scale);
          write_png(dir + "/" + method + "_counterfactual.png", cf);
          wrote(dir + "/" + method + "_counterfactual.png");
          column.cells.push_back({cf, "counterfactual x_K"});
        }
        sheets[size_t(i)].push_back(std::move(column));
      }
      done += b;
      spent += method_batch_cost(method, metrics, o, b, e, randomised);
      if (progress) progress(done, total, total_cost > 0 ? std::min(1.0, spent / total_cost) : 1.0, method);
    }
    for (int64_t i = 0; i < shown; ++i) {
      const std::string path = picture_dir(o.out_dir, f + i) + "/sheet.png";
      write_png(path, contact_sheet(sheets[size_t(i)]));
      wrote(path);
    }
  }

  if (keep_attributions) {
    Tensor target_values = Tensor::empty({N});
    for (int64_t i = 0; i < N; ++i) target_values.data()[i] = float(targets[size_t(i)]);
    for (const std::string& method : methods) {
      std::map<std::string, Tensor> tensors = {
          {"attributions", all_attributions[method]}, {"inputs", x}, {"targets", target_values}};
      if (all_counterfactuals.count(method)) tensors["counterfactuals"] = all_counterfactuals[method];
      const std::string path = (std::filesystem::path(o.out_dir) / ("attributions_" + method + ".safetensors")).string();
      write_safetensors(path, tensors, {{"method", method}, {"model", model.config().arch}});
      wrote(path);
    }
  }

  // The table.
  MetricTable& table = result.table;
  table.methods = methods;
  table.context = o.context;
  table.context.emplace_back("images", cat(N));
  table.context.emplace_back("input range", cat("[", range.lo, ", ", range.hi, "]"));
  table.context.emplace_back("metric seed", cat(o.metric_seed));
  const std::string expensive_note = E < N ? cat("first ", E, " of the ", N, " images") : "";
  const auto join_notes = [](std::string a, const std::string& b) {
    return a.empty() ? b : b.empty() ? a : a + "; " + b;
  };
  for (const std::string& metric : metrics) {
    MetricColumn col{metric_info(metric), is_expensive_metric(metric) ? E : N, ""};
    if (metric == "infidelity")
      col.note = cat(2 * samples_per_size(o.perturbations), " perturbations per image, the same for every method: ",
                     "uniform-noise patches of side ", std::max<int64_t>(1, H / 2), " and ", std::max<int64_t>(1, H / 4),
                     ", ", samples_per_size(o.perturbations), " each");
    if (metric == "max_sensitivity")
      col.note = join_notes(expensive_note, cat(kSensitivitySamples, " samples in an L-inf ball of radius 0.02 of the range"));
    if (metric == "random_logit" && classes < 2) col.note = "not computed: the model has one class";
    if (metric == "faithfulness_correlation")
      col.note = cat(kFaithfulnessSubsets, " random subsets of 10% of the features, set to 0");
    if (metric == "faithfulness_estimate") col.note = "8x8 grid of patches set to 0";
    if (metric == "monotonicity_correlation")
      col.note = join_notes(expensive_note, cat("8x8 grid of patches, ", kMonotonicitySamples, " noise samples each"));
    if (metric == "sparseness" || metric == "complexity") col.note = "pixel maps (summed over channels)";
    if (metric == "model_parameter_randomisation") {
      col.note = join_notes(expensive_note, cat("mean Spearman correlation of |attr| over ", randomised, " of ", layers,
                                                " layers re-initialised cumulatively from the output"));
    }
    if (metric == "focus") {
      col.images = M;
      col.note = focus_note;
    }
    table.metrics.push_back(col);
    for (const std::string& method : methods) {
      const auto it = scores[method].find(metric);
      if (it == scores[method].end()) continue;
      table.rows.push_back({method, metric, summarize(it->second, table.confidence)});
    }
  }

  if (!o.out_dir.empty() && o.write_tables && !metrics.empty()) {
    const std::filesystem::path dir(o.out_dir);
    write_file_atomic((dir / "metrics.csv").string(), table_csv(table));
    write_file_atomic((dir / "metrics.json").string(), table_json(table));
    write_file_atomic((dir / "metrics.md").string(), table_markdown(table));
    wrote((dir / "metrics.csv").string());
    wrote((dir / "metrics.json").string());
    wrote((dir / "metrics.md").string());
  }
  return result;
}

}  // namespace adjoint
