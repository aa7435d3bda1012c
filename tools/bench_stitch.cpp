// `adjoint bench stitch`: the two inner loops of invariance-aware stitching
// (docs/methods.md §2), timed through the analysis code itself on a fixed pair of untrained
// models (the cost does not depend on the weights):
//
//   iri    find_iris (analysis/stitching/iri.h) on one batch: front model A up to block i,
//          relative distance to A's features of the target images, backward to the input,
//          normalised L2 step, best iterate kept. A run of --steps steps costs the target's
//          forward, steps + 1 recorded forwards and steps backwards; the time is per step.
//   train  train_stitch (analysis/stitching/train.h) for one epoch of --steps batches, slm
//          objective: A frozen to block i without autograd, B's own path on the same
//          images (the soft labels), the 1×1-conv stitch, B's remaining blocks recorded,
//          backward to the stitch's weight and bias only, AdamW; the time is per step.
//
// The pair: two models of one architecture (seeds 1 and 2) at width 1/4 on 1×28×28
// Fashion-MNIST-shaped random images in [0, 1], normalised with Fashion-MNIST's mean and
// std, stitched after the same block. tools/bench_stitch_torch.py runs the same loops in
// PyTorch, reading the settings from the JSON written with --out, and prints the ratio.
#include "tools/bench_stitch.h"

#include <algorithm>
#include <cstdio>

#include "analysis/stitching/iri.h"
#include "analysis/stitching/train.h"
#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/gemm.h"
#include "engine/io/json.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "tools/timing.h"

namespace adjoint {

namespace {

const std::vector<std::string> kArchitectures = {"vgg11_bn", "resnet18"};
constexpr double kWidth = 0.25;
constexpr int64_t kImageSize = 28;

// One model of the pair: architecture `arch` at width 1/4 on 1×28×28 images, frozen (eval
// mode, no parameter asks for a gradient), as `adjoint stitch` loads its models and as the
// PyTorch peer holds them.
Endpoint endpoint(const std::string& arch, uint64_t seed) {
  ModelConfig c;
  c.arch = arch, c.in_channels = 1, c.image_size = kImageSize, c.num_classes = 10, c.small_stem = true;
  c.width = kWidth;
  Generator gen(seed);
  std::shared_ptr<Model> model = make_model(c, gen);
  model->freeze();
  return Endpoint{cat(arch, " seed ", seed), model, {0.2860f}, {0.3530f}};  // Fashion-MNIST's statistics
}

struct Timed {
  std::string model, loop, block_name;
  cli::RunTimes per_step;  // seconds
};

// How a benchmark run is sized and timed (the options of run_bench_stitch).
struct Settings {
  size_t block;
  int64_t batch, steps, repeats;
  cli::TimingOptions timing;
};

// The times of runs of `steps` steps, per step.
cli::RunTimes per_step(const cli::RunTimes& run, int64_t steps) {
  return {run.median / double(steps), run.fastest / double(steps), run.slowest / double(steps)};
}

// find_iris on one batch, timed over runs of `steps` steps.
Timed time_iri(const std::string& arch, const Settings& s) {
  const Endpoint front = endpoint(arch, 1);
  Generator gen(3);
  const Tensor images = uniform({s.batch, 1, kImageSize, kImageSize}, 0.0f, 1.0f, gen);
  IriOptions o;
  o.search.steps = s.steps;
  o.batch = s.batch;
  const cli::RunTimes t = cli::time_runs(s.repeats, [&] { find_iris(front, s.block, images, o); }, s.timing);
  return {arch, "iri", front.model->blocks()[s.block].name, per_step(t, s.steps)};
}

// train_stitch, timed over runs of one epoch of `steps` batches.
Timed time_stitch_training(const std::string& arch, const Settings& s) {
  const StitchPair pair(endpoint(arch, 1), s.block, endpoint(arch, 2), s.block, {1, kImageSize, kImageSize});
  Stitch stitch(pair.shapes());
  Generator gen(4);
  stitch.init_random(gen);
  StitchTrainingSet data;
  const int64_t n = s.batch * s.steps;
  data.front_inputs = data.end_inputs = uniform({n, 1, kImageSize, kImageSize}, 0.0f, 1.0f, gen);
  for (int64_t i = 0; i < n; ++i) data.labels.push_back(randint(10, gen));
  StitchTrainOptions o;
  o.objective = "slm";
  o.epochs = 1;
  o.batch = s.batch;
  const cli::RunTimes t = cli::time_runs(s.repeats, [&] { train_stitch(stitch, pair, data, o); }, s.timing);
  return {arch, "train", pair.front().model->blocks()[s.block].name, per_step(t, s.steps)};
}

}  // namespace

int run_bench_stitch(const cli::Args& args) {
  if (args.positionals().size() > 1) throw UsageError("bench stitch takes no further arguments");
  const bool quick = args.flag("quick");
  const int64_t batch = args.has("batch") ? args.integer("batch") : 128;
  const int64_t repeats = args.has("repeats") ? args.integer("repeats") : quick ? 2 : 5;
  const int64_t steps = args.has("steps") ? args.integer("steps") : quick ? 2 : 10;
  const int64_t block = args.has("block") ? args.integer("block") : 3;
  if (batch < 2) throw UsageError(cat("bench stitch: --batch expects a count >= 2 (the IRIs' derangement), got ", batch));
  if (repeats < 1) throw UsageError(cat("bench stitch: --repeats expects a count >= 1, got ", repeats));
  if (steps < 1) throw UsageError(cat("bench stitch: --steps expects a count >= 1, got ", steps));
  if (block < 0) throw UsageError(cat("bench stitch: --block expects a block index >= 0, got ", block));
  const std::string clock = args.text("clock");
  const Settings settings{size_t(block), batch, steps, repeats, {cli::bench_clock(clock, num_threads())}};
  const std::vector<std::string> models = args.has("only") ? args.list("only") : kArchitectures;
  for (const std::string& m : models)
    if (std::find(kArchitectures.begin(), kArchitectures.end(), m) == kArchitectures.end())
      throw UsageError(cat("bench stitch: --only expects models among vgg11_bn, resnet18; got '", m, "'"));

  std::printf("adjoint bench stitch: %d threads, OpenBLAS kernels %s (convolutions: %s), width %.2f on 1x%lldx%lld, batch %lld, block %lld, "
              "%lld steps per run, median and range of %lld runs (%s clock), ms per step\n",
              num_threads(), blas_kernels(), widest_gemm_kernels(), kWidth, (long long)kImageSize, (long long)kImageSize, (long long)batch,
              (long long)block, (long long)steps, (long long)repeats, clock.c_str());
  std::printf("%-10s %-6s %-12s %10s %20s\n", "model", "loop", "block", "ms/step", "range");
  std::vector<Timed> rows;
  for (const std::string& arch : models) {
    for (const auto& time_loop : {time_iri, time_stitch_training}) {
      const Timed t = time_loop(arch, settings);
      std::printf("%-10s %-6s %-12s %10.2f %9.2f - %8.2f\n", t.model.c_str(), t.loop.c_str(), t.block_name.c_str(),
                  t.per_step.median * 1e3, t.per_step.fastest * 1e3, t.per_step.slowest * 1e3);
      std::fflush(stdout);
      rows.push_back(t);
    }
  }
  if (args.has("out")) {
    Json results = Json::array();
    for (const Timed& t : rows)
      results.push_back(Json(Json::Object{{"model", t.model},
                                          {"loop", t.loop},
                                          {"block_name", t.block_name},
                                          {"ms_per_step", t.per_step.median * 1e3},
                                          {"ms_fastest", t.per_step.fastest * 1e3},
                                          {"ms_slowest", t.per_step.slowest * 1e3}}));
    Json doc(Json::Object{{"threads", num_threads()},
                          {"blas", blas_kernels()},
                          {"conv_gemm", widest_gemm_kernels()},
                          {"clock", clock},
                          {"width", kWidth},
                          {"image_size", kImageSize},
                          {"batch", batch},
                          {"block", block},
                          {"steps", steps},
                          {"repeats", repeats},
                          {"results", results}});
    write_file_atomic(args.text("out"), to_json(doc, 2) + "\n");
    std::printf("wrote %s; compare: /usr/bin/python3 tools/bench_stitch_torch.py --threads %d --ours %s\n",
                args.text("out").c_str(), num_threads(), args.text("out").c_str());
  }
  return 0;
}

}  // namespace adjoint
