// `adjoint bench models`: samples/s of a training step (forward, cross-entropy, backward,
// SGD update) and of inference for five models (ResNet-18, VGG-11 and VGG-16 with BatchNorm,
// ViT-Tiny, the bilinear LM), batch 64 of 32×32×3 images (the bilinear LM: batch 32 of 64
// tokens), and the peak memory of each model's training
// step (tensor storage and resident set). tools/bench_models_torch.py runs the same models in PyTorch and prints
// both with the ratio.
//
// Beside the peer, the limit: each model's achieved GFLOP/s (its products' nominal FLOPs,
// engine/flops.h; a training step counts as three forward passes) as a share of the rate
// of one large square sgemm through the engine's gemm at the same thread count, measured
// in the same run.
//
// And what bounds the ratio: the CPU time a step spends in OpenBLAS's sgemm, the kernels both
// sides share (engine/gemm.h, BlasTime). The PyTorch script divides its step time by it: the
// ratio the engine would reach if everything outside those kernels cost nothing.
#include "tools/bench_models.h"

#include <unistd.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <functional>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/io/json.h"
#include "engine/io/files.h"
#include "engine/flops.h"
#include "engine/gemm.h"
#include "engine/optim.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "models/model.h"
#include "ops/layout.h"
#include "ops/loss.h"
#include "tools/timing.h"

namespace adjoint {

namespace {

struct ModelCase {
  std::string name;
  ModelConfig config;
};

std::vector<ModelCase> cases() {
  auto image_model = [](const std::string& arch) {
    ModelConfig c;
    c.arch = arch, c.in_channels = 3, c.image_size = 32, c.num_classes = 10, c.small_stem = true, c.patch = 4;
    return c;
  };
  ModelConfig lm;
  lm.arch = "bilinear_lm", lm.dim = 256, lm.depth = 2, lm.heads = 4, lm.seq_len = 64, lm.vocab = 256;
  return {{"resnet18", image_model("resnet18")},
          {"vgg11_bn", image_model("vgg11_bn")},
          {"vgg16_bn", image_model("vgg16_bn")},
          {"vit_tiny", image_model("vit_tiny")},
          {"bilinear_lm", lm}};
}

struct Result {
  std::string model;
  int64_t batch = 0;
  double train_per_s = 0, infer_per_s = 0;
  double forward_flops = 0;  // per sample, engine/flops.h's convention
  double peak_mib = 0;      // tensor storage held at the step's peak, beyond what it started with
  double peak_rss_mib = 0;  // the process's resident-set peak over the step (as the PyTorch peer measures)
  // CPU seconds per step inside OpenBLAS's sgemm, summed over threads (engine/gemm.h, BlasTime)
  double train_blas_seconds = 0, infer_blas_seconds = 0;
};

// A field of /proc/self/status in KiB (VmRSS, VmHWM); 0 where unavailable.
int64_t vm_kib(const std::string& field) {
  std::ifstream status("/proc/self/status");
  std::string key;
  int64_t value = 0;
  while (status >> key) {
    if (key == field + ":") return (status >> value) ? value : 0;
    status.ignore(1 << 20, '\n');
  }
  return 0;
}

// Resets the kernel's resident-set high-water mark (VmHWM) to the current size.
void reset_peak_rss() { std::ofstream("/proc/self/clear_refs") << "5"; }

// A fixed random batch: images and labels, or token ids and next-token labels.
void make_batch(const ModelConfig& c, int64_t batch, Tensor& x, std::vector<int64_t>& labels) {
  Generator gen(0);
  if (c.arch == "bilinear_lm") {
    x = Tensor::empty({32, c.seq_len});
    for (int64_t i = 0; i < x.numel(); ++i) x.data()[i] = float(randint(c.vocab, gen));
    labels.resize(size_t(x.numel()));
    for (auto& l : labels) l = randint(c.vocab, gen);
    return;
  }
  x = uniform({batch, c.in_channels, c.image_size, c.image_size}, 0.0f, 1.0f, gen);
  labels.resize(size_t(batch));
  for (auto& l : labels) l = randint(c.num_classes, gen);
}

// The benchmark case called `name`; a usage error listing the known ones otherwise.
ModelCase find_case(const std::string& name) {
  std::string known;
  for (const ModelCase& mc : cases()) {
    if (mc.name == name) return mc;
    known += " " + mc.name;
  }
  throw UsageError(cat("bench models: unknown model '", name, "'; known:", known));
}

// A model with its batch and an SGD training step recorded as the train loop records it.
struct Bench {
  std::shared_ptr<Model> model;
  Tensor x;
  std::vector<int64_t> labels;
  std::unique_ptr<Sgd> opt;

  explicit Bench(const ModelCase& mc, int64_t batch) {
    Generator init(0);
    model = make_model(mc.config, init);
    make_batch(mc.config, batch, x, labels);
    opt = std::make_unique<Sgd>(model->named_parameters(), SgdOptions{0.01, 0.9, 0.0, false});
  }
  void step() {
    opt->zero_grad();
    GradientOnly training_graph;
    Tensor logits = model->forward(x);
    if (logits.dim() == 3) logits = reshape(logits, {-1, logits.size(-1)});
    backward(cross_entropy(logits, labels));
    opt->step();
  }
};

// The median seconds of `repeats` steps, and the CPU seconds per step spent in OpenBLAS,
// metered over every run (warm-up included).
struct StepTimes {
  double median_seconds, blas_seconds;
};
StepTimes time_steps(int64_t repeats, const std::function<void()>& step, const cli::TimingOptions& options) {
  int64_t runs = 0;
  const BlasTime blas;
  const double median = cli::median_seconds(repeats, [&] { step(), ++runs; }, options);
  return {median, blas.seconds() / double(runs)};
}

void bench_speed(const ModelCase& mc, int64_t batch, int64_t repeats, cli::BenchClock clock, Result& r) {
  Bench b(mc, batch);
  r.model = mc.name;
  r.batch = b.x.size(0);
  b.model->train(true);
  const StepTimes train = time_steps(repeats, [&] { b.step(); }, {clock, 0, 0.0});
  b.model->train(false);
  const StepTimes infer = time_steps(repeats, [&] {
    NoGrad off;
    b.model->forward(b.x);
  }, {clock});
  r.train_per_s = double(r.batch) / train.median_seconds, r.train_blas_seconds = train.blas_seconds;
  r.infer_per_s = double(r.batch) / infer.median_seconds, r.infer_blas_seconds = infer.blas_seconds;
  NoGrad off;
  FlopCount count;
  // trace runs every block in full (never a block's with_next), so this counts the model's
  // nominal FLOPs, the peer's too, not the fewer of a ViT's class-token-only last block.
  b.model->trace(b.x, 0, b.model->num_blocks());
  r.forward_flops = double(count.total()) / double(r.batch);
}

// The share of a step's time (all threads' CPU time) spent in OpenBLAS.
double blas_share(double blas_seconds, double samples_per_s, int64_t batch) {
  return blas_seconds / (double(num_threads()) * double(batch) / samples_per_s);
}

// A training step's operations: the forward pass, and two products of each of its
// products in the backward pass (input and weight gradients).
constexpr double kTrainingPasses = 3.0;

// The reference rate (FLOP/s): a square sgemm of this size through the engine's gemm, at
// this run's thread count, median of a few runs.
constexpr int64_t kSgemmSize = 2048;
double measure_sgemm_rate(cli::BenchClock clock) {
  const int64_t n = kSgemmSize;
  Generator gen(1);
  const Tensor a = uniform({n, n}, -1.0f, 1.0f, gen), b = uniform({n, n}, -1.0f, 1.0f, gen);
  Tensor c = Tensor::empty({n, n});
  const double seconds = cli::median_seconds(5, [&] {
    gemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  }, {clock});
  return 2.0 * double(n) * double(n) * double(n) / seconds;
}

// Achieved GFLOP/s of `samples_per_s` at `flops_per_sample`, and its share of the sgemm rate.
struct Rate {
  double gflops, share;
};
Rate rate(double samples_per_s, double flops_per_sample, double sgemm_flops_per_s) {
  const double flops_per_s = samples_per_s * flops_per_sample;
  return {flops_per_s * 1e-9, flops_per_s / sgemm_flops_per_s};
}

// Memory of the second training step (the first allocates the optimizer state), beyond
// what the process held before it: tensor storage, and the resident set.
void bench_memory(const ModelCase& mc, int64_t batch, Result& r) {
  Bench b(mc, batch);
  b.model->train(true);
  b.step();
  reset_peak_memory();
  reset_peak_rss();
  const int64_t before = memory_stats().current_bytes, rss_before = vm_kib("VmRSS");
  b.step();
  r.peak_mib = double(memory_stats().peak_bytes - before) / (1024.0 * 1024.0);
  r.peak_rss_mib = double(vm_kib("VmHWM") - rss_before) / 1024.0;
}

// bench_memory in a fresh copy of this program started with MALLOC_MMAP_THRESHOLD_=131072:
// glibc then maps every large buffer when it is allocated and unmaps it when freed, so the
// resident set follows live memory. (The default threshold adapts and keeps freed buffers
// resident, which hides part of a step's peak from VmHWM; the timings before would too.)
// The PyTorch peer measures the same way.
void bench_memory_in_child(const ModelCase& mc, int64_t batch, Result& r) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  check(n > 0, "bench models: cannot find this program's path in /proc/self/exe");
  self[n] = '\0';
  const std::string command = cat("MALLOC_MMAP_THRESHOLD_=131072 '", self, "' bench models --memory-child ", mc.name,
                                  " --batch ", batch, " --threads ", num_threads());
  FILE* child = popen(command.c_str(), "r");
  check(child != nullptr, "bench models: cannot start ", command);
  double peak = -1, rss = -1;
  const int read = std::fscanf(child, "%lf %lf", &peak, &rss);
  const int status = pclose(child);
  check(read == 2 && status == 0, "bench models: the memory measurement of ", mc.name, " failed (", command, ")");
  r.peak_mib = peak, r.peak_rss_mib = rss;
}

}  // namespace

int run_bench_models(const cli::Args& args) {
  const bool quick = args.flag("quick");
  const int64_t batch = args.has("batch") ? args.integer("batch") : 64;
  const int64_t repeats = args.has("repeats") ? args.integer("repeats") : quick ? 2 : 5;
  if (batch < 1 || repeats < 1) throw UsageError("bench models: --batch and --repeats must be at least 1");
  std::vector<std::string> only = args.has("only") ? args.list("only") : std::vector<std::string>{};
  for (const std::string& name : only) find_case(name);
  if (args.has("memory-child")) {
    Result r;
    bench_memory(find_case(args.text("memory-child")), batch, r);
    std::printf("%.3f %.3f\n", r.peak_mib, r.peak_rss_mib);
    return 0;
  }
  const cli::BenchClock clock = cli::bench_clock(args.text("clock"), num_threads());
  std::printf("adjoint bench models: %d threads, batch %lld (bilinear_lm: 32x64 tokens), median %s time of %lld steps\n",
              num_threads(), (long long)batch, args.text("clock").c_str(), (long long)repeats);
  const double sgemm = measure_sgemm_rate(clock);
  std::printf("sgemm %lld^3 through the engine's gemm (OpenBLAS %s): %.1f GFLOP/s; a model's GFLOP/s counts its\n"
              "products' nominal FLOPs (training: 3x forward) and its %% is the share of that sgemm rate;\n"
              "convolutions' GEMM kernels: %s\n",
              (long long)kSgemmSize, blas_kernels(), sgemm * 1e-9, widest_gemm_kernels());
  std::printf("%-12s %15s %15s %13s %19s %19s %16s\n", "model", "train samples/s", "infer samples/s", "GFLOP/sample",
              "train GFLOP/s (%)", "infer GFLOP/s (%)", "in OpenBLAS t/i");
  std::vector<Result> results;
  std::vector<ModelCase> chosen;
  for (const ModelCase& mc : cases())
    if (only.empty() || std::find(only.begin(), only.end(), mc.name) != only.end()) chosen.push_back(mc);
  for (const ModelCase& mc : chosen) {
    Result r;
    bench_speed(mc, batch, repeats, clock, r);
    const Rate train = rate(r.train_per_s, kTrainingPasses * r.forward_flops, sgemm);
    const Rate infer = rate(r.infer_per_s, r.forward_flops, sgemm);
    std::printf("%-12s %15.1f %15.1f %13.3f %11.1f (%4.0f%%) %11.1f (%4.0f%%) %7.0f%% %6.0f%%\n", r.model.c_str(),
                r.train_per_s, r.infer_per_s, r.forward_flops * 1e-9, train.gflops, 100 * train.share, infer.gflops,
                100 * infer.share, 100 * blas_share(r.train_blas_seconds, r.train_per_s, r.batch),
                100 * blas_share(r.infer_blas_seconds, r.infer_per_s, r.batch));
    std::fflush(stdout);
    results.push_back(r);
  }
  std::printf("\n%-12s %15s %15s\n", "model", "step peak MiB", "step RSS MiB");
  for (size_t i = 0; i < chosen.size(); ++i) {
    bench_memory_in_child(chosen[i], batch, results[i]);
    std::printf("%-12s %15.1f %15.1f\n", results[i].model.c_str(), results[i].peak_mib, results[i].peak_rss_mib);
    std::fflush(stdout);
  }
  if (args.has("out")) {
    Json rows = Json::array();
    for (const Result& r : results) {
      const Rate train = rate(r.train_per_s, kTrainingPasses * r.forward_flops, sgemm);
      const Rate infer = rate(r.infer_per_s, r.forward_flops, sgemm);
      rows.push_back(Json(Json::Object{{"model", r.model},
                                       {"batch", r.batch},
                                       {"train_samples_per_s", r.train_per_s},
                                       {"infer_samples_per_s", r.infer_per_s},
                                       {"forward_gflop_per_sample", r.forward_flops * 1e-9},
                                       {"train_gflops", train.gflops},
                                       {"train_sgemm_share", train.share},
                                       {"infer_gflops", infer.gflops},
                                       {"infer_sgemm_share", infer.share},
                                       {"train_blas_cpu_seconds", r.train_blas_seconds},
                                       {"infer_blas_cpu_seconds", r.infer_blas_seconds},
                                       {"peak_step_mib", r.peak_mib},
                                       {"peak_rss_step_mib", r.peak_rss_mib}}));
    }
    Json doc(Json::Object{{"threads", num_threads()},
                          {"clock", args.text("clock")},
                          {"batch", batch},
                          {"blas", blas_kernels()},
                          {"conv_gemm", widest_gemm_kernels()},
                          {"sgemm_size", kSgemmSize},
                          {"sgemm_gflops", sgemm * 1e-9},
                          {"training_passes", kTrainingPasses},
                          {"models", rows}});
    write_file_atomic(args.text("out"), to_json(doc, 2) + "\n");
    std::printf("wrote %s; compare: /usr/bin/python3 tools/bench_models_torch.py --threads %d --clock %s --ours %s "
                "--memory\n",
                args.text("out").c_str(), num_threads(), args.text("clock").c_str(), args.text("out").c_str());
  }
  return 0;
}

}  // namespace adjoint
