// `adjoint explain`: explanations of a model's decisions as pictures, raw attributions and
// a quality table (docs/methods.md §1.3–1.4). The work is in analysis/pullbacks/report.cpp; this file
// turns options into ReportOptions, finds the model and the images, and prints.
#include <malloc.h>

#include <algorithm>
#include <cstdio>
#include <future>

#include "analysis/pullbacks/protocol.h"
#include "analysis/pullbacks/randomisation.h"
#include "analysis/stitching/stitched_model.h"
#include "analysis/pullbacks/report.h"
#include "engine/data/open.h"
#include "engine/distributed/ranks.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "models/model_source.h"
#include "tools/cli.h"
#include "tools/folder_lock.h"
#include "tools/commit.h"  // generated at build time (tools/meson.build): ADJOINT_COMMIT
#include "tools/html_report.h"
#include "tools/model_options.h"
#include "tools/progress.h"

namespace adjoint {
namespace {

// Pictures are drawn for the first images only unless --examples asks for more: at 224
// pixels the pictures of one image under one method cost about as much as its gradient.
constexpr int64_t kDefaultExamples = 8;

// The metrics that run when --metrics is not given: those the metric table marks as
// default (all but the ones that re-run the explanation many times over); --evaluate runs
// all of them.
std::vector<std::string> default_metrics(bool evaluate) {
  std::vector<std::string> names;
  for (const ReportMetric& m : report_metrics())
    if (evaluate || m.by_default) names.push_back(m.info.name);
  return names;
}

std::string join(const std::vector<std::string>& items, const char* separator = ",") {
  std::string out;
  for (const std::string& s : items) out += (out.empty() ? "" : separator) + s;
  return out;
}

// The name a person types: the alias when there is one.
std::string short_name(const ReportMetric& m) { return m.alias.empty() ? m.info.name : m.alias; }

// The short names of the metrics of the table that `keep` selects.
std::vector<std::string> metric_names_where(bool (*keep)(const ReportMetric&)) {
  std::vector<std::string> names;
  for (const ReportMetric& m : report_metrics())
    if (keep(m)) names.push_back(short_name(m));
  return names;
}

bool expensive(const ReportMetric& m) { return m.expensive; }
bool not_by_default(const ReportMetric& m) { return !m.by_default; }

// "a, b and c"
std::string spoken_list(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i)
    out += (i == 0 ? "" : i + 1 == items.size() ? " and " : ", ") + items[i];
  return out;
}

// The help's list of metrics, one line each, from the metric table.
std::string metrics_help() {
  std::string out = "Metrics ((+) higher is better, (-) lower is better; [E] on the first --expensive-count images;\n"
                    "[named] only with --evaluate or when named in --metrics):";
  for (const ReportMetric& m : report_metrics())
    out += cat("\n  ", short_name(m), m.info.higher_is_better ? " (+)" : " (-)", m.expensive ? " [E]" : "",
               m.by_default ? "" : " [named]", ": ", m.help);
  return out;
}

// The range the inputs live in: --range, else [0, 1] pushed through the normalisation
// (the widest over channels), else [0, 1].
InputRange input_range(const cli::Args& a, const std::vector<float>& mean, const std::vector<float>& std) {
  if (a.has("range")) {
    const std::vector<float> r = parse_floats(a.text("range"), "range");
    if (r.size() != 2 || !(r[0] < r[1])) throw UsageError(cat("option --range expects LO,HI with LO < HI, got '", a.text("range"), "'"));
    return {r[0], r[1]};
  }
  if (mean.empty()) return {0.0f, 1.0f};
  InputRange range{1e30f, -1e30f};
  for (size_t c = 0; c < std::max(mean.size(), std.size()); ++c) {
    const float mu = mean[c % mean.size()], sd = std.empty() ? 1.0f : std[c % std.size()];
    range.lo = std::min(range.lo, (0.0f - mu) / sd);
    range.hi = std::max(range.hi, (1.0f - mu) / sd);
  }
  return range;
}

float positive(const cli::Args& a, const char* name) {
  const double v = a.number(name);
  if (!(v > 0)) throw UsageError(cat("option --", name, " expects a number > 0, got ", a.text(name)));
  return float(v);
}

int64_t at_least(const cli::Args& a, const char* name, int64_t lowest) {
  const int64_t v = a.integer(name);
  if (v < lowest) throw UsageError(cat("option --", name, " expects an integer >= ", lowest, ", got ", v));
  return v;
}

ExplainOptions explain_options(const cli::Args& a) {
  ExplainOptions o;
  o.temperatures.relu = positive(a, "tau-relu");
  o.temperatures.gelu = positive(a, "tau-gelu");
  o.temperatures.silu = positive(a, "tau-silu");
  o.temperatures.max_pool = positive(a, "tau-maxpool");
  o.temperatures.attention = positive(a, "tau-attention");
  o.ascent_steps = at_least(a, "ascent-steps", 0);
  o.ascent_alpha = a.has("ascent-alpha") ? positive(a, "ascent-alpha") : 0.0f;
  o.ascent_clip = a.flag("clip");
  o.smoothgrad_samples = at_least(a, "smoothgrad-samples", 1);
  o.ig_steps = at_least(a, "ig-steps", 1);
  o.ig_rule = a.text("ig-rule");
  if (o.ig_rule != "trapezoid" && o.ig_rule != "gauss-legendre")
    throw UsageError(cat("option --ig-rule expects trapezoid or gauss-legendre, got '", o.ig_rule, "'"));
  if (o.ig_rule == "trapezoid" && o.ig_steps < 2) throw UsageError("option --ig-steps: the trapezoid rule needs at least 2");
  o.gradcam_block = a.has("gradcam-block") ? a.text("gradcam-block") : "";
  o.seed = uint64_t(a.integer("seed"));
  return o;
}

// The images to explain, with their labels when they come from a data set.
struct Inputs {
  Tensor x;
  std::vector<int64_t> labels;
  std::string source;
  std::vector<float> mean, std;  // their normalisation
};

// The images of the data set `spec`: what neither the model nor its weights decide, so that
// they can be decoded while the model loads.
Inputs load_data_set_inputs(const cli::Args& a, const std::string& spec, bool evaluate) {
  if (a.has("preset"))  // a data set's transform is its spec's (imagenet:ROOT:PRESET), never silently another
    throw UsageError("--preset applies to image files; a data set names its own (e.g. --data imagenet:ROOT:resnet50_v2)");
  if (spec.empty())
    throw UsageError(evaluate ? "--evaluate: the model names no data set; give --data SPEC"
                              : "give images to explain: --image FILES, --input FILE.safetensors or --data SPEC");
  DataSource data = open_data(spec, a.text("split") == "train" ? DataSplits::TrainAndTest : DataSplits::TestOnly);
  check(data.images, "explain: ", spec, " is not an image data set");
  // --evaluate follows the protocol of the images' size (analysis/pullbacks/protocol.h).
  const Shape shape = transformed_shape(data.eval_transforms(), data.test->shape());
  const EvaluationProtocol protocol = evaluation_protocol(shape[1], shape[2]);
  const int64_t count = a.has("count") ? at_least(a, "count", 1) : evaluate ? protocol.images : 8;
  const std::optional<uint64_t> shuffle = evaluate ? protocol.shuffle_seed : std::nullopt;
  Examples ex = load_examples(data, a.text("split"), count, shuffle);
  Inputs in;
  in.x = ex.inputs;
  in.labels = ex.labels;
  in.mean = data.mean;
  in.std = data.std;
  in.source = cat(spec, " (", a.text("split"), ", first ", ex.labels.size(),
                  shuffle ? cat(" shuffled with seed ", *shuffle) : std::string(), ")");
  return in;
}

// The image files given on the command line and with --image.
std::vector<std::string> image_files(const cli::Args& a) {
  std::vector<std::string> files = a.positionals();
  if (a.has("image"))
    for (const std::string& f : a.list("image")) files.push_back(f);
  return files;
}

// True when the images are --data's alone: they can be decoded before the model is known.
bool images_from_data_option(const cli::Args& a) {
  return a.has("data") && image_files(a).empty() && !a.has("input");
}

// The images to explain. `decoding`, when valid, is --data's images already on their way
// (load_data_set_inputs started before the model loaded).
Inputs load_inputs(const cli::Args& a, const LoadedModel& m, bool evaluate, std::future<Inputs>& decoding) {
  const std::vector<std::string> files = image_files(a);
  const int given = int(!files.empty()) + int(a.has("input")) + int(a.has("data"));
  if (given > 1) throw UsageError("give one source of images: --image FILES, --input FILE or --data SPEC");
  Inputs in{{}, {}, "", m.mean, m.std};
  if (!files.empty()) {
    if (evaluate) throw UsageError("--evaluate runs on a data set: give --data SPEC or a checkpoint that names one");
    in.x = load_image_files(files, m);
    in.source = files.size() == 1 ? files[0] : cat(files.size(), " image files");
    return in;
  }
  if (a.has("input")) {
    if (evaluate) throw UsageError("--evaluate runs on a data set: give --data SPEC or a checkpoint that names one");
    in.x = load_input_tensor(a.text("input"), a.has("tensor") ? a.text("tensor") : "").contiguous();
    if (in.x.dim() == 3) in.x = in.x.view_as_strided({1, in.x.size(0), in.x.size(1), in.x.size(2)},
                                                     {in.x.numel(), in.x.size(1) * in.x.size(2), in.x.size(2), 1}, 0);
    check(in.x.dim() == 4, a.text("input"), ": expected images (N, C, H, W), got ", in.x.shape());
    in.source = a.text("input");
    return in;
  }
  if (decoding.valid()) return decoding.get();
  return load_data_set_inputs(a, a.has("data") ? a.text("data") : m.data_spec, evaluate);
}

void print_summary(const MetricTable& t) {
  if (t.rows.empty()) return;
  size_t first = 6;
  for (const std::string& m : t.methods) first = std::max(first, m.size());
  std::printf("\n%-*s", int(first), "method");
  std::vector<int> widths;
  bool not_computable = false;
  for (const MetricColumn& c : t.metrics) {
    const std::string head = c.info.name + (c.info.higher_is_better ? " (+)" : " (-)");
    widths.push_back(std::max<int>(10, int(head.size())));
    std::printf("  %*s", widths.back(), head.c_str());
  }
  std::printf("\n");
  for (const std::string& m : t.methods) {
    std::printf("%-*s", int(first), m.c_str());
    for (size_t i = 0; i < t.metrics.size(); ++i) {
      const MetricRow* r = t.find(m, t.metrics[i].info.name);
      if (r && r->summary.count > 0) std::printf("  %*.4g", widths[i], r->summary.mean);
      else std::printf("  %*s", widths[i], r ? "n/a" : "-");
      not_computable = not_computable || (r && r->summary.count == 0);
    }
    std::printf("\n");
  }
  std::printf("(+) higher is better, (-) lower is better; means over images, CIs in metrics.md\n");
  if (not_computable) std::printf("n/a: not computable, the metric is undefined on every image (metrics.md says why)\n");
}

// Where the report's time went (wall clock): the methods' maps are the explanation's own
// cost, the rest is what the command spends around it.
void print_times(const ReportTimes& t, int64_t images) {
  const double rest = std::max(0.0, t.total - t.methods - t.metrics - t.pictures);
  std::printf("time: %.3g s; methods %.3g s (%.4g ms/image), metrics %.3g s, pictures %.3g s, the rest %.3g s\n",
              t.total, t.methods, 1e3 * t.methods / double(images), t.metrics, t.pictures, rest);
}

// OUT/index.html: the run, the tables and the first images' contact sheets among `files`.
void write_page(const cli::Args& a, const std::string& out_dir, const std::string& title,
                const std::vector<std::string>& files) {
  cli::HtmlReport page = cli::folder_report(out_dir, title);
  for (const std::string& file : files)
    if (file.ends_with("/sheet.png") && page.figures.size() < 8) page.figures.push_back(file);
  cli::write_html_report(out_dir, a, page);
}

// What made the numbers of --evaluate's cells besides the report's options: the model
// (its files' content hashes, not their paths), the images and the commit built from.
Provenance cell_identity(const cli::Args& a, const Model& model, const Inputs& in) {
  Provenance identity{{"model", model.config().arch}, {"inputs", in.source}, {"commit", ADJOINT_COMMIT}};
  for (const char* option : {"checkpoint", "stitch", "weights"})
    if (a.has(option)) identity[option] = file_hash(a.text(option));
  return identity;
}

// A line of the report's log (a cell done before, one remade), naming the rank under mpirun.
void say(const std::string& line) {
  if (distributed::size() > 1) std::printf("%s (rank %d)\n", line.c_str(), distributed::rank());
  else std::printf("%s\n", line.c_str());
  std::fflush(stdout);
}

int run_explain(const cli::Args& a) {
  const bool evaluate = a.flag("evaluate");
  // --data's images are decoded while the model's weights are read; an error of either
  // shows where it did before (the model's first, then the options', then the images').
  std::future<Inputs> decoding;
  if (images_from_data_option(a))
    decoding = std::async(std::launch::async, [&a, evaluate] { return load_data_set_inputs(a, a.text("data"), evaluate); });
  LoadedModel m = load_model(a);
  const Model& model = *m.model;

  ReportOptions o;
  o.methods = a.has("methods") ? resolve_methods(a.list("methods")) : explanation_methods();
  if (a.has("metrics") && a.text("metrics") == "none") o.metrics = {};
  else o.metrics = resolve_metrics(a.has("metrics") ? a.list("metrics") : default_metrics(evaluate));
  // Randomisation rebuilds the model from its architecture (make_model), which a stitched
  // model does not have: refused here rather than deep inside the report.
  if (dynamic_cast<const StitchedModel*>(&model) &&
      std::find(o.metrics.begin(), o.metrics.end(), "model_parameter_randomisation") != o.metrics.end())
    throw UsageError(cat("--metrics: model_parameter_randomisation rebuilds a model from its architecture, which the "
                         "stitched model (", m.origin, ") does not have; choose other metrics"));
  o.explain = explain_options(a);
  const std::string target = a.text("target");
  if (target == "predicted") {
    o.target = ReportOptions::Target::Predicted;
  } else if (target == "label") {
    o.target = ReportOptions::Target::Label;
  } else {
    o.target = ReportOptions::Target::Fixed;
    o.target_class = at_least(a, "target", 0);
    if (o.target_class >= model.config().num_classes)
      throw UsageError(cat("option --target: class ", o.target_class, " is outside [0, ", model.config().num_classes,
                           ") of ", model.config().arch));
  }
  o.batch_size = at_least(a, "batch", 1);
  o.perturbations = at_least(a, "perturbations", 2);
  o.expensive_count = a.has("expensive-count") ? at_least(a, "expensive-count", 0) : evaluate ? 100 : 0;
  o.randomisation_layers = at_least(a, "randomisation-layers", 0);
  o.metric_seed = uint64_t(a.integer("seed"));
  o.out_dir = a.text("out");
  o.picture_images = a.has("examples") ? at_least(a, "examples", 0) : kDefaultExamples;
  o.write_attributions = !evaluate && !a.flag("no-attributions");
  if (a.flag("overwrite") && !evaluate)
    throw UsageError("--overwrite remakes the cells of --evaluate; give --evaluate");
  if (distributed::size() > 1 && !evaluate)
    throw UsageError("under mpirun, explain shares out the cells of --evaluate; without it, run one process");

  const Inputs in = load_inputs(a, m, evaluate, decoding);
  check_model_input(m, in.x, in.source);
  if (evaluate) {  // the constants of the images' size; the options given still win
    const EvaluationProtocol protocol = evaluation_protocol(in.x.size(2), in.x.size(3));
    o.metric_settings = protocol.metrics;
    if (!a.has("batch")) o.batch_size = protocol.batch;
    if (!a.has("perturbations")) o.perturbations = protocol.perturbations;
  }
  if (o.target == ReportOptions::Target::Label && in.labels.empty())
    throw UsageError("--target label needs images from a data set (--data)");
  o.normalisation = {in.mean, in.std};
  o.class_names = class_names_for(m, a.has("data") ? a.text("data") : m.data_spec);
  o.explain.range = input_range(a, in.mean, in.std);
  o.context = {{"model", model.config().arch}, {"inputs", in.source}, {"targets", target},
               {"methods", join(o.methods, ", ")}};
  if (a.has("checkpoint")) o.context.insert(o.context.begin() + 1, {"checkpoint", a.text("checkpoint")});
  // --evaluate runs in cells (OUT/cells), shared out over the ranks under mpirun and reused
  // by a rerun that asks for the same numbers.
  o.cells.enabled = evaluate;
  if (evaluate) o.cells.identity = cell_identity(a, model, in);  // hashing the files is for the cells alone
  o.cells.overwrite = a.flag("overwrite");
  o.cells.log = say;
  const bool speaks = distributed::rank() == 0;  // the other ranks of a job work quietly
  const auto lock = cli::lock_output_folder(o.out_dir);

  const int64_t N = in.x.size(0);
  const int64_t E = o.expensive_count > 0 ? std::min(o.expensive_count, N) : N;
  if (speaks)
    std::printf("adjoint explain: %s on %s: %lld images (%lld x %lld x %lld), %zu methods, %zu metrics, %d threads\n",
                model.config().arch.c_str(), in.source.c_str(), (long long)N, (long long)in.x.size(1),
                (long long)in.x.size(2), (long long)in.x.size(3), o.methods.size(), o.metrics.size(), num_threads());
  if (speaks)
    std::printf("  input range [%g, %g]; writing %s%s\n", o.explain.range.lo, o.explain.range.hi, o.out_dir.c_str(),
                distributed::size() > 1 ? cat(", over ", distributed::size(), " ranks").c_str() : "");
  std::vector<std::string> expensive_chosen;
  for (const std::string& metric : o.metrics)
    if (is_expensive_metric(metric)) expensive_chosen.push_back(short_name(*find_report_metric(metric)));
  if (speaks && !expensive_chosen.empty() && E < N)
    std::printf("  %s on the first %lld images (--expensive-count)\n", spoken_list(expensive_chosen).c_str(),
                (long long)E);
  // The batches (with --evaluate, the cells) are shared out over the ranks; the targets'
  // forward pass is every rank's.
  const std::vector<double> work =
      report_work_costs(o, N, in.x.size(2), in.x.size(3), int64_t(layers_top_down(model).size()));
  const double unshared = report_unshared_cost(o, N);
  const double passes = shared_cost(work, distributed::size()) + unshared;
  // Timing a pass runs the gradient twice on two images (a warm-up, then the timed call):
  // about 4 passes, which a run of fewer than kPassesWorthTiming passes does not spend.
  constexpr double kPassesWorthTiming = 100;
  if (speaks && passes < kPassesWorthTiming) std::printf("  estimate: %.3g image passes (a short run, not timed)\n", passes);
  if (speaks && passes >= kPassesWorthTiming) {
    const double unit = seconds_per_image_pass(model, in.x, std::min<int64_t>(o.batch_size, 2));
    const double seconds = passes * unit + picture_seconds(o, N, in.x.size(2), in.x.size(3));
    std::printf("  estimate: about %s (%.3g image passes at %.3g ms each, and the pictures)\n",
                cli::format_duration(seconds).c_str(), passes, unit * 1e3);
    if (seconds > 3600)
      std::printf("  (to shorten it: lower --count, --expensive-count, --randomisation-layers, or choose --methods)\n");
  }
  std::fflush(stdout);

  const std::string page_title = cat("adjoint explain: ", join(o.methods, ", "), " on ", model.config().arch, ", ", in.source);
  o.beside_last_files = [&](const std::vector<std::string>& files) {
    // The page, by a thread of its own, and the methods' memory handed back to the system,
    // while the report's writer writes the maps' files: released by the kernel at exit, that
    // memory would cost about as long as the files again, after them. This thread's heap
    // (its malloc arena) holds nearly all of it; the page's thread allocates from another,
    // so malloc_trim, which holds an arena's lock while it trims it, stalls neither thread.
    std::future<void> page = std::async(std::launch::async, [&] { write_page(a, o.out_dir, page_title, files); });
    malloc_trim(0);
    page.get();
  };
  ReportResult r;
  if (speaks) {
    cli::ProgressBar bar("explain", N * int64_t(o.methods.size()), "map");
    r = explain_report(model, in.x, in.labels, o, [&](int64_t done, int64_t, double work, const std::string& what) {
      bar.update(done, work, what);
    });
  } else {
    r = explain_report(model, in.x, in.labels, o);
    return 0;  // rank 0 made the tables and writes the report
  }
  print_summary(r.table);
  print_times(r.times, N);
  std::printf("wrote %zu files to %s%s\n", r.files.size(), o.out_dir.c_str(),
              o.metrics.empty() ? "" : " (metrics.md, metrics.csv, metrics.json)");
  return 0;
}

const cli::Registration explain_command({
    .name = "explain",
    .summary = "explain a model's decisions: heat-maps, attributions and a quality table",
    .description =
        "The model: --checkpoint FILE, or --model NAME --weights FILE. The images: files (--image a.png,b.png or\n"
        "as arguments), --input X.safetensors [--tensor NAME] (already normalised), or --data SPEC --count N.\n"
        "For the first --examples images (8), OUT/image_<i>/ holds the input, a heat-map and an overlay per\n"
        "method, the counterfactual of pullback_ascent and gradient_ascent, and sheet.png with every method\n"
        "side by side. Heat-maps\n"
        "sum the channels and show blue (negative), white (0), red (positive) on the scale +-max|map|.\n"
        "OUT/attributions_<method>.safetensors holds the raw maps ('attributions', 'inputs', 'targets').\n"
        "OUT/metrics.{md,csv,json}: every method x metric, mean, std and 95% CI over the images, with the\n"
        "direction of each metric; every method is scored on the same perturbations.\n"
        "--evaluate: all methods x all metrics on the first --count (1000) test images of the checkpoint's\n"
        "data set, writing the tables and the pictures of the first 8 images; prints a time estimate first.\n"
        "Its images, batches and metric constants are the protocol of the images' size: at 224 x 224 the\n"
        "published ImageNet one (1000 images shuffled with seed 314, batches of 50, infidelity patches 112\n"
        "and 56 of U(-1,1) noise, 5 each, 56-pixel patches elsewhere, random logit seed 42).\n"
        "Each batch of --evaluate is a cell, OUT/cells/images_<a>-<b>.json, written when finished: a rerun\n"
        "reuses the cells made with the same model, images and options (refusing others; --overwrite remakes\n"
        "them), and under `mpirun -n K adjoint explain --evaluate` the cells are shared out over the K\n"
        "ranks, with the same tables byte for byte. Max-sensitivity and model-parameter randomisation of a batch's\n"
        "expensive images run apart, per method, as cells of their own (images_<a>-<b>.<metric>.<method>[.steps_<i>-<j>].json;\n"
        "randomisation 8 layers a cell), so that more ranks than batches share them.\n"
        "Methods: soft_pullback, pullback, pullback_ascent, gradient_ascent, gradient, input_x_gradient,\n"
        "smoothgrad, integrated_gradients, guided_backprop, gradcam, guided_gradcam, deeplift.\n" +
        metrics_help(),
    .arguments = "[IMAGE...]",
    .options = with_model_source_options({
        {"image", "FILES", "comma-separated image files", ""},
        {"input", "FILE", "a .safetensors file holding the input batch (N, C, H, W)", ""},
        {"tensor", "NAME", "which tensor of --input", ""},
        {"data", "SPEC", "a data set (default with --evaluate: the checkpoint's)", ""},
        {"count", "N", "images of --data (default 8; 1000 with --evaluate)", ""},
        {"split", "NAME", "test or train", "test"},
        {"methods", "LIST", "explanation methods (default: all)", ""},
        {"target", "WHICH", "the class explained: predicted, label or a class index", "predicted"},
        {"out", "DIR", "where the files go", "explanations"},
        {"tau-relu", "X", "soft-pullback temperature of ReLU", "0.6"},
        {"tau-gelu", "X", "soft-pullback temperature of GELU", "1.0"},
        {"tau-silu", "X", "soft-pullback temperature of SiLU", "1.6"},
        {"tau-maxpool", "X", "soft-pullback temperature of max-pool", "0.3"},
        {"tau-attention", "X", "soft-pullback temperature of attention", "1.0"},
        {"ascent-steps", "K", "steps of pullback / gradient ascent", "5"},
        {"ascent-alpha", "A", "ascent step length (default: the published per-pixel step)", ""},
        {"clip", "", "clip the ascent to the input range", ""},
        {"smoothgrad-samples", "N", "SmoothGrad samples", "50"},
        {"ig-steps", "N", "integrated-gradients steps", "50"},
        {"ig-rule", "RULE", "trapezoid or gauss-legendre", "trapezoid"},
        {"gradcam-block", "NAME",
         "Grad-CAM block (default: the last whose output map is larger than 1×1; a ViT: the input of its last "
         "transformer block)",
         ""},
        {"seed", "N", "SmoothGrad noise and the metrics' draws", "0"},
        {"range", "LO,HI", "input range (default: [0, 1] through the normalisation)", ""},
        {"metrics", "LIST", cat("metrics, or none (default: all but ", spoken_list(metric_names_where(not_by_default)), ")"), ""},
        {"perturbations", "N", "infidelity perturbations per image, half per patch size (--evaluate at 224: 10)", "50"},
        {"expensive-count", "N", cat(join(metric_names_where(expensive), ", "), " on the first N images ",
                                     "(default: all; 100 with --evaluate)"), ""},
        {"randomisation-layers", "N", "layers re-initialised by randomisation (0: all)", "0"},
        {"batch", "N", "images per explanation call (--evaluate: its protocol's, 50 at 224 pixels)", "32"},
        {"examples", "N", cat("pictures for the first N images (default ", kDefaultExamples, ")"), ""},
        {"no-attributions", "", "do not write attributions_<method>.safetensors", ""},
        {"evaluate", "", "the full table on --count test images of a data set", ""},
        {"overwrite", "", "with --evaluate: remake the cells in OUT/cells made by another run", ""},
    }),
    .run = run_explain,
});

}  // namespace
}  // namespace adjoint
