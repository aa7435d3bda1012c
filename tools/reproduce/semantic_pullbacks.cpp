// The semantic-pullbacks paper (docs/methods.md §1.5): the soft pullback and pullback ascent
// explain a class with lower infidelity and max-sensitivity than the gradient, and focus on
// the right quarter of a mosaic. Per model: a ResNet-18 and a VGG-11-BN trained here (three
// quarters of their training images focus's mosaics, which focus presumes they recognise), then
// `adjoint explain` with the paper's metrics (the protocol of analysis/results/README.md).
#include <chrono>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>

#include "analysis/common/figure.h"
#include "analysis/pullbacks/protocol.h"
#include "analysis/pullbacks/randomisation.h"
#include "analysis/pullbacks/report.h"
#include "engine/data/imagenet.h"
#include "engine/error.h"
#include "engine/io/table.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "models/model_source.h"
#include "tools/progress.h"
#include "tools/reproduce/paper.h"

namespace adjoint::reproduce {
namespace {

struct ExplainedModel {
  const char* name;   // the part's prefix
  const char* label;  // for the claims and figures
  const char* model;
};
constexpr ExplainedModel kModels[] = {{"resnet18", "ResNet-18", "resnet18"}, {"vgg11_bn", "VGG-11-BN", "vgg11_bn"}};

struct Method {
  const char* name;
  const char* label;
};
constexpr Method kMethods[] = {{"soft_pullback", "soft pullback"},       {"pullback_ascent", "pullback ascent"},
                               {"gradient", "gradient"},                 {"input_x_gradient", "input × gradient"},
                               {"guided_gradcam", "guided Grad-CAM"}};

// Focus presumes models that recognise the tiles: below this share of mosaics whose top class
// is the target, a focus score measures maps of a logit the target tiles do not drive.
constexpr double kRecognitionNeeded = 0.8;

// How the models are trained and explained at a scale. Three quarters of the training images
// are focus's mosaics, labelled with the class of their two target tiles, so that the models
// recognise a mosaic's half-size tiles as the paper's ImageNet models do; random rescaling
// alone does not teach that (analysis/results/reproduce/focus_recognition.md). Focus and
// its recognition rate are scored on `--expensive-count` mosaics of held-out test images.
struct Recipe {
  Scale scale;
  std::vector<const char*> train;  // after --model, --data, --seed and --out
  // --epochs of each model in kModels' order; empty: none given. At the full scale the
  // VGG-11-BN, a fifth of a ResNet-18's cost a step, trains a third epoch: after two it
  // recognises the mosaics only on the line of kRecognitionNeeded.
  std::vector<const char*> epochs;
  double train_seconds;            // each part's share of the ETA
  std::vector<const char*> explain;
  double explain_seconds;          // likewise
};
constexpr const char* kTrainingData = "fashion-mnist+mosaics:0.75";
const Recipe& recipe(Scale scale) {
  static const Recipe recipes[] = {
      {Scale::Quick, {"--quick", "--max-steps", "300", "--eval-limit", "500"}, {}, 100.0,
       {"--count", "64", "--perturbations", "20", "--expensive-count", "64"}, 6.0},
      {Scale::Full, {"--width", "0.25", "--eval-limit", "2000"}, {"2", "3"}, 240.0,
       {"--count", "200", "--perturbations", "50", "--expensive-count", "128"}, 60.0},
  };
  for (const Recipe& r : recipes)
    if (r.scale == scale) return r;
  throw Error(cat("semantic-pullbacks: no recipe for the ", scale_name(scale), " scale"));
}

std::string method_list() {
  std::string list;
  for (const Method& m : kMethods) list += cat(list.empty() ? "" : ",", m.name);
  return list;
}

std::vector<Part> parts(Scale scale, int seeds) {
  const Recipe& r = recipe(scale);
  std::vector<Part> out;
  for (int s = 0; s < seeds; ++s)
    for (size_t i = 0; i < std::size(kModels); ++i) {
      const ExplainedModel& m = kModels[i];
      std::vector<std::string> train = {"train", "--model", m.model, "--data", kTrainingData, "--seed", cat(s),
                                        "--out", "{out}"};
      train.insert(train.end(), r.train.begin(), r.train.end());
      if (!r.epochs.empty()) train.insert(train.end(), {"--epochs", r.epochs.at(i)});
      out.push_back({cat(m.name, "_s", s), train, r.train_seconds});
      std::vector<std::string> explain = {"explain", "--checkpoint", cat("{parts}/", m.name, "_s", s, "/checkpoint.safetensors"),
                                          "--methods", method_list(), "--metrics", "infidelity,max_sensitivity,focus",
                                          "--seed", cat(s), "--examples", "2", "--out", "{out}"};
      explain.insert(explain.end(), r.explain.begin(), r.explain.end());
      out.push_back({cat("explain_", m.name, "_s", s), explain, r.explain_seconds});
    }
  return out;
}

double metric(const std::string& parts_dir, const char* model, int seed, const std::string& method,
              const std::string& name) {
  return read_csv(cat(parts_dir, "/explain_", model, "_s", seed, "/metrics.csv"))
      .number("mean", {{"method", method}, {"metric", name}});
}

// A claim about one model's explain part: `ours` says what `value` computes from its metrics.
Claim model_claim(const ExplainedModel& m, const char* text, const char* paper, std::string ours,
                  std::function<double(const std::string& dir, int seed)> value, Bound bound) {
  Claim c;
  c.text = cat(text, " (", m.label, ")");
  c.paper_figure = paper;
  c.ours = cat(m.label, ": ", ours);
  c.sources = {cat("explain_", m.name, "_s{seed}")};
  c.value = std::move(value);
  c.bound = bound;
  return c;
}

// gradient's metric / the method's: above 1, the method is better on a lower-is-better metric.
Claim lower_than_gradient(const ExplainedModel& m, const char* method, const char* metric_name, const char* text,
                          const char* paper) {
  const std::string model = m.name, meth = method, name = metric_name;
  return model_claim(m, text, paper, cat(metric_name, " of the gradient / of the ", method),
                     [model, meth, name](const std::string& dir, int seed) {
                       return metric(dir, model.c_str(), seed, "gradient", name) /
                              metric(dir, model.c_str(), seed, meth, name);
                     },
                     {Bound::AtLeast, 1.0});
}

double recognition(const std::string& parts_dir, const char* model, int seed) {
  return metric(parts_dir, model, seed, "model", "focus_recognition");
}

// focus of `method` − focus of `other`, presuming that the model recognises the tiles.
Claim focus_above(const ExplainedModel& m, const char* method, const char* other, const char* text,
                  const char* paper) {
  const std::string model = m.name, first = method, second = other;
  Claim c = model_claim(m, text, paper, cat("focus of the ", method, " − focus of the ", other),
                        [model, first, second](const std::string& dir, int seed) {
                          return metric(dir, model.c_str(), seed, first, "focus") -
                                 metric(dir, model.c_str(), seed, second, "focus");
                        },
                        {Bound::AtLeast, 0.0});
  Premise p;
  p.text = "the model recognises the mosaics' tiles";
  p.ours = "share of the focus mosaics whose top class is the target class";
  p.value = [model](const std::string& dir, int seed) { return recognition(dir, model.c_str(), seed); };
  p.bound = {Bound::AtLeast, kRecognitionNeeded};
  c.premise = p;
  return c;
}

std::vector<Claim> claims() {
  std::vector<Claim> out;
  for (const ExplainedModel& m : kModels) {
    out.push_back(lower_than_gradient(m, "soft_pullback", "infidelity", "The soft pullback is more faithful than the gradient",
                                      "infidelity 5–18× lower than the gradient's (ImageNet models)"));
    out.push_back(lower_than_gradient(m, "soft_pullback", "max_sensitivity",
                                      "The soft pullback is more stable than the gradient",
                                      "max-sensitivity several times lower than the gradient's"));
    out.push_back(lower_than_gradient(m, "pullback_ascent", "infidelity",
                                      "Pullback ascent is more faithful than the gradient",
                                      "infidelity of pullback ascent below the gradient's"));
    // Focus: the paper's order on ResNet-50, guided Grad-CAM 0.849 > soft pullback 0.748 >
    // pullback ascent 0.731 > gradient 0.634, one claim per neighbouring pair that it states.
    out.push_back(focus_above(m, "soft_pullback", "gradient",
                              "The soft pullback focuses on the explained class's tiles more than the gradient",
                              "focus 0.748 against the gradient's 0.634 (ResNet-50, 2×2 ImageNet mosaics)"));
    out.push_back(focus_above(m, "pullback_ascent", "gradient",
                              "Pullback ascent focuses on the explained class's tiles more than the gradient",
                              "focus 0.731 against the gradient's 0.634 (ResNet-50)"));
    out.push_back(focus_above(m, "guided_gradcam", "soft_pullback",
                              "Guided Grad-CAM focuses more than the soft pullback",
                              "focus 0.849 against the soft pullback's 0.748 (ResNet-50)"));
  }
  return out;
}

// The mean of `value` over the seeds whose results are there; NaN where none is.
double mean_over_seeds(int seeds, const std::function<double(int seed)>& value) {
  double sum = 0;
  int count = 0;
  for (int s = 0; s < seeds; ++s) {
    try {
      sum += value(s);
      ++count;
    } catch (const Error&) {
    }
  }
  return count ? sum / count : NAN;
}

// One heat-map per metric: methods (rows) × models (columns), mean over seeds.
std::vector<std::string> draw(const std::string& parts_dir, int seeds, const std::string& figures_dir) {
  std::vector<std::string> stems;
  struct Drawn {
    const char* name;
    const char* direction;
    bool with_recognition;  // each model's label says how many mosaics it recognises
  };
  for (const Drawn& drawn : {Drawn{"infidelity", "lower is better", false},
                             Drawn{"max_sensitivity", "lower is better", false}, Drawn{"focus", "higher is better", true}}) {
    const char* name = drawn.name;
    HeatMap map;
    map.title = cat(name, " (", drawn.direction, ") per explanation method on Fashion-MNIST, mean over ", seeds,
                    " seed", seeds > 1 ? "s" : "");
    map.x_label = "model";
    map.y_label = "method";
    map.rows = int64_t(std::size(kMethods));
    map.cols = int64_t(std::size(kModels));
    for (const Method& method : kMethods) {
      map.row_labels.push_back(method.label);
      for (const ExplainedModel& m : kModels) {
        map.values.push_back(
            mean_over_seeds(seeds, [&](int s) { return metric(parts_dir, m.name, s, method.name, name); }));
      }
    }
    for (const ExplainedModel& m : kModels) {
      map.col_labels.push_back(m.label);
      const double recognised = mean_over_seeds(seeds, [&](int s) { return recognition(parts_dir, m.name, s); });
      if (drawn.with_recognition && std::isfinite(recognised))
        map.col_labels.back() += cat(" (", int(std::lround(100 * recognised)), "% recognised)");
    }
    map.lo = 0;
    map.hi = data_range(map.values).second;
    map.range_note = "scale from 0 to the largest value";
    map.print_values = true;
    stems.push_back(cat(figures_dir, "/", name));
    Figure(map).write(stems.back());
  }
  return stems;
}

// ---- the paper's own setting: the user's ImageNet folder and pretrained weights ----------

constexpr double kNone = std::numeric_limits<double>::quiet_NaN();  // the paper gives no number

// The paper's models with the figures it publishes for each (docs/methods.md §1.5).
struct PublishedModel {
  const char* name;    // --weights NAME=FILE and --model NAME
  const char* label;
  const char* preset;  // the evaluation transform of its pretrained weights (engine/data/imagenet.h)
  double infidelity_gradient, infidelity_soft_pullback, infidelity_pullback_ascent;
  double focus_guided_gradcam, focus_soft_pullback, focus_pullback_ascent, focus_gradient;
  double random_logit_soft_pullback, random_logit_guided_gradcam;
};
constexpr PublishedModel kPublished[] = {
    {"resnet50", "ResNet-50", "resnet50_v1", 83.3, 5.99, 5.38, 0.849, 0.748, 0.731, 0.634, -0.06, 0.42},
    {"vgg11_bn", "VGG-11-BN", "vgg11_bn_v1", 100.1, kNone, 5.62, kNone, kNone, kNone, kNone, kNone, kNone},
    {"pvt_v2_b1", "PVT-v2-b1", "pvt_v2", 8.91, 6.26, 1.63, kNone, kNone, kNone, kNone, kNone, kNone},
};

const PublishedModel& published_model(const std::string& name) {
  std::string names;
  for (const PublishedModel& m : kPublished) {
    if (name == m.name) return m;
    names += cat(names.empty() ? "" : ", ", m.name);
  }
  throw UsageError(cat("option --weights: semantic-pullbacks evaluates ", names, " on ImageNet, not '", name, "'"));
}

// As §1.5 writes them (83.3, 5.99, 0.849), a negative one in brackets: "(−0.060)".
std::string figure(double value) {
  const std::string digits = fixed(std::abs(value), std::abs(value) >= 10 ? 1 : std::abs(value) >= 1 ? 2 : 3);
  return value < 0 ? cat("(−", digits, ")") : digits;
}

// The paper's value of a claim's number, a / b or a − b of two published figures, written
// beside the figures it comes from; where either is missing, that the paper gives none.
std::string published(double a, double b, bool ratio, const std::string& what, const PublishedModel& m) {
  if (std::isnan(a) || std::isnan(b)) return cat("the paper gives no number for ", m.label, " (", what, ")");
  const double value = ratio ? a / b : a - b;
  return cat(figure(value), " = ", figure(a), ratio ? " / " : " − ", figure(b), " (", what, ", ", m.label,
             ", docs/methods.md §1.5)");
}

std::string imagenet_part(const PublishedModel& m) { return cat("explain_", m.name); }

double imagenet_metric(const std::string& parts_dir, const PublishedModel& m, const std::string& method,
                       const std::string& name) {
  return read_csv(cat(parts_dir, "/", imagenet_part(m), "/metrics.csv")).number("mean", {{"method", method}, {"metric", name}});
}

// The number `first` op `second` of one metric, the claim holding on the bound's side.
Claim imagenet_claim(const PublishedModel& m, const std::string& text, const std::string& metric_name,
                     const std::string& first, const std::string& second, bool ratio, double bound,
                     const std::string& paper) {
  Claim c;
  c.text = cat(text, " (", m.label, ", ImageNet)");
  c.paper_figure = paper;
  c.ours = cat(m.label, ": ", metric_name, " of the ", first, ratio ? " / " : " − ", "of the ", second);
  c.sources = {imagenet_part(m)};
  const PublishedModel* model = &m;
  c.value = [model, metric_name, first, second, ratio](const std::string& dir, int) {
    const double a = imagenet_metric(dir, *model, first, metric_name), b = imagenet_metric(dir, *model, second, metric_name);
    return ratio ? a / b : a - b;
  };
  c.bound = {Bound::AtLeast, bound};
  return c;
}

std::vector<Claim> imagenet_claims(const PublishedModel& m) {
  std::vector<Claim> out;
  out.push_back(imagenet_claim(m, "The soft pullback is more faithful than the gradient", "infidelity", "gradient",
                               "soft_pullback", true, 1.0,
                               published(m.infidelity_gradient, m.infidelity_soft_pullback, true,
                                         "infidelity of the gradient / of the soft pullback", m)));
  out.push_back(imagenet_claim(m, "Pullback ascent is more faithful than the gradient", "infidelity", "gradient",
                               "pullback_ascent", true, 1.0,
                               published(m.infidelity_gradient, m.infidelity_pullback_ascent, true,
                                         "infidelity of the gradient / of pullback ascent", m)));
  out.push_back(imagenet_claim(m, "The soft pullback is more stable than the gradient", "max_sensitivity", "gradient",
                               "soft_pullback", true, 1.0,
                               cat("the paper gives no number (\"several times lower\", ", m.label, ")")));
  // Focus in the paper's order on ResNet-50, one claim per neighbouring pair it states,
  // judged where the model recognises the mosaics' tiles.
  struct FocusPair {
    const char* text;
    const char* first;
    const char* second;
    double paper_first, paper_second;
  };
  for (const FocusPair& f :
       {FocusPair{"The soft pullback focuses on the explained class's tiles more than the gradient", "soft_pullback",
                  "gradient", m.focus_soft_pullback, m.focus_gradient},
        FocusPair{"Pullback ascent focuses on the explained class's tiles more than the gradient", "pullback_ascent",
                  "gradient", m.focus_pullback_ascent, m.focus_gradient},
        FocusPair{"Guided Grad-CAM focuses more than the soft pullback", "guided_gradcam", "soft_pullback",
                  m.focus_guided_gradcam, m.focus_soft_pullback}}) {
    Claim c = imagenet_claim(m, f.text, "focus", f.first, f.second, false, 0.0,
                             published(f.paper_first, f.paper_second, false,
                                       cat("focus of the ", f.first, " − of the ", f.second), m));
    Premise p;
    p.text = "the model recognises the mosaics' tiles";
    p.ours = "share of the focus mosaics whose top class is the target class";
    const PublishedModel* model = &m;
    p.value = [model](const std::string& dir, int) { return imagenet_metric(dir, *model, "model", "focus_recognition"); };
    p.bound = {Bound::AtLeast, kRecognitionNeeded};
    c.premise = p;
    out.push_back(c);
  }
  out.push_back(imagenet_claim(m, "The soft pullback's maps depend on the class more than Guided Grad-CAM's",
                               "random_logit", "guided_gradcam", "soft_pullback", false, 0.0,
                               published(m.random_logit_guided_gradcam, m.random_logit_soft_pullback, false,
                                         "random logit of guided Grad-CAM − of the soft pullback", m)));
  return out;
}

// The words of `adjoint explain --evaluate` for one model on the user's folder.
std::vector<std::string> imagenet_explain(const PublishedModel& m, const std::string& weights, const ImagenetSetting& s) {
  std::vector<std::string> words = {"explain", "--evaluate", "--model", m.name, "--imagenet-stem", "--weights",
                                    weights, "--width", cat(s.width), "--classes", cat(s.classes), "--data",
                                    cat("imagenet:", s.root, ":", m.preset), "--out", "{out}"};
  if (s.count > 0) words.insert(words.end(), {"--count", cat(s.count)});
  const auto list = [](const std::vector<std::string>& names) {
    std::string out;
    for (const std::string& n : names) out += cat(out.empty() ? "" : ",", n);
    return out;
  };
  if (!s.methods.empty()) words.insert(words.end(), {"--methods", list(s.methods)});
  if (!s.metrics.empty()) words.insert(words.end(), {"--metrics", list(s.metrics)});
  return words;
}

// The ranks of the estimates over a cluster: `mpirun -n K adjoint explain --evaluate`, each
// rank with the threads of this run.
constexpr int64_t kEstimateRanks[] = {8, 64};

// What `explain --evaluate` will take for one model on `images` of 224 × 224 pixels, in
// seconds, in one process and over kEstimateRanks.
struct ModelEstimate {
  double seconds = 0;                 // one process
  std::vector<double> over_ranks;     // one per kEstimateRanks
  std::string line;                   // how it was made, for the printed estimate
};

// The estimate of one model: the report's cost in passes (its options as explain --evaluate
// sets them at 224 pixels, every method and metric unless fewer are chosen) times one pass
// of this model measured on random images, plus what does not scale with the passes: loading
// the model (measured here) and the pictures of the first 8 images. Over K ranks the cells
// (the batches, and the pieces of their randomisation: report_cells) are shared out as explain
// hands them out; the targets' forward pass over every image, loading and the pictures (on the
// rank of the first batch) are every rank's or one rank's whole, and no more ranks than cells
// are busy.
ModelEstimate estimated_seconds(const PublishedModel& m, const std::string& weights, const ImagenetSetting& s) {
  ModelConfig config;
  config.arch = m.name;
  config.small_stem = false;
  config.width = s.width;
  config.num_classes = s.classes;
  config.image_size = eval_preset(m.preset).crop;
  const auto start = std::chrono::steady_clock::now();
  const LoadedModel loaded = load_weights_model(config, weights);
  const double loading = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const int64_t side = config.image_size;
  const EvaluationProtocol protocol = evaluation_protocol(side, side);
  ReportOptions o;
  o.methods = s.methods.empty() ? explanation_methods() : resolve_methods(s.methods);
  if (s.metrics.empty())
    for (const ReportMetric& metric : report_metrics()) o.metrics.push_back(metric.info.name);
  else
    o.metrics = resolve_metrics(s.metrics);
  o.batch_size = protocol.batch;
  o.perturbations = protocol.perturbations;
  o.expensive_count = 100;  // explain --evaluate's default
  o.metric_settings = protocol.metrics;
  o.picture_images = 8;     // and its pictures
  o.out_dir = "{out}";      // explain --evaluate writes its pictures to the part's folder
  const int64_t images = s.count > 0 ? s.count : protocol.images;
  Generator gen(0);
  const Tensor x = normal({2, 3, side, side}, 0.0f, 1.0f, gen);
  o.cells.enabled = true;   // explain --evaluate runs in cells, which ranks share
  const std::vector<double> batches = report_batch_costs(o, images, side, side, int64_t(layers_top_down(*loaded.model).size()));
  const std::vector<double> cells = report_work_costs(o, images, side, side, int64_t(layers_top_down(*loaded.model).size()));
  const double unshared = report_unshared_cost(o, images);
  const double unit = seconds_per_image_pass(*loaded.model, x, 2);
  const double pictures = picture_seconds(o, images, side, side);
  ModelEstimate e;
  double passes = 0;
  for (double c : cells) passes += c;
  e.seconds = loading + pictures + unit * (passes + unshared);
  std::string ranks;
  for (int64_t K : kEstimateRanks) {
    e.over_ranks.push_back(loading + pictures + unit * (shared_cost(cells, K) + unshared));
    ranks += cat(ranks.empty() ? "" : ", ", "K = ", K, ": ", cli::format_duration(e.over_ranks.back()));
  }
  e.line = cat(m.label, ": ", cli::format_duration(e.seconds), " (", images, " images in ", batches.size(),
               " batches, ", cells.size(), " cells, ", fixed(passes + unshared, 0), " passes at ", fixed(unit * 1e3, 1), " ms, loading ",
               fixed(loading, 1), " s, pictures ", fixed(pictures, 1), " s); over K ranks ", ranks);
  return e;
}

Paper imagenet_paper(const Paper& paper, const ImagenetSetting& setting) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(fs::path(setting.root) / "val"))
    throw UsageError(cat("option --imagenet: ", setting.root, "/val is not a folder (ImageNet's layout: ROOT/val/<wnid>/*.JPEG)"));
  if (setting.weights.empty()) throw UsageError("option --weights: name at least one model, e.g. resnet50=FILE");
  Paper p = paper;
  p.title = cat(paper.title, ", on ImageNet with the user's weights");
  p.claims.clear();
  std::vector<Part> parts;
  std::vector<double> over_ranks(std::size(kEstimateRanks), 0.0);
  for (const auto& [name, file] : setting.weights) {
    const PublishedModel& m = published_model(name);
    for (const Part& earlier : parts)
      if (earlier.name == imagenet_part(m)) throw UsageError(cat("option --weights: ", name, " is given twice"));
    if (!fs::is_regular_file(file)) throw UsageError(cat("option --weights: ", name, "=", file, ": no such file"));
    const std::string weights = fs::absolute(file).lexically_normal().string();
    const ModelEstimate estimate = estimated_seconds(m, weights, setting);
    parts.push_back({imagenet_part(m), imagenet_explain(m, weights, setting), estimate.seconds});
    p.estimate_lines.push_back(estimate.line);
    for (size_t k = 0; k < over_ranks.size(); ++k) over_ranks[k] += estimate.over_ranks[k];
    for (Claim& c : imagenet_claims(m)) p.claims.push_back(std::move(c));
  }
  std::string ranks;
  for (size_t k = 0; k < over_ranks.size(); ++k)
    ranks += cat(ranks.empty() ? "" : ", ", "K = ", kEstimateRanks[k], ": ", cli::format_duration(over_ranks[k]));
  p.estimate_lines.push_back(cat("the models in turn, each explain over K ranks (mpirun -n K, ", num_threads(),
                                 " threads a rank): ", ranks));
  p.parts = [parts](Scale, int) { return parts; };
  p.draw = [](const std::string&, int, const std::string&) { return std::vector<std::string>{}; };
  p.default_seeds[0] = p.default_seeds[1] = 1;
  p.on_imagenet = nullptr;
  return p;
}

}  // namespace

Paper semantic_pullbacks_paper() {
  Paper p;
  p.name = "semantic-pullbacks";
  p.title = "Semantic pullbacks: explanations by the soft pullback and pullback ascent";
  p.claims = claims();
  p.parts = parts;
  p.draw = draw;
  p.default_seeds[0] = 2;
  p.default_seeds[1] = 2;
  p.quick_time = "6m31s measured here at commit 9d16746 for 1 seed (2 threads, the 2 cores shared with other jobs, "
                 "load 8–10: 300 training steps on mosaics, a ResNet-18 5.0 min and a VGG-11-BN 55 s, and explanations "
                 "of 64 images, 26 s and 10 s)";
  p.full_time =
      "8m36s measured here at commit 01f11fa on plain images (2 seeds, 2 threads: per seed 936 training steps, a "
      "ResNet-18 ~3.1 min and a VGG-11-BN ~48 s, and explanations of 200 images with 50 perturbations, ~16 s and "
      "~5 s); at commit 4011bcc, on mosaics and with focus on 128 of them, one seed took 38m38s on a 2-core Intel Xeon "
      "shared with other jobs (load 8–13: a ResNet-18 29 min to train and 3.3 min to explain, a VGG-11-BN 5.7 min "
      "and 26 s) and another 14m12s at load 6–9; the VGG-11-BN's third epoch since adds 100–240 s a seed; at commit "
      "63385b9 both seeds' parts took 1h22m at nice 15 beside other jobs (load 5–11), seed 0's 47 min";
  p.on_imagenet = [p](const ImagenetSetting& setting) { return imagenet_paper(p, setting); };
  return p;
}

}  // namespace adjoint::reproduce
