// adjoint bench explain: what an explanation costs, per image, beside the plain gradient of
// the same model on the same batch. The soft pullback changes only the backward rules of
// the gates, so it should cost about one gradient (acceptance: ≤ 1.2×); pullback ascent
// is K soft pullbacks plus K small vector updates (K = 5: ≤ 6×). SmoothGrad and integrated
// gradients are n gradients each and serve as the expensive reference.
//
// Models: ResNet-18 (small stem), VGG-11-BN (small classifier) and ViT-Tiny (patch 4) on
// 32×32×3 inputs with untrained weights (the cost does not depend on the weights), or the
// model of --checkpoint on inputs of its size.
#include "tools/bench_explain.h"
#include "tools/timing.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include "analysis/pullbacks/explain.h"
#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/io/json.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "models/checkpoint.h"

namespace adjoint {

namespace {


struct Timed {
  std::string model, method;
  double ms_per_image = 0, ratio = 0;  // ratio: to the gradient of the same model
};

// The methods timed, with the settings in their names.
// SmoothGrad and IG average 50 passes in one run already, and the model is warm by
// then: they get fewer runs and no warm-up, which keeps the whole bench short.
struct BenchMethod {
  std::string label, method;
  bool many_passes = false;
};
std::vector<BenchMethod> bench_methods(int64_t samples) {
  return {
      {"gradient", "gradient"},
      {"soft_pullback", "soft_pullback"},
      {"pullback_ascent(K=5)", "pullback_ascent"},
      {cat("smoothgrad(", samples, ")"), "smoothgrad", true},
      {cat("integrated_gradients(", samples, ")"), "integrated_gradients", true},
  };
}

void bench_model(const std::string& name, const Model& model, int64_t batch, int64_t repeats, int64_t samples,
                 int64_t max_batch, cli::BenchClock clock, std::vector<Timed>& rows) {
  const ModelConfig& c = model.config();
  Generator gen(5);
  const Tensor x = uniform({batch, c.in_channels, c.image_size, c.image_size}, -1.0f, 1.0f, gen);
  const std::vector<int64_t> targets = predicted_classes(model, x);
  ExplainOptions o;
  o.ascent_steps = 5;
  o.smoothgrad_samples = samples;
  o.ig_steps = samples;
  if (max_batch > 0) o.max_batch = max_batch;
  double gradient_ms = 0;
  for (const BenchMethod& m : bench_methods(samples)) {
    const auto run = [&] { explain(m.method, model, x, targets, o); };
    const double seconds =
        m.many_passes ? cli::median_seconds(std::min<int64_t>(repeats, 2), run, {clock, 0, 0.0})
                      : cli::median_seconds(repeats, run, {clock});
    Timed t{name, m.label, seconds * 1e3 / double(batch), 0};
    if (m.method == "gradient") gradient_ms = t.ms_per_image;
    t.ratio = t.ms_per_image / gradient_ms;
    std::printf("%-12s %-26s %12.3f %10.2f\n", name.c_str(), m.label.c_str(), t.ms_per_image, t.ratio);
    std::fflush(stdout);
    rows.push_back(t);
  }
}

// JSON when the name ends in .json, CSV otherwise.
void write_results(const std::string& path, const std::vector<Timed>& rows, int64_t batch, int64_t repeats) {
  const bool json = path.size() >= 5 && path.substr(path.size() - 5) == ".json";
  std::string text;
  if (json) {
    Json root = Json::object();
    root["threads"] = num_threads();
    root["batch"] = batch;
    root["repeats"] = repeats;
    root["results"] = Json::array();
    for (const Timed& t : rows)
      root["results"].push_back(Json(Json::Object{
          {"model", t.model}, {"method", t.method}, {"ms_per_image", t.ms_per_image}, {"ratio_to_gradient", t.ratio}}));
    text = to_json(root, 2) + "\n";
  } else {
    text = "model,method,threads,batch,ms_per_image,ratio_to_gradient\n";
    for (const Timed& t : rows)
      text += cat(t.model, ",", t.method, ",", num_threads(), ",", batch, ",", t.ms_per_image, ",", t.ratio, "\n");
  }
  write_file_atomic(path, text);
  std::printf("wrote %s\n", path.c_str());
}

// Acceptance of one model's soft pullback and pullback ascent against its gradient.
bool accepted(const std::vector<Timed>& rows, const std::string& model) {
  bool ok = true;
  for (const Timed& t : rows) {
    if (t.model != model) continue;
    if (t.method == "soft_pullback" && t.ratio > 1.2) ok = false;
    if (t.method == "pullback_ascent(K=5)" && t.ratio > 6.0) ok = false;
  }
  return ok;
}

}  // namespace

int run_bench_explain(const cli::Args& args) {
  if (args.positionals().size() > 1) throw UsageError("bench explain takes no further arguments");
  const bool quick = args.flag("quick");
  const int64_t batch = args.has("batch") ? args.integer("batch") : 16;
  const int64_t repeats = args.has("repeats") ? args.integer("repeats") : quick ? 2 : 5;
  if (batch < 1) throw UsageError(cat("option --batch expects a count >= 1, got ", batch));
  if (repeats < 1) throw UsageError(cat("option --repeats expects a count >= 1, got ", repeats));
  const int64_t samples = args.has("samples") ? args.integer("samples") : 50;
  if (samples < 2) throw UsageError(cat("option --samples expects a count >= 2, got ", samples));
  const int64_t max_batch = args.has("max-batch") ? args.integer("max-batch") : 0;
  if (args.has("max-batch") && max_batch < 1)
    throw UsageError(cat("option --max-batch expects a count >= 1, got ", max_batch));
  const int64_t size = args.has("size") ? args.integer("size") : 32;
  if (size < 8) throw UsageError(cat("option --size expects a side of at least 8 pixels, got ", size));
  const cli::BenchClock clock = cli::bench_clock(args.text("clock"), num_threads());

  // The models: the reference architectures --only names (all three without --only and
  // without --checkpoint), then the checkpoint's model.
  std::vector<std::pair<std::string, std::shared_ptr<Model>>> models;
  const std::vector<std::string> known = {"resnet18", "vgg11_bn", "vit_tiny"};
  const std::vector<std::string> chosen =
      args.has("only") ? args.list("only") : args.has("checkpoint") ? std::vector<std::string>{} : known;
  for (const std::string& arch : chosen) {
    if (std::find(known.begin(), known.end(), arch) == known.end())
      throw UsageError(cat("bench explain: --only expects models among resnet18, vgg11_bn, vit_tiny; got '", arch, "'"));
    ModelConfig c;
    c.arch = arch;
    c.num_classes = 10;
    c.in_channels = 3;
    c.image_size = size;
    c.small_stem = size <= 64;
    c.patch = 4;
    Generator gen(0);
    models.emplace_back(arch, make_model(c, gen));
  }
  if (args.has("checkpoint")) {
    Checkpoint ck = load_checkpoint(args.text("checkpoint"));
    models.emplace_back(ck.config.arch, model_from_checkpoint(ck));
  }

  std::printf("adjoint bench explain: %d threads, batch %lld, median %s time of %lld runs; ms per image and the "
              "ratio to the gradient\n\n",
              num_threads(), (long long)batch, args.text("clock").c_str(), (long long)repeats);
  std::printf("%-12s %-26s %12s %10s\n", "model", "method", "ms/image", "ratio");
  std::vector<Timed> rows;
  for (auto& [name, model] : models) {
    model->train(false);
    bench_model(name, *model, batch, repeats, samples, max_batch, clock, rows);
  }
  std::printf("\nacceptance (soft pullback <= 1.2x gradient, pullback ascent K=5 <= 6x):");
  for (const auto& [name, model] : models) std::printf(" %s %s", name.c_str(), accepted(rows, name) ? "pass" : "FAIL");
  std::printf("\n");
  if (args.has("out")) write_results(args.text("out"), rows, batch, repeats);
  return 0;
}

}  // namespace adjoint
