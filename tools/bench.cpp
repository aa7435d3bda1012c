// adjoint bench: times matmul and conv2d, forward and forward+backward, and sets each beside
// the raw cblas_sgemm rate of the same products (the conv's GEMMs folded over the whole
// batch) measured in the same run at the same thread count. The ratio says how much of
// the BLAS rate the op keeps after its im2col, copies, splitting and autograd.
//
// This file is the one place outside engine/gemm.cpp that calls OpenBLAS directly: the raw
// reference lets OpenBLAS thread itself (openblas_set_num_threads) and restores the
// engine's setting, one thread, afterwards.
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdio>
#include <functional>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/gemm.h"
#include "engine/io/csv.h"
#include "engine/io/files.h"
#include "engine/io/table.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "ops/conv.h"
#include "ops/matmul.h"
#include "tools/cli.h"
#include "tools/html_report.h"
#include "tools/bench_data.h"
#include "tools/bench_explain.h"
#include "tools/bench_models.h"
#include "tools/bench_scaling.h"
#include "tools/bench_stitch.h"
#include "tools/bench_tensorsim.h"
#include "tools/timing.h"

namespace adjoint {

namespace {

// How every measurement of this run is timed (--clock).
cli::TimingOptions timing;

double median_seconds(int64_t repeats, const std::function<void()>& run) {
  return cli::median_seconds(repeats, run, timing);
}

// One product as BLAS sees it: op(A) M×K times op(B) K×N.
struct GemmShape {
  bool trans_a, trans_b;
  int64_t M, N, K;
};

double total_flops(const std::vector<GemmShape>& shapes) {
  double f = 0;
  for (const GemmShape& s : shapes) f += 2.0 * double(s.M) * double(s.N) * double(s.K);
  return f;
}

// The raw reference: the products one after the other through cblas_sgemm, with OpenBLAS
// running its own threads at the engine's thread count.
double raw_sgemm_seconds(const std::vector<GemmShape>& shapes, int64_t repeats) {
  struct Operands {
    std::vector<float> a, b, c;
  };
  std::vector<Operands> operands;
  for (const GemmShape& s : shapes)
    operands.push_back({std::vector<float>(size_t(s.M * s.K), 0.01f), std::vector<float>(size_t(s.K * s.N), 0.02f),
                        std::vector<float>(size_t(s.M * s.N), 0.0f)});
  openblas_set_num_threads(num_threads());
  const double seconds = median_seconds(repeats, [&] {
    for (size_t i = 0; i < shapes.size(); ++i) {
      const GemmShape& s = shapes[i];
      cblas_sgemm(CblasRowMajor, s.trans_a ? CblasTrans : CblasNoTrans, s.trans_b ? CblasTrans : CblasNoTrans,
                  int(s.M), int(s.N), int(s.K), 1.0f, operands[i].a.data(), int(s.trans_a ? s.M : s.K),
                  operands[i].b.data(), int(s.trans_b ? s.K : s.N), 0.0f, operands[i].c.data(), int(s.N));
    }
  });
  openblas_set_num_threads(1);  // the engine's setting (engine/threads.h)
  // OpenBLAS's idle workers spin for a while after a threaded call; let them settle
  // before anything else is timed.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  return seconds;
}

struct Row {
  std::string op, name, pass;
  std::vector<std::pair<std::string, int64_t>> dims;  // the shape, for the JSON file
  double flops = 0, seconds = 0, sgemm_seconds = 0;
  double gflops() const { return flops / seconds / 1e9; }
  double sgemm_gflops() const { return flops / sgemm_seconds / 1e9; }
  double ratio() const { return sgemm_seconds / seconds; }  // ours relative to raw sgemm
};

// Forward (no graph) and forward+backward (gradients for every operand) of `f`.
void time_op(Row& fwd, Row& both, const std::vector<Tensor>& inputs,
             const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<GemmShape>& fwd_gemms,
             const std::vector<GemmShape>& bwd_gemms, int64_t repeats) {
  fwd.seconds = median_seconds(repeats, [&] {
    NoGrad no_grad;
    f(inputs);
  });
  std::vector<Tensor> leaves;
  for (const Tensor& t : inputs) leaves.push_back(t.detach().requires_grad_());
  Tensor u;
  both.seconds = median_seconds(repeats, [&] {
    Tensor y = f(leaves);
    if (!u.defined()) u = Tensor::ones(y.shape());
    grad(y, leaves, u);
  });
  std::vector<GemmShape> all = fwd_gemms;
  all.insert(all.end(), bwd_gemms.begin(), bwd_gemms.end());
  fwd.flops = total_flops(fwd_gemms);
  both.flops = total_flops(all);
  fwd.sgemm_seconds = raw_sgemm_seconds(fwd_gemms, repeats);
  both.sgemm_seconds = raw_sgemm_seconds(all, repeats);
}

void bench_matmul(int64_t M, int64_t K, int64_t N, int64_t repeats, std::vector<Row>& rows) {
  Generator gen(7);
  std::vector<Tensor> inputs = {uniform({M, K}, -1, 1, gen), uniform({K, N}, -1, 1, gen)};
  const std::string name = cat(M, "x", K, " * ", K, "x", N);
  const std::vector<std::pair<std::string, int64_t>> dims = {{"M", M}, {"K", K}, {"N", N}};
  Row fwd{"matmul", name, "fwd", dims}, both{"matmul", name, "fwd+bwd", dims};
  time_op(
      fwd, both, inputs, [](const std::vector<Tensor>& in) { return matmul(in[0], in[1]); },
      {{false, false, M, N, K}}, {{false, true, M, K, N}, {true, false, K, N, M}}, repeats);
  rows.push_back(fwd);
  rows.push_back(both);
}

// A C→O conv with a k×k kernel, stride `stride` and padding k / 2 over a batch of S×S images.
void bench_conv(int64_t C, int64_t O, int64_t S, int64_t k, int64_t stride, int64_t batch, int64_t repeats,
                std::vector<Row>& rows) {
  Generator gen(11);
  std::vector<Tensor> inputs = {uniform({batch, C, S, S}, -1, 1, gen), uniform({O, C, k, k}, -0.1f, 0.1f, gen),
                                uniform({O}, -0.1f, 0.1f, gen)};
  const Conv2dOptions options = Conv2dOptions::square(stride, k / 2);
  const int64_t out = conv_output_size(S, k, stride, k / 2, 1);
  const int64_t columns = batch * out * out, depth = C * k * k;
  const std::string name = cat(C, "->", O, " ", k, "x", k, stride > 1 ? cat(" s", stride) : "", " @", S, "x", S);
  const std::vector<std::pair<std::string, int64_t>> dims = {{"N", batch}, {"C", C}, {"O", O},       {"H", S},
                                                             {"W", S},     {"k", k}, {"pad", k / 2}, {"stride", stride}};
  Row fwd{"conv2d", name, "fwd", dims}, both{"conv2d", name, "fwd+bwd", dims};
  // Forward: W (O, C·k·k) · columns; input gradient: Wᵀ · dY; weight gradient: dY · columnsᵀ.
  time_op(
      fwd, both, inputs,
      [&](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], options); },
      {{false, false, O, columns, depth}}, {{true, false, depth, columns, O}, {false, true, O, depth, columns}},
      repeats);
  rows.push_back(fwd);
  rows.push_back(both);
}

void print_table(const std::vector<Row>& rows) {
  std::printf("%-8s %-26s %-8s %10s %9s %13s %7s\n", "op", "shape", "pass", "ms", "GFLOP/s", "sgemm GFLOP/s",
              "ratio");
  for (const Row& r : rows)
    std::printf("%-8s %-26s %-8s %10.2f %9.1f %13.1f %7.2f\n", r.op.c_str(), r.name.c_str(), r.pass.c_str(),
                r.seconds * 1e3, r.gflops(), r.sgemm_gflops(), r.ratio());
  std::fflush(stdout);
}

// JSON when the name ends in .json, CSV otherwise.
void write_results(const std::string& path, const std::vector<Row>& rows, int64_t batch, int64_t repeats) {
  std::ostringstream out;
  const bool json = path.size() >= 5 && path.substr(path.size() - 5) == ".json";
  if (json) {
    out << "{\"threads\": " << num_threads() << ", \"clock\": \"" << (timing.clock == cli::BenchClock::Cpu ? "cpu" : "wall") << "\", \"blas\": \""
        << blas_kernels() << "\", \"conv_gemm\": \"" << widest_gemm_kernels() << "\", \"batch\": " << batch
        << ", \"repeats\": " << repeats << ",\n \"results\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      out << "  {\"op\": \"" << r.op << "\", \"name\": \"" << r.name << "\", \"pass\": \"" << r.pass << "\"";
      for (const auto& [key, value] : r.dims) out << ", \"" << key << "\": " << value;
      out << ", \"ms\": " << r.seconds * 1e3 << ", \"gflops\": " << r.gflops() << ", \"sgemm_ms\": "
          << r.sgemm_seconds * 1e3 << ", \"sgemm_gflops\": " << r.sgemm_gflops() << ", \"ratio\": " << r.ratio()
          << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    out << " ]}\n";
  } else {
    Table table{{"op", "name", "pass", "threads", "ms", "gflops", "sgemm_ms", "sgemm_gflops", "ratio"}};
    for (const Row& r : rows)
      table.add_row({r.op, r.name, r.pass, std::to_string(num_threads()), csv_number(r.seconds * 1e3),
                     csv_number(r.gflops()), csv_number(r.sgemm_seconds * 1e3), csv_number(r.sgemm_gflops()),
                     csv_number(r.ratio())});
    out << table.csv();
  }
  write_file_atomic(path, out.str());
  std::printf("wrote %s\n", path.c_str());
}

// The benchmarks other than the ops', by their first argument.
struct NamedBenchmark {
  const char* name;
  int (*run)(const cli::Args&);
};
const NamedBenchmark kBenchmarks[] = {
    {"models", run_bench_models},
    {"explain", run_bench_explain},
    {"data", run_bench_data},
    {"tensorsim", run_bench_tensorsim},
    {"stitch", run_bench_stitch},
    {"scaling", run_bench_scaling},
};

// FILE.html beside the results written with --out FILE (tools/html_report.h).
void write_bench_report(const cli::Args& args, const std::string& benchmark) {
  if (args.has("out"))
    cli::write_html_report_for_file(args.text("out"), args,
                                    cli::file_report(args.text("out"), "adjoint bench " + benchmark + ": " + blas_kernels()));
}

int run_bench(const cli::Args& args) {
  if (!args.positionals().empty()) {
    std::string names;
    for (const NamedBenchmark& b : kBenchmarks) {
      if (args.positionals()[0] == b.name) {
        const int code = b.run(args);
        if (code == 0) write_bench_report(args, b.name);
        return code;
      }
      names += cat(b.name, ", ");
    }
    throw UsageError(cat("bench: unknown benchmark '", args.positionals()[0], "' (", names, "or none for the ops)"));
  }
  const bool quick = args.flag("quick");
  const std::string only = args.has("only") ? args.text("only") : "";
  if (!only.empty() && only != "conv" && only != "matmul")
    throw UsageError(cat("option --only expects conv or matmul, got '", only, "'"));
  const int64_t batch = args.has("batch") ? args.integer("batch") : quick ? 8 : 64;
  const int64_t repeats = args.has("repeats") ? args.integer("repeats") : quick ? 3 : 7;
  if (batch < 1) throw UsageError(cat("option --batch expects a count >= 1, got ", batch));
  if (repeats < 1) throw UsageError(cat("option --repeats expects a count >= 1, got ", repeats));
  const std::string out_path = args.has("out") ? args.text("out") : "";
  // A temporary beside the target, removed at once: an unwritable folder fails now, not after
  // the runs, and no empty results file is left where the runs might still fail.
  if (!out_path.empty()) AtomicFile probe(out_path, "bench");
  const std::string clock = args.text("clock");
  timing.clock = cli::bench_clock(clock, num_threads());

  std::printf("adjoint bench: %d threads, OpenBLAS kernels %s (convolutions: %s), median %s time of %lld runs\n",
              num_threads(), blas_kernels(), widest_gemm_kernels(), clock.c_str(), static_cast<long long>(repeats));
  std::printf("ratio = raw sgemm time of the same GEMMs / our time (1.00: no overhead)\n\n");
  std::vector<Row> rows;
  if (only.empty() || only == "matmul") {
    std::vector<std::vector<int64_t>> shapes = {{512, 512, 512}, {1024, 1024, 1024}, {16384, 256, 256}};
    if (!quick) shapes.insert(shapes.end(), {{2048, 2048, 2048}, {4096, 1024, 1024}, {65536, 64, 64}});
    for (const auto& s : shapes) bench_matmul(s[0], s[1], s[2], repeats, rows);
  }
  if (only.empty() || only == "conv") {
    for (int64_t k : {3, 1})
      for (const auto& [channels, size] : std::vector<std::pair<int64_t, int64_t>>{{64, 32}, {128, 16}, {256, 8}, {512, 4}})
        bench_conv(channels, channels, size, k, 1, batch, repeats, rows);
    // The narrow layers of the stitching benchmark's models (width 1/4 on 28×28), where
    // the direct kernels run: 3×3 at stride 1, and the strided 3×3 that halve the map.
    for (const auto& [channels, size] : std::vector<std::pair<int64_t, int64_t>>{{16, 28}, {32, 14}, {64, 7}, {128, 4}})
      bench_conv(channels, channels, size, 3, 1, batch, repeats, rows);
    for (const auto& [channels, size] : std::vector<std::pair<int64_t, int64_t>>{{16, 28}, {32, 14}, {64, 7}})
      bench_conv(channels, 2 * channels, size, 3, 2, batch, repeats, rows);
  }
  print_table(rows);
  if (!out_path.empty()) write_results(out_path, rows, batch, repeats);
  write_bench_report(args, "ops (matmul, conv2d)");
  return 0;
}

const cli::Registration bench_command({
    .name = "bench",
    .summary = "time matmul and conv2d beside the raw sgemm rate of the same GEMMs",
    .description =
        "Per shape: median time, GFLOP/s, the rate of cblas_sgemm on the equivalent GEMMs (the conv's\n"
        "folded over the whole batch, OpenBLAS threaded at --threads) and the ratio. Conv layers: 3x3\n"
        "(padding 1) and 1x1, C->C for 64@32x32, 128@16x16, 256@8x8, 512@4x4; the narrow layers of bench\n"
        "stitch's models: 3x3 C->C for 16@28x28, 32@14x14, 64@7x7, 128@4x4 and stride 2 C->2C for 16@28x28,\n"
        "32@14x14, 64@7x7. Compare with PyTorch:\n"
        "  adjoint bench --out ours.json && /usr/bin/python3 tools/bench_torch.py --ours ours.json\n"
        "adjoint bench models: training and inference samples/s of five models, their GFLOP/s as a share\n"
        "of a 2048^3 sgemm's rate at the same thread count, step memory (--only MODEL,..., --clock).\n"
        "adjoint bench explain: ms per image of gradient, soft pullback, pullback ascent (K=5), SmoothGrad(50)\n"
        "and IG(50) and the ratio to the gradient on ResNet-18, VGG-11-BN, ViT-Tiny (32x32x3, batch 16;\n"
        "--only resnet18,vgg11_bn,vit_tiny, --checkpoint FILE).\n"
        "adjoint bench tensorsim: tensor similarity's closed forms (d 1024, hidden 64) per pair, from the forms,\n"
        "with cached norms and over a run's pairs, and the recursion (a deep bilinear MLP) beside Monte Carlo to\n"
        "the same accuracy (--tolerance, --max-samples; --only closed: the closed forms alone, --clock). Beside numpy:\n"
        "  /usr/bin/python3 tools/bench_tensorsim_numpy.py --adjoint build/tools/adjoint --threads 1 --clock cpu\n"
        "adjoint bench stitch: ms per IRI step and per stitch-training step (slm) on two VGG-11-BN and two\n"
        "ResNet-18 at width 1/4 on 1x28x28, batch 128, median of 5 runs of 10 steps (--only, --block,\n"
        "--steps, --clock). Compare with PyTorch:\n"
        "  adjoint --threads N bench stitch --out ours.json && /usr/bin/python3 tools/bench_stitch_torch.py --threads N --ours ours.json\n"
        "adjoint bench data: ms per image the model waits for its images (Loader::next()) beside its forward\n"
        "pass, with the loader prefetching and not, and decoding alone (--data SPEC, e.g. imagenet:ROOT; --only\n"
        "ARCH, default resnet50; --batch, default 8; --steps).\n"
        "adjoint bench scaling: training samples/s and a stitch sweep's wall time over mpirun -n 1, 2, 4 (ranks x\n"
        "threads = cores, oversubscribed beyond the cores) against one process on every core; efficiency and the\n"
        "bytes each rank sends per training step (--steps, --quick; needs mpirun).",
    .arguments = "[models|explain|tensorsim|stitch|scaling|data]",
    .options = {{"quick", "", "a few seconds: batch 8, 3 runs, fewer matmul shapes", ""},
                {"only", "KIND", "conv or matmul (default: both); tensorsim: closed (the closed forms alone)", ""},
                {"batch", "N", "images per conv batch (8 with --quick)", "64"},
                {"repeats", "N", "timed runs per measurement (3 with --quick)", "7"},
                {"out", "FILE", "also write the results: JSON if FILE ends in .json, else CSV", ""},
                {"clock", "KIND", "wall, or cpu: process CPU time, steady on a busy machine (--threads 1 only)",
                 "wall"},
                {"size", "S", "explain: image side of the three default models (default 32; above 64 the ImageNet stem); models: the ImageNet models (ResNet-50, VGG-16-BN, ViT-B/16) at this size", ""},
                {"imagenet", "", "models: the ImageNet models at 224 pixels, batch 8, with the explanation workloads", ""},
                {"data", "SPEC", "data: the image data set to load (an ImageNet folder: imagenet:ROOT)", ""},
                {"workloads", "LIST", "models: among train, infer, gradient, soft_pullback, pullback_ascent, smoothgrad, integrated_gradients (default: train,infer; with --size/--imagenet all)", ""},
                {"samples", "N", "explain, models: SmoothGrad samples and integrated-gradients steps (default 50)", ""},
                {"max-batch", "N", "explain: rows per SmoothGrad/IG pass (default: ExplainOptions' 64)", ""},
                {"checkpoint", "FILE", "explain: also time this checkpoint's model (alone without --only)", ""},
                {"memory", "", "models: each workload's peak memory in a fresh process, as the PyTorch peer measures it", ""},
                {"memory-child", "MODEL", "models: (used by the benchmark itself) print one model's memory for one workload", ""},
                {"tolerance", "X", "tensorsim: Monte Carlo runs until its error is below X", "0.001"},
                {"max-samples", "N", "tensorsim: the most Monte-Carlo samples tried", "10000000"},
                {"lm-dim", "N", "tensorsim: the width of the bilinear-attention LM", "16"},
                {"block", "I", "stitch: the block after which both models are cut (default 3)", ""},
                {"steps", "N", "stitch: steps per timed run of each loop (default 10, 2 with --quick); scaling: training and stitch steps (default 16, 6 with --quick)", ""}},
    .run = run_bench,
});

}  // namespace

}  // namespace adjoint
