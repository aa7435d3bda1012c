// `adjoint bench scaling`: how the work of one machine divides over mpirun's ranks.
//
// The cores are shared out: K ranks (K = 1, 2, 4, 8) of `--threads` C/K each (at least 1),
// against one process of `--threads` C, C the machine's cores. Where K exceeds C the ranks
// are oversubscribed (more processes than cores), and the table says so. Two workloads:
//
//   train  `adjoint train` of a ResNet-18 of width 1/4 on Fashion-MNIST-shaped images
//          (written to a temporary folder: noise with the label as a bright square), batch
//          64 in 8 shards; samples per second over the training steps (log.json), so
//          mpirun's start-up is left out. The weights are the same bits in every layout.
//   stitch `adjoint stitch` of that trained model into itself at 2 stitch points × 4
//          objectives (8 cells, standard protocol); the wall time of the whole command,
//          start-up and loading included, as a user waits for it.
//
// Efficiency is the one process's time over the layout's (1: the ranks lose nothing to
// communication or to each other). Per training step each rank exchanges the P gradients
// and B BatchNorm statistics (float32) by the reduce-scatter and all-gather along the shard
// tree (engine/distributed/gradient_buckets.h); the table after the timings gives, for every rank of
// every K, the bytes it sent, its receive buffers and its additions in the last step (from
// log.json, counted as the exchange ran) beside the formulas. On one machine these are
// counts, not times.
#include "tools/bench_scaling.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "engine/data/idx.h"
#include "engine/error.h"
#include "engine/distributed/gradient_buckets.h"
#include "engine/io/files.h"
#include "engine/io/json.h"
#include "engine/io/table.h"
#include "models/checkpoint.h"
#include "models/model.h"

namespace adjoint {

namespace fs = std::filesystem;

namespace {

constexpr int64_t kBatch = 64, kShards = 8;

// One way to spend the machine's cores: `ranks` processes under mpirun (0: one process
// without mpirun) of `threads` threads each.
struct Layout {
  int ranks;
  int threads;
  std::string name() const { return ranks == 0 ? "1 process" : cat("mpirun -n ", ranks); }
};

struct Measured {
  Layout layout;
  bool oversubscribed;
  double train_samples_per_second, stitch_seconds;
};

// The command line that starts `adjoint ARGS` in `layout`.
std::string command_line(const Layout& layout, const std::string& args) {
  const std::string self = fs::read_symlink("/proc/self/exe").string();
  std::string launch;
  if (layout.ranks > 0)
    launch = cat("mpirun ", geteuid() == 0 ? "--allow-run-as-root " : "", "--oversubscribe --mca btl self,vader -n ",
                 layout.ranks, " ");
  return cat(launch, self, " --threads ", layout.threads, " ", args);
}

// Runs `adjoint ARGS` in `layout` (its output to `log`); its wall time in seconds.
double run_timed(const Layout& layout, const std::string& args, const std::string& log) {
  const std::string command = command_line(layout, args) + " > " + log + " 2>&1";
  const auto start = std::chrono::steady_clock::now();
  const int status = std::system(command.c_str());
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check(status == 0, "bench scaling: `", command, "` failed; its output is in ", log);
  return seconds;
}

// 1024 training and 64 test images of 1×28×28 in Fashion-MNIST's files: noise, and a
// bright 4×4 square whose position is the label.
std::string write_images(const std::string& dir) {
  fs::create_directories(dir);
  auto write_split = [&](const std::string& prefix, uint32_t n) {
    std::vector<uint8_t> pixels(size_t(n) * 784), labels(n);
    for (uint32_t i = 0; i < n; ++i) {
      labels[i] = uint8_t(i % 10);
      for (uint32_t p = 0; p < 784; ++p) {
        const uint32_t row = p / 28, col = p % 28;
        const bool square = row / 7 == labels[i] / 4 && col / 7 == labels[i] % 4 && row % 7 < 4 && col % 7 < 4;
        pixels[size_t(i) * 784 + p] = square ? 230 : uint8_t((i * 2654435761u + p * 40503u) >> 26);
      }
    }
    write_idx(dir + "/" + prefix + "-images-idx3-ubyte", IdxArray{{n, 28, 28}, pixels});
    write_idx(dir + "/" + prefix + "-labels-idx1-ubyte", IdxArray{{n}, labels});
  };
  write_split("train", 1024);
  write_split("t10k", 64);
  return "fashion-mnist:" + dir;
}

// Samples per second over the training steps of a run (the last epoch record of log.json).
double samples_per_second(const std::string& run) {
  const Json log = parse_json(read_text_file(run + "/log.json"));
  check(log.size() > 0, "bench scaling: ", run, "/log.json has no epoch record");
  return log.as_array().back().find("samples_per_second")->as_number();
}

}  // namespace

int run_bench_scaling(const cli::Args& args) {
  if (args.positionals().size() > 1) throw UsageError("bench scaling takes no further arguments");
  if (args.text("clock") != "wall")
    throw UsageError(cat("bench scaling: --clock ", args.text("clock"),
                         ": the ranks are other processes, timed by the wall clock alone; use --clock wall"));
  const bool quick = args.flag("quick");
  const int64_t steps = args.has("steps") ? args.integer("steps") : quick ? 6 : 16;
  if (steps < 1) throw UsageError(cat("bench scaling: --steps expects a count >= 1, got ", steps));
  check(std::system("command -v mpirun > /dev/null 2>&1") == 0,
        "bench scaling: no mpirun on PATH (install openmpi-bin, and libopenmpi-dev to build with MPI)");
  const int cores = std::max(1, int(std::thread::hardware_concurrency()));

  const std::string work = (fs::temp_directory_path() / cat("adjoint-bench-scaling-", getpid())).string();
  fs::create_directories(work);
  const std::string data = write_images(work + "/data");
  const std::string train_args = cat("train --model resnet18 --width 0.25 --data ", data, " --batch ", kBatch, " --shards ",
                                     kShards, " --epochs 1 --max-steps ", steps,
                                     " --schedule constant --lr 0.05 --seed 1 --no-augment --overwrite --out ");
  // The model the sweep stitches into itself: the one process's run, made first.
  const Layout one_process{0, cores};
  std::vector<Layout> layouts = {one_process};
  for (int ranks : {1, 2, 4, 8}) layouts.push_back({ranks, std::max(1, cores / ranks)});

  std::printf("adjoint bench scaling: %d cores; ResNet-18 width 1/4 on 1x28x28, batch %lld in %lld shards, %lld steps; "
              "stitch sweep of 8 cells (2 points x 4 objectives); ranks x threads = cores, oversubscribed where ranks > "
              "cores\n",
              cores, (long long)kBatch, (long long)kShards, (long long)steps);
  std::printf("%-12s %7s %14s %14s %11s %12s %10s\n", "layout", "threads", "oversubscribed", "train samples/s",
              "efficiency", "stitch wall s", "efficiency");
  std::vector<Measured> rows;
  std::string model;
  for (const Layout& layout : layouts) {
    const std::string run = cat(work, "/train-", layout.ranks);
    run_timed(layout, train_args + run, work + "/train.log");
    if (model.empty()) model = run + "/checkpoint.safetensors";
    const std::string sweep = cat("stitch --front ", model, " --end ", model,
                                  " --pairs 3:3,5:5 --objectives hlm,slm,dm,fula --protocol standard --train-images 256 "
                                  "--test-images 64 --steps ", steps, " --batch 64 --out ", work, "/stitch-", layout.ranks);
    const double stitch_seconds = run_timed(layout, sweep, work + "/stitch.log");
    rows.push_back({layout, layout.ranks > cores, samples_per_second(run), stitch_seconds});
    const Measured& m = rows.back();
    const Measured& base = rows.front();
    std::printf("%-12s %7d %14s %15.1f %11.2f %12.2f %10.2f\n", layout.name().c_str(), layout.threads,
                m.oversubscribed ? "yes" : "no", m.train_samples_per_second,
                m.train_samples_per_second / base.train_samples_per_second, m.stitch_seconds,
                base.stitch_seconds / m.stitch_seconds);
    std::fflush(stdout);
  }

  // What one step's exchange cost each rank, as counted (log.json) and by the formulas.
  const Checkpoint checkpoint = load_checkpoint(model);
  int64_t parameters = 0, everything = 0;
  for (const Tensor& p : model_from_checkpoint(checkpoint)->parameters()) parameters += p.numel();
  for (const auto& [name, t] : checkpoint.model) everything += t.numel();
  std::printf("per training step and rank: %lld parameters + %lld statistics = G = %.2f MB in one bucket; reduce-scatter "
              "and all-gather along the tree of %lld shards (counted | formula)\n",
              (long long)parameters, (long long)(everything - parameters), 4.0 * double(everything) / 1e6,
              (long long)kShards);
  std::printf("%3s %5s %25s %25s %25s\n", "K", "rank", "bytes sent", "receive bytes", "additions");
  Json exchange = Json::array();
  for (const Layout& layout : layouts) {
    if (layout.ranks == 0) continue;
    const Json log = parse_json(read_text_file(cat(work, "/train-", layout.ranks, "/log.json")));
    const Json* per_rank = log.as_array().back().find("exchange_per_rank");
    check(per_rank != nullptr && per_rank->as_array().size() == size_t(layout.ranks), "bench scaling: train-",
          layout.ranks, "/log.json has no exchange counts for its ", layout.ranks, " ranks");
    for (int r = 0; r < layout.ranks; ++r) {
      const Json& c = per_rank->as_array()[size_t(r)];
      const ExchangeCounts formula = exchange_formula(kShards, layout.ranks, r, everything);
      const ExchangeCounts counted{int64_t(c.find("bytes_sent")->as_number()),
                                   int64_t(c.find("receive_bytes")->as_number()),
                                   int64_t(c.find("additions")->as_number())};
      auto pair = [](int64_t a, int64_t b) { return cat(a, " | ", b); };
      std::printf("%3d %5d %25s %25s %25s\n", layout.ranks, r, pair(counted.bytes_sent, formula.bytes_sent).c_str(),
                  pair(counted.receive_bytes, formula.receive_bytes).c_str(),
                  pair(counted.additions, formula.additions).c_str());
      exchange.push_back(Json(Json::Object{{"ranks", layout.ranks},
                                           {"rank", r},
                                           {"bytes_sent", counted.bytes_sent},
                                           {"receive_bytes", counted.receive_bytes},
                                           {"additions", counted.additions},
                                           {"formula_bytes_sent", formula.bytes_sent},
                                           {"formula_receive_bytes", formula.receive_bytes},
                                           {"formula_additions", formula.additions}}));
    }
  }
  std::printf("the shard-ordered all-gather this replaced: (K - 1) x %.2f MB sent, K x %.2f MB received, (K - 1) x %lld "
              "additions per rank\n",
              4.0 * double(everything) / 1e6, 4.0 * double(everything) / 1e6, (long long)everything);
  std::fflush(stdout);

  if (args.has("out")) {
    const std::string out = args.text("out");
    if (out.size() >= 5 && out.compare(out.size() - 5, 5, ".json") == 0) {
      Json results = Json::array();
      for (const Measured& m : rows)
        results.push_back(Json(Json::Object{{"layout", m.layout.name()},
                                            {"ranks", m.layout.ranks},
                                            {"threads", m.layout.threads},
                                            {"oversubscribed", m.oversubscribed},
                                            {"train_samples_per_second", m.train_samples_per_second},
                                            {"stitch_seconds", m.stitch_seconds}}));
      write_file_atomic(out, to_json(Json(Json::Object{{"cores", cores},
                                                        {"batch", kBatch},
                                                        {"shards", kShards},
                                                        {"steps", steps},
                                                        {"parameters", parameters},
                                                        {"statistics", everything - parameters},
                                                        {"exchange", exchange},
                                                        {"results", results}}),
                                     2) + "\n");
    } else {
      Table table{{"layout", "ranks", "threads", "oversubscribed", "train_samples_per_second", "stitch_seconds"}};
      for (const Measured& m : rows)
        table.add_row({m.layout.name(), cat(m.layout.ranks), cat(m.layout.threads), m.oversubscribed ? "1" : "0",
                       fixed(m.train_samples_per_second, 2), fixed(m.stitch_seconds, 3)});
      write_file_atomic(out, table.csv());
    }
    std::printf("wrote %s\n", out.c_str());
  }
  fs::remove_all(work);
  return 0;
}

}  // namespace adjoint
