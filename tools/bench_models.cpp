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
// At ImageNet's size (--size 224) the models are the paper's (ResNet-50, VGG-16-BN, ViT-B/16,
// PVT-v2-b1, batch 8), and beside inference and the training step it times the explanation workloads
// per image (gradient, soft pullback, pullback ascent K=5, SmoothGrad and integrated
// gradients) with the peak tensor memory of each; --workloads and --only choose a part of
// that grid, which at 224 pixels is long. With --memory, every chosen workload's peak memory
// is also measured as the PyTorch peer measures it (tools/bench_models_torch.py --memory): the
// resident set's growth in a fresh process over its model and inputs (bench_cell_in_child).
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

#include "analysis/pullbacks/explain.h"
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

// The models at ImageNet's size, with its 1000 classes and the full stems. A model joins by
// its name and configuration here.
std::vector<ModelCase> imagenet_cases() {
  auto image_model = [](const std::string& arch, int64_t patch) {
    ModelConfig c;
    c.arch = arch, c.in_channels = 3, c.image_size = 224, c.num_classes = 1000, c.small_stem = false, c.patch = patch;
    return c;
  };
  return {{"resnet50", image_model("resnet50", 0)},
          {"vgg16_bn", image_model("vgg16_bn", 0)},
          {"vit_b_16", image_model("vit_base", 16)},
          {"pvt_v2_b1", image_model("pvt_v2_b1", 0)}};
}

std::vector<ModelCase> small_cases() {
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

// An explanation workload's cost per image and the tensor memory its runs held at their
// peak beyond what the process held before.
struct ExplainCell {
  std::string workload;
  double ms_per_image = 0, peak_mib = 0;
  double peak_rss_mib = -1, fresh_peak_mib = -1;  // in a fresh process (--memory); -1: not measured
  // The prepared forms kept after it (engine/tensor.h PreparedForms), and how many its runs
  // dropped to stay within their budget.
  double kept_forms_mib = 0;
  int64_t evictions = 0;
};

// What a run times: the training step and inference (the peer's columns), and the
// explanation methods (analysis/pullbacks/explain.h names).
struct Workloads {
  bool train = true, infer = true;
  std::vector<std::string> methods;
  int64_t samples = 50;  // SmoothGrad's samples and integrated gradients' steps
};

// The workloads known by name: the two steps, then the explanation methods the paper scores.
const std::vector<std::string>& workload_names() {
  static const std::vector<std::string> names = {"train",           "infer",      "gradient",
                                                 "soft_pullback",   "pullback_ascent",
                                                 "smoothgrad",      "integrated_gradients"};
  return names;
}

Workloads parse_workloads(const std::vector<std::string>& chosen, int64_t samples) {
  Workloads w;
  w.train = w.infer = false;
  w.samples = samples;
  for (const std::string& name : chosen) {
    const auto& known = workload_names();
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string list;
      for (const std::string& k : known) list += " " + k;
      throw UsageError(cat("bench models: unknown workload '", name, "' in --workloads; known:", list));
    }
    if (name == "train") w.train = true;
    else if (name == "infer") w.infer = true;
    else w.methods.push_back(name);
  }
  return w;
}

struct Result {
  std::vector<ExplainCell> explained;
  std::string model;
  int64_t batch = 0;
  double train_per_s = 0, infer_per_s = 0;
  double forward_flops = 0;  // per sample, engine/flops.h's convention
  double peak_mib = 0;      // tensor storage held at the step's peak, beyond what it started with
  double peak_rss_mib = 0;  // the process's resident-set peak over the step (as the PyTorch peer measures)
  // Inference's peaks in a fresh process (--memory): tensor storage and resident set; -1: not measured
  double infer_peak_mib = -1, infer_peak_rss_mib = -1;
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

// The cases of a run: the small models at 32 pixels (size 0), or the ImageNet ones at `size`.
std::vector<ModelCase> cases(int64_t size) {
  if (size == 0) return small_cases();
  std::vector<ModelCase> all = imagenet_cases();
  for (ModelCase& mc : all) mc.config.image_size = size;
  return all;
}

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
ModelCase find_case(const std::string& name, int64_t size) {
  std::string known;
  for (const ModelCase& mc : cases(size)) {
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

// The explanation methods' options: the ascent's 5 steps, the many-pass methods' count.
ExplainOptions explain_options(const Workloads& w) {
  ExplainOptions o;
  o.ascent_steps = 5;
  o.smoothgrad_samples = w.samples;
  o.ig_steps = w.samples;
  return o;
}

// A workload's row label: the many-pass methods with their count, the ascent with its steps.
std::string workload_label(const std::string& method, const Workloads& w) {
  if (method == "smoothgrad" || method == "integrated_gradients") return cat(method, "(", w.samples, ")");
  return method == "pullback_ascent" ? "pullback_ascent(K=5)" : method;
}

// Each explanation workload on the model's batch, per image: the cheap ones as the median
// of `repeats` runs, the many-pass ones (SmoothGrad, IG) once, the model being warm by then.
void bench_explanations(Bench& b, const Workloads& w, int64_t repeats, cli::BenchClock clock, Result& r) {
  b.model->train(false);
  const std::vector<int64_t> targets = predicted_classes(*b.model, b.x);
  const ExplainOptions o = explain_options(w);
  for (const std::string& method : w.methods) {
    const bool many_passes = method == "smoothgrad" || method == "integrated_gradients";
    reset_peak_memory();
    const int64_t before = memory_stats().current_bytes, evictions = memory_stats().prepared_evictions;
    const auto run = [&] { explain(method, *b.model, b.x, targets, o); };
    const double seconds = many_passes ? cli::median_seconds(1, run, {clock, 0, 0.0}) : cli::median_seconds(repeats, run, {clock});
    const double peak = double(memory_stats().peak_bytes - before) / (1024.0 * 1024.0);
    const MemoryStats after = memory_stats();
    ExplainCell cell{workload_label(method, w), seconds * 1e3 / double(r.batch), peak};
    cell.kept_forms_mib = double(after.prepared_bytes) / (1024.0 * 1024.0);
    cell.evictions = after.prepared_evictions - evictions;
    r.explained.push_back(cell);
  }
}

void bench_speed(const ModelCase& mc, int64_t batch, int64_t repeats, cli::BenchClock clock, const Workloads& w,
                 Result& r) {
  Bench b(mc, batch);
  r.model = mc.name;
  r.batch = b.x.size(0);
  if (w.train) {
    b.model->train(true);
    const StepTimes train = time_steps(repeats, [&] { b.step(); }, {clock, 0, 0.0});
    r.train_per_s = double(r.batch) / train.median_seconds, r.train_blas_seconds = train.blas_seconds;
  }
  b.model->train(false);
  if (w.infer) {
    const StepTimes infer = time_steps(repeats, [&] {
      NoGrad off;
      b.model->forward(b.x);
    }, {clock});
    r.infer_per_s = double(r.batch) / infer.median_seconds, r.infer_blas_seconds = infer.blas_seconds;
  }
  if (!w.methods.empty()) bench_explanations(b, w, repeats, clock, r);
  NoGrad off;
  FlopCount count;
  // trace runs every block in full (never a block's with_next), so this counts the model's
  // nominal FLOPs, the peer's too, not the fewer of a ViT's class-token-only last block.
  b.model->trace(b.x, 0, b.model->num_blocks());
  r.forward_flops = double(count.total()) / double(r.batch);
}

// The share of a step's time (all threads' CPU time) spent in OpenBLAS.
double blas_share(double blas_seconds, double samples_per_s, int64_t batch) {
  if (samples_per_s == 0) return 0;  // not measured in this run
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

// One workload's peak memory in this process, fresh, beyond what it held with the model and
// its inputs made: tensor storage and the resident set. The training step is its second (the
// first allocates the optimizer's state). Every other workload is its first run, so that the
// forms its weights keep (PreparedForms) count as the memory they are; its targets are the
// batch's fixed labels rather than the model's predictions, whose forward pass would keep
// them beforehand (the peer does the same).
struct CellMemory {
  double tensor_mib = 0, rss_mib = 0;
};
CellMemory measure_cell(const ModelCase& mc, int64_t batch, const std::string& workload, const Workloads& w) {
  Bench b(mc, batch);
  b.model->train(workload == "train");
  if (workload == "train") b.step();
  const ExplainOptions o = explain_options(w);
  reset_peak_memory();
  reset_peak_rss();
  const int64_t before = memory_stats().current_bytes, rss_before = vm_kib("VmRSS");
  if (workload == "train") {
    b.step();
  } else if (workload == "infer") {
    NoGrad off;
    b.model->forward(b.x);
  } else {
    explain(workload, *b.model, b.x, b.labels, o);
  }
  return {double(memory_stats().peak_bytes - before) / (1024.0 * 1024.0), double(vm_kib("VmHWM") - rss_before) / 1024.0};
}

// measure_cell in a fresh copy of this program started with MALLOC_MMAP_THRESHOLD_=131072:
// glibc then maps every large buffer when it is allocated and unmaps it when freed, so the
// resident set follows live memory. (The default threshold adapts and keeps freed buffers
// resident, which hides part of a peak from VmHWM, and so does the engine's own setting
// (engine/tensor.cpp, keep_freed_memory), which that variable turns off; within one process,
// the cells before would too.) The PyTorch peer measures the same way.
CellMemory bench_cell_in_child(const ModelCase& mc, int64_t batch, int64_t size, const std::string& workload,
                               const Workloads& w) {
  char self[4096];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  check(n > 0, "bench models: cannot find this program's path in /proc/self/exe");
  self[n] = '\0';
  const std::string command =
      cat("MALLOC_MMAP_THRESHOLD_=131072 '", self, "' bench models --memory-child ", mc.name, " --workloads ", workload,
          " --samples ", w.samples, " --batch ", batch, " --threads ", num_threads(), size ? cat(" --size ", size) : "");
  FILE* child = popen(command.c_str(), "r");
  check(child != nullptr, "bench models: cannot start ", command);
  CellMemory m{-1, -1};
  const int read = std::fscanf(child, "%lf %lf", &m.tensor_mib, &m.rss_mib);
  const int status = pclose(child);
  check(read == 2 && status == 0, "bench models: the memory measurement of ", mc.name, " ", workload, " failed (",
        command, ")");
  return m;
}

}  // namespace

int run_bench_models(const cli::Args& args) {
  prepared_forms_budget();  // reads ADJOINT_PREPARED_FORMS_MIB: a bad value stops the run here
  const bool quick = args.flag("quick");
  // 0: the small models at 32 pixels; otherwise the ImageNet models at this size.
  const int64_t size = args.has("size") ? args.integer("size") : args.flag("imagenet") ? 224 : 0;
  if (args.has("size") && size < 32) throw UsageError(cat("bench models: --size expects at least 32 pixels, got ", size));
  const int64_t batch = args.has("batch") ? args.integer("batch") : size ? 8 : 64;
  const int64_t repeats = args.has("repeats") ? args.integer("repeats") : quick ? 2 : 5;
  if (batch < 1 || repeats < 1) throw UsageError("bench models: --batch and --repeats must be at least 1");
  const int64_t samples = args.has("samples") ? args.integer("samples") : 50;
  if (samples < 2) throw UsageError(cat("bench models: --samples expects a count >= 2, got ", samples));
  const std::vector<std::string> default_workloads =
      size ? workload_names() : std::vector<std::string>{"train", "infer"};
  const Workloads workloads = parse_workloads(args.has("workloads") ? args.list("workloads") : default_workloads, samples);
  std::vector<std::string> only = args.has("only") ? args.list("only") : std::vector<std::string>{};
  for (const std::string& name : only) find_case(name, size);
  if (args.has("memory-child")) {
    std::vector<std::string> cell = args.has("workloads") ? args.list("workloads") : std::vector<std::string>{"train"};
    if (cell.size() != 1) throw UsageError("bench models: --memory-child measures one workload");
    const CellMemory m = measure_cell(find_case(args.text("memory-child"), size), batch, cell[0], workloads);
    std::printf("%.3f %.3f\n", m.tensor_mib, m.rss_mib);
    return 0;
  }
  const bool every_cell_memory = args.flag("memory");
  const cli::BenchClock clock = cli::bench_clock(args.text("clock"), num_threads());
  if (size)
    std::printf("adjoint bench models: %lldx%lld images, %d threads, batch %lld, median %s time of %lld steps\n",
                (long long)size, (long long)size, num_threads(), (long long)batch, args.text("clock").c_str(),
                (long long)repeats);
  else
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
  for (const ModelCase& mc : cases(size))
    if (only.empty() || std::find(only.begin(), only.end(), mc.name) != only.end()) chosen.push_back(mc);
  for (const ModelCase& mc : chosen) {
    Result r;
    bench_speed(mc, batch, repeats, clock, workloads, r);
    const Rate train = rate(r.train_per_s, kTrainingPasses * r.forward_flops, sgemm);
    const Rate infer = rate(r.infer_per_s, r.forward_flops, sgemm);
    std::printf("%-12s %15.1f %15.1f %13.3f %11.1f (%4.0f%%) %11.1f (%4.0f%%) %7.0f%% %6.0f%%\n", r.model.c_str(),
                r.train_per_s, r.infer_per_s, r.forward_flops * 1e-9, train.gflops, 100 * train.share, infer.gflops,
                100 * infer.share, 100 * blas_share(r.train_blas_seconds, r.train_per_s, r.batch),
                100 * blas_share(r.infer_blas_seconds, r.infer_per_s, r.batch));
    std::fflush(stdout);
    results.push_back(r);
  }
  if (!workloads.methods.empty()) {
    const int64_t budget = prepared_forms_budget();
    std::printf("\nprepared forms' budget: %s (ADJOINT_PREPARED_FORMS_MIB)\n%-12s %-28s %12s %16s %16s %10s\n",
                budget < 0 ? "unlimited" : cat(budget >> 20, " MiB").c_str(), "model", "explanation", "ms/image",
                "peak tensor MiB", "kept forms MiB", "dropped");
    for (const Result& r : results)
      for (const ExplainCell& e : r.explained)
        std::printf("%-12s %-28s %12.1f %16.1f %16.1f %10lld\n", r.model.c_str(), e.workload.c_str(), e.ms_per_image,
                    e.peak_mib, e.kept_forms_mib, (long long)e.evictions);
  }
  if (workloads.train && !every_cell_memory) std::printf("\n%-12s %15s %15s\n", "model", "step peak MiB", "step RSS MiB");
  for (size_t i = 0; i < chosen.size() && workloads.train && !every_cell_memory; ++i) {
    const CellMemory m = bench_cell_in_child(chosen[i], batch, size, "train", workloads);
    results[i].peak_mib = m.tensor_mib, results[i].peak_rss_mib = m.rss_mib;
    std::printf("%-12s %15.1f %15.1f\n", results[i].model.c_str(), results[i].peak_mib, results[i].peak_rss_mib);
    std::fflush(stdout);
  }
  if (every_cell_memory)
    std::printf("\npeak memory of each workload in a fresh process, beyond its model and inputs\n%-12s %-28s %16s %14s\n",
                "model", "workload", "peak tensor MiB", "peak RSS MiB");
  for (size_t i = 0; i < chosen.size() && every_cell_memory; ++i) {
    Result& r = results[i];
    const auto measure = [&](const std::string& workload, const std::string& label) {
      const CellMemory m = bench_cell_in_child(chosen[i], batch, size, workload, workloads);
      std::printf("%-12s %-28s %16.1f %14.1f\n", r.model.c_str(), label.c_str(), m.tensor_mib, m.rss_mib);
      std::fflush(stdout);
      return m;
    };
    if (workloads.train) {
      const CellMemory m = measure("train", "train");
      r.peak_mib = m.tensor_mib, r.peak_rss_mib = m.rss_mib;
    }
    if (workloads.infer) {
      const CellMemory m = measure("infer", "infer");
      r.infer_peak_mib = m.tensor_mib, r.infer_peak_rss_mib = m.rss_mib;
    }
    for (size_t k = 0; k < workloads.methods.size(); ++k) {
      const CellMemory m = measure(workloads.methods[k], r.explained[k].workload);
      r.explained[k].fresh_peak_mib = m.tensor_mib, r.explained[k].peak_rss_mib = m.rss_mib;
    }
  }
  if (args.has("out")) {
    Json rows = Json::array();
    for (const Result& r : results) {
      const Rate train = rate(r.train_per_s, kTrainingPasses * r.forward_flops, sgemm);
      const Rate infer = rate(r.infer_per_s, r.forward_flops, sgemm);
      Json row(Json::Object{{"model", r.model},
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
                                       {"peak_rss_step_mib", r.peak_rss_mib}});
      if (r.infer_peak_rss_mib >= 0) row["peak_infer_mib"] = r.infer_peak_mib, row["peak_rss_infer_mib"] = r.infer_peak_rss_mib;
      Json explained = Json::array();
      for (const ExplainCell& e : r.explained) {
        Json cell(Json::Object{{"workload", e.workload},
                               {"ms_per_image", e.ms_per_image},
                               {"peak_tensor_mib", e.peak_mib},
                               {"kept_forms_mib", e.kept_forms_mib},
                               {"forms_dropped", e.evictions}});
        if (e.peak_rss_mib >= 0) cell["fresh_peak_tensor_mib"] = e.fresh_peak_mib, cell["peak_rss_mib"] = e.peak_rss_mib;
        explained.push_back(cell);
      }
      row["explanations"] = explained;
      rows.push_back(row);
    }
    Json doc(Json::Object{{"threads", num_threads()},
                          {"image_size", size ? size : 32},
                          {"clock", args.text("clock")},
                          {"batch", batch},
                          {"blas", blas_kernels()},
                          {"conv_gemm", widest_gemm_kernels()},
                          {"sgemm_size", kSgemmSize},
                          {"sgemm_gflops", sgemm * 1e-9},
                          {"training_passes", kTrainingPasses},
                          {"prepared_forms_budget_mib", prepared_forms_budget() < 0 ? -1.0 : double(prepared_forms_budget()) / double(1 << 20)},
                          {"models", rows}});
    write_file_atomic(args.text("out"), to_json(doc, 2) + "\n");
    std::printf("wrote %s; compare: /usr/bin/python3 tools/bench_models_torch.py --threads %d --clock %s --ours %s "
                "--memory\n",
                args.text("out").c_str(), num_threads(), args.text("clock").c_str(), args.text("out").c_str());
  }
  return 0;
}

}  // namespace adjoint
