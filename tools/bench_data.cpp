// adjoint bench data: does the model wait for its data? A loader decodes and transforms the
// next batch on its worker (and the engine's threads) while the model runs on this one; per
// batch this measures the time next() blocks (waiting for data) beside the model's forward
// pass (compute), with prefetching on and, for comparison, off. Decoding alone (nothing
// else running) is timed too, so the wait is read against what there was to hide.
//
// The data: any --data SPEC (an ImageNet folder: imagenet:ROOT, ROOT/val through its preset).
// The model: an untrained ImageNet-sized ResNet-50 (--only ARCH for another), whose
// forward pass is the cheapest thing an evaluation does with a batch, so the hardest to
// hide decoding behind.
#include "tools/bench_data.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "engine/autograd.h"
#include "engine/data/loader.h"
#include "engine/data/open.h"
#include "engine/error.h"
#include "engine/gemm.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "models/model.h"

namespace adjoint {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct Steps {
  std::vector<double> wait, compute;  // seconds per batch
};

// `steps` batches through the model after one untimed batch (the first next() of a
// prefetching loader has nothing prefetched yet, and the model's first pass allocates).
Steps run_steps(const Model& model, const std::shared_ptr<const Dataset>& set, LoaderOptions options, int64_t steps) {
  Loader loader(set, options);
  Steps out;
  NoGrad no_grad;
  for (int64_t s = 0; s <= steps; ++s) {
    const auto start = std::chrono::steady_clock::now();
    const Batch batch = loader.next();
    const double waited = seconds_since(start);
    const auto computing = std::chrono::steady_clock::now();
    model.forward(batch.inputs);
    const double computed = seconds_since(computing);
    if (s == 0) continue;
    out.wait.push_back(waited);
    out.compute.push_back(computed);
  }
  return out;
}

void print_row(const char* mode, const Steps& s, int64_t batch) {
  const double wait = median(s.wait), compute = median(s.compute);
  const double worst = *std::max_element(s.wait.begin(), s.wait.end());
  std::printf("%-12s %10.2f %10.2f %12.2f %10.1f%%\n", mode, wait * 1e3 / double(batch), worst * 1e3 / double(batch),
              compute * 1e3 / double(batch), 100.0 * wait / (wait + compute));
}

}  // namespace

int run_bench_data(const cli::Args& args) {
  if (args.positionals().size() > 1) throw UsageError("bench data takes no further arguments");
  if (!args.has("data")) throw UsageError("bench data: give --data SPEC (an ImageNet folder: --data imagenet:ROOT)");
  const std::string spec = args.text("data");
  const bool quick = args.flag("quick");
  const int64_t batch = args.has("batch") ? args.integer("batch") : 8;
  const int64_t steps = args.has("steps") ? args.integer("steps") : quick ? 3 : 10;
  if (batch < 1) throw UsageError(cat("option --batch expects a count >= 1, got ", batch));
  if (steps < 1) throw UsageError(cat("option --steps expects a count >= 1, got ", steps));

  const DataSource data = open_data(spec, DataSplits::TestOnly);
  check(data.images, "bench data: ", spec, " is not an image data set");
  LoaderOptions options;
  options.batch_size = batch;
  options.shuffle = true;
  options.transforms = data.eval_transforms();
  const Shape shape = transformed_shape(options.transforms, data.test->shape());
  check(shape.size() == 3 && shape[1] == shape[2], "bench data: ", spec, " gives examples of shape ", shape,
        "; expected square images");
  ModelConfig c;
  c.arch = args.has("only") ? args.text("only") : "resnet50";
  c.num_classes = 1000;
  c.in_channels = shape[0];
  c.image_size = shape[1];
  c.small_stem = false;
  Generator gen(0);
  const std::shared_ptr<Model> model = make_model(c, gen);
  model->train(false);

  std::printf("adjoint bench data: %s (%lld images of %lld x %lld x %lld), %s forward, batch %lld, %lld steps, %d "
              "threads, OpenBLAS kernels %s (convolutions: %s)\n",
              spec.c_str(), (long long)data.test->size(), (long long)shape[0], (long long)shape[1],
              (long long)shape[2], c.arch.c_str(), (long long)batch, (long long)steps, num_threads(), blas_kernels(),
              widest_gemm_kernels());
  // Decoding alone: batches built on this thread, nothing else running.
  Loader alone(data.test, options);
  std::vector<double> decode;
  for (int64_t s = 0; s < std::min<int64_t>(steps, alone.batches_per_epoch()); ++s) {
    const auto start = std::chrono::steady_clock::now();
    alone.batch(0, s);
    decode.push_back(seconds_since(start));
  }
  std::printf("decode and transform alone: %.2f ms/image (median of %zu batches)\n\n",
              median(decode) * 1e3 / double(batch), decode.size());
  std::printf("%-12s %10s %10s %12s %11s\n", "loader", "wait", "worst wait", "compute", "waiting");
  std::printf("%-12s %10s %10s %12s %11s\n", "", "ms/image", "ms/image", "ms/image", "share");
  options.prefetch = true;
  print_row("prefetch", run_steps(*model, data.test, options, steps), batch);
  options.prefetch = false;
  print_row("no prefetch", run_steps(*model, data.test, options, steps), batch);
  std::printf("(wait: time in Loader::next(); compute: the model's forward pass; medians over the steps after the first)\n");
  return 0;
}

}  // namespace adjoint
