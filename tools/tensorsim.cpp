// `adjoint tensorsim`: tensor similarity of bilinear checkpoints (analysis/similarity/model_similarity.h)
// with its baselines, for one pair or for every checkpoint a training run kept.
//
//   adjoint tensorsim A.ckpt B.ckpt [--metric identity|gaussian|data] [--slices] [--diff A0.ckpt] [--out DIR]
//   adjoint tensorsim --run DIR [--out DIR]
//
// Besides adjoint's own checkpoints it reads the tensor-similarity paper's bilinear-attention
// LMs (models/paper_lm.h): safetensors files in the paper's parameter names, their sizes from
// the config.json of their folder (or --config).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <tuple>

#include "analysis/similarity/model_similarity.h"
#include "analysis/similarity/tensor_similarity.h"
#include "analysis/common/plot.h"
#include "engine/distributed/ranks.h"
#include "engine/io/state_dict_file.h"
#include "engine/data/open.h"
#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/io/csv.h"
#include "engine/io/json.h"
#include "engine/io/safetensors.h"
#include "engine/io/table.h"
#include "models/checkpoint.h"
#include "models/model_source.h"
#include "models/paper_lm.h"
#include "models/training.h"
#include "tools/cli.h"
#include "tools/folder_lock.h"
#include "tools/html_report.h"
#include "tools/progress.h"

namespace adjoint {
namespace {

// One progress bar at a time, with rate and ETA, for each stage a computation reports (an exact
// route's inner products, a proposal's adaptation, tempering, sized draws): a new stage's name
// ends the last bar and starts the next.
class StageBars {
public:
  explicit StageBars(std::string label) : label_(std::move(label)) {}
  std::function<void(const std::string&, double)> listener() {
    return [this](const std::string& what, double share) {
      if (what != stage_) bar_.reset(), bar_.emplace(cat(label_, " ", what), 100, "%"), stage_ = what;
      bar_->update(int64_t(share * 100), share, "");
    };
  }
  void close() { bar_.reset(), stage_.clear(); }

private:
  std::string label_, stage_;
  std::optional<cli::ProgressBar> bar_;
};

namespace fs = std::filesystem;

// A checkpoint's model in eval mode (loading refuses non-finite weights, naming the tensor).
struct LoadedCheckpoint {
  std::string path;
  Checkpoint checkpoint;
  std::shared_ptr<Model> model;
};

// The step in a file name step_NNNNN.* (the paper's and adjoint's kept checkpoints); 0 otherwise.
int64_t step_in_name(const std::string& path) {
  const std::string stem = fs::path(path).stem().string();
  if (stem.rfind("step_", 0) != 0 || stem.size() == 5 || stem.size() > 23) return 0;
  for (size_t i = 5; i < stem.size(); ++i)
    if (stem[i] < '0' || stem[i] > '9') return 0;
  return std::stoll(stem.substr(5));
}

// An adjoint checkpoint (its metadata names its format), else one of the paper's LMs, whose
// head count comes from `config` (--config) or the config.json of the checkpoint's folder:
// a safetensors file or a state dict saved by torch.save, told apart by content
// (read_state_dict). Such a file names no data set: the data-based baselines need --data.
LoadedCheckpoint load(const std::string& path, const std::string& config = "") {
  const SafetensorsFile file = read_state_dict(path);
  if (file.metadata.count("format")) {
    LoadedCheckpoint c{path, load_checkpoint(path), nullptr};
    c.model = model_from_checkpoint(c.checkpoint);
    c.model->train(false);
    return c;
  }
  const std::string config_path = config.empty() ? paper_lm_config_for(path) : config;
  check(!config_path.empty(), path,
        ": not an adjoint checkpoint (its metadata names no format), and no config.json beside it or in the folder above "
        "to read it as the tensor-similarity paper's LM (give --config)");
  LoadedCheckpoint c{path, Checkpoint{}, paper_lm_model(file.tensors, read_paper_lm_config(config_path), path)};
  c.checkpoint.path = path, c.checkpoint.config = c.model->config(), c.checkpoint.step = step_in_name(path);
  return c;
}

TensorSimOptions options_from(const cli::Args& a) {
  TensorSimOptions o;
  o.metric = a.text("metric");
  similarity_metric(o.metric);  // an unknown name is a usage error before any file is read
  o.bias = !a.flag("no-bias");
  o.positions = a.integer("positions");
  o.input_std = a.number("input-std");
  o.recursion = a.flag("recursion");
  o.tempering = !a.flag("no-tempering");
  o.sampled = a.flag("sampled");
  o.tolerance = a.number("tolerance");
  if (a.integer("seed") < 0) throw UsageError(cat("--seed must be 0 or more, got ", a.integer("seed")));
  o.seed = uint64_t(a.integer("seed"));
  if (!(std::isfinite(o.tolerance) && o.tolerance > 0))
    throw UsageError(cat("--tolerance must be a positive finite number, got ", o.tolerance));
  if (o.positions < 0) throw UsageError(cat("--positions must be 0 or more, got ", o.positions));
  if (!(std::isfinite(o.input_std) && o.input_std > 0))
    throw UsageError(cat("--input-std must be a positive finite number, got ", o.input_std));
  // --check-mc is checked here, before any score is computed, not after the score is printed.
  constexpr int64_t kMaxMonteCarloSamples = 100'000'000;  // beyond it a pair takes hours
  const int64_t samples = a.integer("check-mc");
  if (samples != 0 && (samples < 2 || samples > kMaxMonteCarloSamples))
    throw UsageError(cat("--check-mc expects 0 (none) or 2 to ", kMaxMonteCarloSamples, " samples, got ", samples));
  if (samples != 0 && (o.metric != "gaussian" || !o.bias))
    throw UsageError("--check-mc samples the Gaussian metric with the bias coordinate (drop --metric identity and --no-bias)");
  return o;
}

// Runs `fn`, prefixing any error with the files it concerns, keeping its kind.
template <class Fn>
auto naming(const std::string& files, Fn fn) {
  try {
    return fn();
  } catch (const UsageError& e) {
    throw UsageError(cat(files, ": ", e.what()));
  } catch (const Error& e) {
    throw Error(cat(files, ": ", e.what()));
  }
}

// --data, or the data set the first checkpoint names; empty when neither says.
std::string named_data_spec(const cli::Args& a, const Checkpoint& first) {
  return a.has("data") ? a.text("data") : first.metadata.count("data.spec") ? first.metadata.at("data.spec") : "";
}

std::string data_spec(const cli::Args& a, const Checkpoint& first) {
  const std::string spec = named_data_spec(a, first);
  if (spec.empty())
    throw UsageError("tensorsim: the checkpoint names no data set for the baselines and the data metric; give --data");
  return spec;
}

// The first --count test examples of the data set the first checkpoint names (or --data).
Examples baseline_inputs(const cli::Args& a, const Checkpoint& first) {
  return load_examples(open_data(data_spec(a, first), DataSplits::TestOnly), "test", a.integer("count"));
}

// The data metric's N(μ, Σ): the mean and covariance of the baseline examples, as the model reads them.
InputDistribution data_distribution(const Examples& ex) {
  const int64_t n = ex.inputs.size(0);
  Matrix64 rows(n, ex.inputs.numel() / n);
  const std::vector<float> v = ex.inputs.contiguous().to_vector();
  std::copy(v.begin(), v.end(), rows.data.begin());
  return input_distribution(rows);
}

// A CSV value at full precision (17 significant digits: the double round-trips).
std::string full(double v) {
  if (!std::isfinite(v)) return csv_number(v);
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

Json number(double v) { return std::isfinite(v) ? Json(v) : Json(); }

// One row of tensorsim.csv: a cosine, with the raw inner product and both norms behind it
// when known, and what was compared.
std::vector<std::string> csv_row(const std::string& measure, double value, double ab, double aa, double bb, bool raw,
                                 const std::string& compared) {
  return {measure, full(value), raw ? full(ab) : "", raw ? full(std::sqrt(aa)) : "", raw ? full(std::sqrt(bb)) : "",
          compared};
}

// The score, or an error where it is undefined (a network whose outputs have zero norm): the
// closed forms refuse such pairs themselves, the recursion's quotient is checked here.
const TensorSimScore& defined(const std::string& pair, const TensorSimScore& score) {
  check(std::isfinite(score.total), pair, ": tensor similarity is undefined (", score.method, ": ⟨A|A⟩ = ", score.inner_aa,
        ", ⟨B|B⟩ = ", score.inner_bb, "; a network with zero norm)");
  return score;
}

int run_pair(const cli::Args& a) {
  const auto& files = a.positionals();
  if (files.size() != 2) throw UsageError("tensorsim: give two checkpoints (A B), or --run DIR");
  TensorSimOptions o = options_from(a);
  // Held from the start, so that a second run into the folder refuses before its work.
  const auto lock = a.has("out") ? cli::lock_output_folder(a.text("out")) : nullptr;
  const std::string config = a.has("config") ? a.text("config") : "";
  const LoadedCheckpoint ca = load(files[0], config), cb = load(files[1], config);
  std::optional<LoadedCheckpoint> reference;
  if (a.has("diff")) reference = load(a.text("diff"), config);
  const std::string pair = cat(files[0], " vs ", files[1]);
  const Model* ref = reference ? reference->model.get() : nullptr;
  TensorSimOptions probe = o;  // one bilinear layer each? (asked under a metric that needs no data)
  probe.metric = "identity", probe.input_std = 1.0;
  const bool one_layer =
      naming(pair, [&] { return prepared_layer(*ca.model, probe, ref).has_value() && prepared_layer(*cb.model, probe).has_value(); });
  // The baselines need a data set: left out, with a line saying why, where none is named.
  const bool baselines = !a.flag("no-baselines") && !named_data_spec(a, ca.checkpoint).empty();
  if (!a.flag("no-baselines") && !baselines)
    std::printf("baselines left out: %s names no data set to run them on (give --data)\n", files[0].c_str());
  // The data metric (chosen, or reported beside the others) reads the baseline examples' statistics.
  const bool wants_examples = baselines || o.metric == "data";
  std::optional<Examples> ex;
  if (wants_examples) ex = baseline_inputs(a, ca.checkpoint);
  std::optional<InputDistribution> data;
  if (ex && one_layer) data = naming(pair, [&] { return data_distribution(*ex); });
  o.data = data ? &*data : nullptr;
  if (o.metric == "data" && !one_layer)
    throw UsageError(cat(pair, ": the data metric is a closed form of one bilinear layer; these networks are deeper"));

  // A long exact route shows its progress: one bar for each inner product it computes.
  StageBars bars("tensorsim");
  o.progress = bars.listener();
  const TensorSimScore score = defined(pair, naming(pair, [&] { return tensor_similarity(*ca.model, *cb.model, o, ref); }));
  bars.close();
  const std::string compared = reference ? cat("A - ", a.text("diff"), " vs B") : "A vs B";
  std::printf("tensor similarity of %s: %s [%s: %s]\n", compared.c_str(), fixed(score.total, 4).c_str(), score.kind.c_str(),
              score.method.c_str());
  std::printf("  <A|B> = %.6g, |A| = %.6g, |B| = %.6g\n", score.inner_ab, std::sqrt(score.inner_aa),
              std::sqrt(score.inner_bb));
  Json json(Json::Object{{"a", files[0]}, {"b", files[1]}, {"method", score.kind}, {"method_detail", score.method},
                         {"tensor_similarity", number(score.total)},
                         {"inner_ab", score.inner_ab}, {"norm_a", std::sqrt(score.inner_aa)},
                         {"norm_b", std::sqrt(score.inner_bb)}});
  if (reference) json["diff_reference"] = a.text("diff");
  const std::string md_title = cat("# Tensor similarity\n\nA = `", files[0], "`, B = `", files[1], "`",
                                   reference ? cat(", compared as (A − `", a.text("diff"), "`) against B") : "", "\n\n");
  Table md{{"measure", "value", "⟨A|B⟩", "‖A‖", "‖B‖"}};
  md.align = {Align::Left, Align::Right, Align::Right, Align::Right, Align::Right};
  md.add_row({cat("tensor similarity (", score.kind, ": ", score.method, ")"), fixed(score.total, 4), cat(score.inner_ab),
              cat(std::sqrt(score.inner_aa)), cat(std::sqrt(score.inner_bb))});
  Table csv{{"measure", "value", "inner_product", "norm_a", "norm_b", "compared"}};
  csv.add_row(csv_row("tensor_similarity", score.total, score.inner_ab, score.inner_aa, score.inner_bb, true, compared));
  csv.add_row({"method", score.kind, "", "", "", ""});
  if (score.kind == "monte-carlo") {  // the estimate's standard errors (value column) and its mark
    json["standard_error"] = number(score.standard_error), json["reliable"] = score.reliable;
    csv.add_row(csv_row("standard_error", score.standard_error, 0, 0, 0, false, compared));
    csv.add_row(csv_row("inner_ab_standard_error", score.inner_ab_se, 0, 0, 0, false, compared));
    csv.add_row(csv_row("inner_aa_standard_error", score.inner_aa_se, 0, 0, 0, false, compared));
    csv.add_row(csv_row("inner_bb_standard_error", score.inner_bb_se, 0, 0, 0, false, compared));
    csv.add_row(csv_row("reliable", score.reliable ? 1 : 0, 0, 0, 0, false, compared));
  }
  std::optional<MonteCarloSimilarity> mc;
  if (a.integer("check-mc") != 0) {
    mc = naming(pair, [&] {
      return monte_carlo_check(*ca.model, *cb.model, o, a.integer("check-mc"), reference ? reference->model.get() : nullptr,
                               o.seed);
    });
    const double off = (score.total - mc->similarity) / mc->similarity_se;
    std::printf("Monte Carlo check, %lld network evaluations (%lld directions × %d radial points%s): %s ± %s (s.e.); %s %s − Monte Carlo = %.1f s.e.\n",
                static_cast<long long>(a.integer("check-mc")), static_cast<long long>(mc->samples), mc->radial_points,
                mc->importance ? ", importance-sampled" : "", fixed(mc->similarity, 6).c_str(), fixed(mc->similarity_se, 6).c_str(),
                score.kind.c_str(), fixed(score.total, 6).c_str(), off);
    // The diagnostics that decide whether the sampled estimate's interval is trusted (the route
    // would temper over directions in place of a marked one; the check reports it as drawn).
    std::printf("  tail diagnostics: Pareto shape %.3f (limit %.3f), largest draw's share of the variance %.3f, effective draws %.1f of %lld; %s\n",
                mc->pareto_shape, mc->pareto_limit, mc->tail_share, mc->effective_draws, static_cast<long long>(mc->samples),
                mc->reliable ? "unmarked" : "MARKED unreliable (its standard error may understate the error)");
    json["monte_carlo"] = Json(Json::Object{{"samples", Json(mc->samples)}, {"tensor_similarity", number(mc->similarity)},
                                            {"standard_error", number(mc->similarity_se)}, {"reliable", Json(mc->reliable)},
                                            {"pareto_shape", number(mc->pareto_shape)}, {"tail_share", number(mc->tail_share)},
                                            {"effective_draws", number(mc->effective_draws)}});
    csv.add_row({"monte_carlo_samples", cat(mc->samples), "", "", "", ""});
    csv.add_row(csv_row("monte_carlo_similarity", mc->similarity, 0, 0, 0, false, compared));
    csv.add_row(csv_row("monte_carlo_standard_error", mc->similarity_se, 0, 0, 0, false, compared));
    csv.add_row(csv_row("monte_carlo_reliable", mc->reliable ? 1 : 0, 0, 0, 0, false, compared));
    csv.add_row(csv_row("monte_carlo_pareto_shape", mc->pareto_shape, 0, 0, 0, false, compared));
    csv.add_row(csv_row("monte_carlo_tail_share", mc->tail_share, 0, 0, 0, false, compared));
    csv.add_row(csv_row("monte_carlo_effective_draws", mc->effective_draws, 0, 0, 0, false, compared));
    // Each inner product apart, with its standard error (value column: the inner product).
    for (const auto& [name, value, se] : {std::tuple{"ab", mc->inner_ab, mc->inner_ab_se}, std::tuple{"aa", mc->inner_aa, mc->inner_aa_se},
                                          std::tuple{"bb", mc->inner_bb, mc->inner_bb_se}}) {
      csv.add_row(csv_row(cat("monte_carlo_inner_", name), value, 0, 0, 0, false, compared));
      csv.add_row(csv_row(cat("monte_carlo_inner_", name, "_standard_error"), se, 0, 0, 0, false, compared));
    }
    md.add_row({cat("Monte Carlo, ", mc->samples, mc->radial_points ? cat(" directions × ", mc->radial_points, " radial points") : std::string(" samples"), " (± s.e.)"),
                cat(fixed(mc->similarity, 4), " ± ", fixed(mc->similarity_se, 4)), "", "", ""});
  }

  if (one_layer) {  // the other metrics beside the chosen one
    Json others = Json::object();
    std::string line;
    for (const SimilarityMetric& m : similarity_metrics()) {
      if (m.name == o.metric || (m.needs_data && !o.data)) continue;
      TensorSimOptions other = o;
      other.metric = m.name;
      if (std::string(m.name) != "gaussian") other.input_std = 1.0;
      const TensorSimScore s = naming(pair, [&] { return tensor_similarity(*ca.model, *cb.model, other, ref); });
      line += cat(line.empty() ? "" : ", ", m.name, " ", fixed(s.total, 4));
      others[m.name] = number(s.total);
      csv.add_row(csv_row(cat("tensor_similarity_", m.name), s.total, s.inner_ab, s.inner_aa, s.inner_bb, true, compared));
      md.add_row({cat("tensor similarity (", s.method, ")"), fixed(s.total, 4), cat(s.inner_ab), cat(std::sqrt(s.inner_aa)),
                  cat(std::sqrt(s.inner_bb))});
    }
    if (!o.data) line += cat(line.empty() ? "" : ", ", "data: not computed (--no-baselines reads no data)");
    std::printf("  other metrics: %s\n", line.c_str());
    json["other_metrics"] = others;
  }
  if (a.flag("slices")) {
    Json slices = Json::array();
    const std::vector<std::string> names = class_names_if_known(named_data_spec(a, ca.checkpoint));
    auto slice_label = [&](size_t k) { return k < names.size() ? cat("slice ", k, " (", names[k], ")") : cat("slice ", k); };
    std::printf("per-output slices:");
    for (size_t k = 0; k < score.slices.size(); ++k) {
      const double v = score.slices[k];
      std::printf(" %zu:%s", k, std::isfinite(v) ? fixed(v, 3).c_str() : "undefined (zero norm)");
      slices.push_back(number(v));
      const bool raw = k < score.slice_ab.size();
      csv.add_row(csv_row(cat("slice_", k), v, raw ? score.slice_ab[k] : 0, raw ? score.slice_aa[k] : 0,
                          raw ? score.slice_bb[k] : 0, raw, compared));
      md.add_row({slice_label(k), fixed(v, 4), raw ? cat(score.slice_ab[k]) : "", raw ? cat(std::sqrt(score.slice_aa[k])) : "",
                  raw ? cat(std::sqrt(score.slice_bb[k])) : ""});
    }
    std::printf("\n");
    json["slices"] = slices;
    if (mc) {
      Json mc_slices = Json::array(), mc_se = Json::array();
      std::printf("Monte Carlo slices (± s.e.):");
      for (size_t k = 0; k < mc->slices.size(); ++k) {
        std::printf(" %zu:%s±%s", k, fixed(mc->slices[k], 3).c_str(), fixed(mc->slice_se[k], 3).c_str());
        mc_slices.push_back(number(mc->slices[k])), mc_se.push_back(number(mc->slice_se[k]));
        csv.add_row(csv_row(cat("monte_carlo_slice_", k), mc->slices[k], 0, 0, 0, false, compared));
        csv.add_row(csv_row(cat("monte_carlo_slice_", k, "_standard_error"), mc->slice_se[k], 0, 0, 0, false, compared));
        md.add_row({cat("Monte Carlo slice ", k), cat(fixed(mc->slices[k], 4), " ± ", fixed(mc->slice_se[k], 4)), "", "", ""});
      }
      std::printf("\n");
      json["monte_carlo"]["slices"] = mc_slices;
      json["monte_carlo"]["slice_standard_errors"] = mc_se;
    }
  }
  if (baselines) {
    // The baselines read the models themselves: A and B, never the difference A − A0.
    const std::string between = "A vs B";
    if (reference) std::printf("baselines between A and B themselves (not A - %s):\n", a.text("diff").c_str());
    Json base = Json::object(), skipped = Json::object();
    for (const BaselineScore& b : naming(pair, [&] { return baseline_scores(*ca.model, *cb.model, ex->inputs); })) {
      if (!b.not_applicable.empty()) {
        std::printf("  %-20s left out: %s\n", b.name.c_str(), b.not_applicable.c_str());
        skipped[b.name] = b.not_applicable;
        md.add_row({b.name, cat("left out: ", b.not_applicable), "", "", ""});
        continue;
      }
      std::printf("  %-20s %s  (%s)\n", b.name.c_str(), fixed(b.value, 4).c_str(), b.summary.c_str());
      base[b.name] = number(b.value);
      csv.add_row(csv_row(b.name, b.value, 0, 0, 0, false, between));
      md.add_row({cat(b.name, reference ? " (A vs B)" : ""), fixed(b.value, 4), "", "", ""});
    }
    json["baselines"] = base;
    json["baselines_compare"] = between;
    if (skipped.size()) json["baselines_left_out"] = skipped;
    json["baseline_examples"] = Json(int64_t(ex->labels.size()));
  }
  if (a.has("out")) {
    const std::string out = a.text("out");
    fs::create_directories(out);
    write_file_atomic(out + "/tensorsim.csv", csv.csv());
    write_file_atomic(out + "/tensorsim.json", to_json(json, 2) + "\n");
    write_file_atomic(out + "/tensorsim.md", md_title + md.markdown());
    std::printf("wrote %s/tensorsim.{csv,json,md}\n", out.c_str());
    cli::write_html_report(out, a, cli::folder_report(out, cat("adjoint tensorsim: ", pair, ", ", score.method)));
  }
  return 0;
}

// The files a run's checkpoints/ folder may hold: adjoint's and safetensors files of the paper's
// LMs, or their state dicts as torch.save writes them.
const std::set<std::string> kCheckpointExtensions = {".safetensors", ".pt", ".pth"};

// The kept checkpoints of a run folder (adjoint train --keep-checkpoints, or the paper's
// checkpoints/step_*.pt), in step order.
std::vector<std::string> run_checkpoints(const std::string& dir) {
  const fs::path folder = fs::path(dir) / "checkpoints";
  check(fs::is_directory(folder), "tensorsim --run ", dir, ": no checkpoints folder (train with --keep-checkpoints)");
  std::vector<std::string> files;
  for (const auto& entry : fs::directory_iterator(folder))
    if (kCheckpointExtensions.count(entry.path().extension().string())) files.push_back(entry.path().string());
  // By the step in the name (step_5 before step_40, whatever the padding), then by name.
  std::sort(files.begin(), files.end(), [](const std::string& x, const std::string& y) {
    return std::pair(step_in_name(x), x) < std::pair(step_in_name(y), y);
  });
  check(files.size() >= 2, "tensorsim --run ", dir, ": ", files.size(), " checkpoint(s) in ", folder.string(),
        "; at least two are needed");
  return files;
}

// Every pair of a run's checkpoints (row-major K×K): one layer's closed forms all at once
// (each checkpoint prepared once, stacked products, threads); deeper networks pair by pair
// through the recursion, each network's own moments computed once.
// `standard_error` (K×K) holds each sampled pair's standard error, 0 where a pair is exact.
std::vector<double> run_pairwise(const std::vector<LoadedCheckpoint>& cks, const TensorSimOptions& o, std::string& method,
                                 std::vector<double>& standard_error) {
  const size_t K = cks.size();
  std::vector<std::string> names;
  std::vector<PreparedLayer> layers;
  for (const LoadedCheckpoint& c : cks) {
    names.push_back(c.path);
    std::optional<PreparedLayer> p = naming(c.path, [&] { return prepared_layer(*c.model, o); });
    if (!p) break;
    layers.push_back(std::move(*p));
  }
  std::vector<double> pairwise(K * K, 1.0);
  standard_error.assign(K * K, 0.0);
  if (layers.size() == K) {
    const std::vector<Similarity> all = pairwise_similarity(layers, names);
    for (size_t k = 0; k < K * K; ++k) pairwise[k] = all[k].total;
    const TensorSimScore form = closed_form_score(layers[0], layers[0], o);
    method = form.kind + ": " + form.method;
    return pairwise;
  }
  // The pairs (i < j), each computed on one rank (under mpirun, handed out by rank 0 to
  // whichever rank is free), then gathered: a pair's score does not depend on who computed
  // it, so every rank ends with the single process's matrix. The method named is the last
  // pair's, sent by the rank that computed it, with how many pairs' intervals are marked
  // unreliable (heavy tails).
  std::vector<std::pair<size_t, size_t>> pairs;
  for (size_t i = 0; i < K; ++i)
    for (size_t j = i + 1; j < K; ++j) pairs.push_back({i, j});
  // NaN: computed on another rank.
  std::vector<double> mine(pairs.size(), NAN), mine_se(pairs.size(), NAN), mine_unreliable(pairs.size(), NAN);
  MomentCache traces;
  distributed::for_each_item(int64_t(pairs.size()), [&](int64_t p) {
    const auto [i, j] = pairs[size_t(p)];
    TensorSimOptions own = o;
    own.seed = o.seed + uint64_t(p);  // sampled pairs draw apart: their errors are independent
    // A pair's long stages (an adaptation, tempering, sized draws) show their progress with an ETA,
    // on the first rank only, so that ranks do not draw over each other.
    StageBars bars(cat("tensorsim pair ", p + 1, "/", pairs.size()));
    if (distributed::rank() == 0) own.progress = bars.listener();
    const TensorSimScore s = naming(cat(cks[i].path, " vs ", cks[j].path), [&] {
      return tensor_similarity(*cks[i].model, *cks[j].model, own, nullptr, &traces);
    });
    bars.close();
    mine[size_t(p)] = defined(cat(cks[i].path, " vs ", cks[j].path), s).total;
    mine_se[size_t(p)] = s.standard_error;
    mine_unreliable[size_t(p)] = s.reliable ? 0.0 : 1.0;
    if (size_t(p) + 1 == pairs.size()) method = s.kind + ": " + s.method;
  });
  const size_t ranks = size_t(distributed::size());
  std::vector<double> all(ranks * pairs.size()), all_se(ranks * pairs.size()), all_unreliable(ranks * pairs.size());
  distributed::allgather(mine.data(), int64_t(pairs.size()), all.data());
  distributed::allgather(mine_se.data(), int64_t(pairs.size()), all_se.data());
  distributed::allgather(mine_unreliable.data(), int64_t(pairs.size()), all_unreliable.data());
  int last_pair_rank = 0;
  int64_t unreliable = 0;
  for (size_t p = 0; p < pairs.size(); ++p)
    for (size_t r = 0; r < ranks; ++r)
      if (!std::isnan(all[r * pairs.size() + p])) {
        const auto [i, j] = pairs[p];
        pairwise[i * K + j] = pairwise[j * K + i] = all[r * pairs.size() + p];
        standard_error[i * K + j] = standard_error[j * K + i] = all_se[r * pairs.size() + p];
        unreliable += all_unreliable[r * pairs.size() + p] > 0;
        if (p + 1 == pairs.size()) last_pair_rank = int(r);
      }
  distributed::broadcast(method, last_pair_rank);
  if (unreliable > 0)
    method += cat("; ", unreliable, " of ", pairs.size(), " pairs marked unreliable (the draws' Pareto tail shape is over ",
                  "min(1 − 1/log10 N, 0.7), or a proposal's search for the peaks had not settled (with --no-tempering), or tempered runs disagreed on the mass they found: the standard error may ",
                  "understate the error)");
  return pairwise;
}

int run_run(const cli::Args& a) {
  const std::string dir = a.text("run");
  const std::string out = a.has("out") ? a.text("out") : dir + "/tensorsim";
  TensorSimOptions o = options_from(a);
  const std::vector<std::string> files = run_checkpoints(dir);
  const auto lock = cli::lock_output_folder(out);
  const size_t K = files.size();
  std::vector<LoadedCheckpoint> cks;
  for (const std::string& f : files) cks.push_back(load(f, a.has("config") ? a.text("config") : ""));
  // Accuracy and CKA need a data set: left out, with a line saying why, where none is named.
  const bool has_data = !named_data_spec(a, cks.front().checkpoint).empty() || o.metric == "data";
  std::optional<Examples> ex;
  std::optional<DataSource> data;
  if (has_data) {
    ex = baseline_inputs(a, cks.front().checkpoint);
    data = open_data(data_spec(a, cks.front().checkpoint), DataSplits::TestOnly);
  } else {
    std::printf("test loss, accuracy and CKA left out: %s names no data set to run them on (give --data)\n",
                files.front().c_str());
  }
  std::optional<InputDistribution> moments;
  if (o.metric == "data") moments = data_distribution(*ex), o.data = &*moments;

  std::string method;
  std::vector<double> standard_error;
  const std::vector<double> pairwise = run_pairwise(cks, o, method, standard_error);
  cli::ProgressBar bar("tensorsim", int64_t(K), "checkpoint");
  std::vector<double> steps, loss, accuracy, to_last, cka_logits;
  std::vector<std::string> labels;
  for (size_t i = 0; i < K; ++i) {
    const LoadedCheckpoint& c = cks[i];
    steps.push_back(double(c.checkpoint.step));
    labels.push_back(std::to_string(c.checkpoint.step));
    to_last.push_back(pairwise[i * K + K - 1]);
    if (!has_data) {
      loss.push_back(NAN), accuracy.push_back(NAN), cka_logits.push_back(NAN);
      bar.update(int64_t(i + 1));
      continue;
    }
    const Evaluation e =
        naming(c.path, [&] { return evaluate(*c.model, data->test, data->eval_transforms(), 256, a.integer("count")); });
    loss.push_back(e.loss), accuracy.push_back(e.accuracy);
    cka_logits.push_back(naming(cat(c.path, " vs ", cks.back().path), [&] {
      return baseline_scores(*c.model, *cks.back().model, ex->inputs, {"cka_logits"}).front().value;
    }));
    bar.update(int64_t(i + 1));
  }
  bar.finish();
  if (distributed::rank() != 0) return 0;  // every rank took part in the evaluations; rank 0 writes

  fs::create_directories(out);
  Table csv{{"step", "test_loss", "test_accuracy", "tensor_similarity_to_last", "cka_logits_to_last"}};
  Table md{{"step", "test loss", "test accuracy", "tensor similarity to last", "CKA of logits to last"}};
  md.align.assign(5, Align::Right);
  Json rows = Json::array(), matrix = Json::array();
  // Without a data set, its columns are empty (CSV), "left out" (Markdown) and null (JSON).
  auto csv_cell = [&](double v) { return has_data ? full(v) : std::string(); };
  auto md_cell = [&](double v) { return has_data ? fixed(v, 4) : std::string("left out"); };
  for (size_t i = 0; i < K; ++i) {
    csv.add_row({labels[i], csv_cell(loss[i]), csv_cell(accuracy[i]), full(to_last[i]), csv_cell(cka_logits[i])});
    md.add_row({labels[i], md_cell(loss[i]), md_cell(accuracy[i]), fixed(to_last[i], 4), md_cell(cka_logits[i])});
    rows.push_back(Json(Json::Object{{"step", steps[i]}, {"test_loss", number(loss[i])}, {"test_accuracy", number(accuracy[i])},
                                     {"tensor_similarity_to_last", number(to_last[i])},
                                     {"cka_logits_to_last", number(cka_logits[i])}}));
    Json row = Json::array();
    for (size_t j = 0; j < K; ++j) row.push_back(number(pairwise[i * K + j]));
    matrix.push_back(row);
  }
  // Sampled pairs: each pair's standard error beside the matrix (0 where a pair is exact).
  const bool sampled = std::any_of(standard_error.begin(), standard_error.end(), [](double v) { return v > 0; });
  Json se_matrix = Json::array();
  Table se_csv{{"step"}};
  se_csv.header.insert(se_csv.header.end(), labels.begin(), labels.end());
  for (size_t i = 0; i < K; ++i) {
    Json row = Json::array();
    std::vector<std::string> cells = {labels[i]};
    for (size_t j = 0; j < K; ++j) row.push_back(number(standard_error[i * K + j])), cells.push_back(full(standard_error[i * K + j]));
    se_csv.add_row(cells);
    se_matrix.push_back(row);
  }
  Table pair_csv{{"step"}};
  pair_csv.header.insert(pair_csv.header.end(), labels.begin(), labels.end());
  // The matrix for a reader: the upper triangle, each sampled pair with its standard error.
  Table pair_md{{"step"}};
  pair_md.header.insert(pair_md.header.end(), labels.begin(), labels.end());
  pair_md.align.assign(K + 1, Align::Right);
  for (size_t i = 0; i < K; ++i) {
    std::vector<std::string> row = {labels[i]}, md_row = {labels[i]};
    for (size_t j = 0; j < K; ++j) {
      row.push_back(full(pairwise[i * K + j]));
      const double v = pairwise[i * K + j], se = standard_error[i * K + j];
      md_row.push_back(j < i ? "" : i == j ? "1" : se > 0 ? cat(fixed(v, 4), " ± ", fixed(se, 4)) : fixed(v, 4));
    }
    pair_csv.add_row(row);
    pair_md.add_row(md_row);
  }
  write_file_atomic(out + "/run_similarity.csv", csv.csv());
  write_file_atomic(out + "/pairwise_similarity.csv", pair_csv.csv());
  if (sampled) write_file_atomic(out + "/pairwise_similarity_se.csv", se_csv.csv());
  write_file_atomic(out + "/run_similarity.md",
                    cat("# Tensor similarity over a run\n\nRun `", dir, "`, ", K, " checkpoints, compared with the last (step ",
                        labels.back(), ") by ", method, "; accuracy on ",
                        a.integer("count") ? cat("the first ", a.integer("count")) : std::string("all"),
                        " test examples.\n\n", has_data ? "" : "No data set is named: test loss, accuracy and CKA are left out.\n\n",
                        md.markdown(), "\n## Every pair\n\n",
                        sampled ? "Sampled pairs as estimate ± standard error (95% interval: ± 1.96 of it).\n\n" : "",
                        pair_md.markdown()));
  write_file_atomic(out + "/run_similarity.json",
                    to_json(Json(Json::Object{{"run", dir}, {"method", method},
                                              {"checkpoints", rows}, {"pairwise", matrix},
                                              {"pairwise_standard_error", se_matrix}}), 2) + "\n");
  const bool log_x = steps.front() > 0 && steps.back() / steps.front() > 50;
  std::vector<PlotSeries> series = {{"tensor similarity", to_last, Rgb{200, 30, 30}}};
  if (has_data)
    series.push_back({"CKA of logits", cka_logits, Rgb{30, 90, 200}}), series.push_back({"test accuracy", accuracy, Rgb{40, 150, 60}});
  Image over_steps = line_chart("similarity to the last checkpoint", "step",
                                cat("similarity or accuracy (tensor similarity: ", method, ")"), steps, series, log_x, NAN, 1.0);
  write_png(out + "/similarity_over_steps.png", over_steps);
  const int64_t cell = std::max<int64_t>(4, 480 / int64_t(K));
  write_png(out + "/pairwise_similarity.png",
            data_scaled_heatmap("tensor similarity between checkpoints", pairwise, int64_t(K), int64_t(K), labels, "step",
                                cat("tensor similarity (", method, ")"), cell)
                .image);
  std::printf("%zu checkpoints; similarity of the first to the last %s; wrote %s/run_similarity.{csv,json,md}, "
              "pairwise_similarity.{csv,png}, similarity_over_steps.png\n",
              K, fixed(to_last.front(), 4).c_str(), out.c_str());
  cli::write_html_report(out, a, cli::folder_report(out, cat("adjoint tensorsim --run ", dir, ": ", method)));
  return 0;
}

int run_tensorsim(const cli::Args& a) { return a.has("run") ? run_run(a) : run_pair(a); }

const cli::Registration tensorsim_command({
    .name = "tensorsim",
    .summary = "tensor similarity of bilinear checkpoints, with CKA and behavioural baselines",
    .description =
        "Compares two checkpoints of bilinear models through their weights alone (docs/methods.md §3): the\n"
        "symmetrised tensors' inner product in closed form for one bilinear layer (--metric identity,\n"
        "gaussian or data; the others are reported beside the chosen one; --metric identity at any depth\n"
        "contracts the networks' whole tensors layer by layer), the exact Isserlis sum for\n"
        "deeper networks where it is tractable (a residual MLP of depth 2; attention LMs and depth-3 MLPs\n"
        "on small inputs, as polynomials), else a Monte Carlo estimate sized to --tolerance (its standard\n"
        "error), labelled monte-carlo with its interval; the second-moment recursion, an approximation\n"
        "labelled recursion-approx, only with --recursion (--check-mc N verifies any pair by Monte\n"
        "Carlo). The CSV holds each cosine at full precision with its inner product and both norms.\n"
        "Beside it, on --count test examples (never on a --diff difference):\n"
        "linear CKA (biased, debiased) of hidden features and logits, prediction agreement, output\n"
        "correlation and the cosine of the weights. --run DIR compares every checkpoint a run kept\n"
        "(adjoint train --keep-checkpoints) with the last and with each other, and plots both.",
    .arguments = "[A.ckpt B.ckpt]",
    .options = {{"metric", "NAME",
                 "identity, gaussian (inputs x ~ N(0, I)) or data (x ~ N(μ, Σ) of the --count test examples of --data)",
                 "gaussian"},
                {"no-bias", "", "compare the parts quadratic in x only (drop the constant coordinate)", ""},
                {"slices", "", "also the similarity per output (class)", ""},
                {"diff", "A0.ckpt", "compare (A − A0) against B: what changed since A0", ""},
                {"positions", "T", "sequence models: positions compared (0: the whole context)", "0"},
                {"input-std", "X",
                 "gaussian metric: inputs x ~ N(0, X²·I); token models' one-hot inputs have the norm of "
                 "X = 1/sqrt(vocab)",
                 "1"},
                {"check-mc", "N",
                 "also estimate the similarity (and slices) by the sampled estimator, given the network "
                 "evaluations of N Gaussian inputs, with standard errors",
                 "0"},
                {"recursion", "", "deep networks: the second-moment recursion (the Gaussian closure, an approximation) in place of the exact routes and sampling", ""},
                {"sampled", "", "the sampled estimate (sized to --tolerance, tempered where marked) even where an exact route applies: the estimator checked against the exact score of another run", ""},
                {"no-tempering", "", "where the sampled estimate stays marked unreliable (heavy tails, or peaks its search did not settle), report it marked rather than temper over directions (slower: replicate runs)", ""},
                {"tolerance", "SE", "where no exact route applies: sample until the cosine's standard error is at most SE", "0.005"},
                {"seed", "N", "the draws of sampled estimates and of --check-mc (runs with different seeds are independent)", "1"},
                {"run", "DIR", "compare every kept checkpoint of a training run (or a folder of the paper's LM checkpoints: config.json, checkpoints/)", ""},
                {"config", "FILE", "the tensor-similarity paper's LM checkpoints: their config.json (default: beside them or in the folder above)", ""},
                {"data", "SPEC", "data set for the baselines and accuracy (default: the checkpoint's)", ""},
                {"count", "N", "test examples for the baselines and accuracy (0: all)", "2000"},
                {"no-baselines", "", "skip the data-based baselines", ""},
                {"out", "DIR", "write the results as CSV, JSON and Markdown (and PNG with --run)", ""}},
    .run = run_tensorsim,
});

}  // namespace
}  // namespace adjoint
