// The tensor-similarity paper (docs/methods.md §3.5): bilinear networks compared through their
// weights alone. Grokking (similarity to the final model against validation accuracy over
// steps), a backdoor (the target class's slice against a control branch), forgetting (the
// removed class's slice against a control, and after re-adding it) and a language model's
// checkpoint matrix (its blocks are the phases of training). The parts are those of
// analysis/experiments/{grokking,backdoor,forgetting,language}.sh (forgetting.sh with
// MODEL_OPTS="--dim 128 --hidden 256" WEIGHT_DECAY=0.5).
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "analysis/common/figure.h"
#include "engine/data/open.h"
#include "engine/error.h"
#include "tools/reproduce/paper.h"

namespace adjoint::reproduce {
namespace {

constexpr int kBackdoorTarget = 0;
constexpr int kRemovedClass = 3;
constexpr int kClasses = 10;

// "class 3 (dress)": the index the CSVs use, and the name a reader knows.
std::string class_label(int c) { return cat("class ", c, " (", class_name(class_names_of("fashion-mnist"), c), ")"); }

// The sizes that differ between the scales.
struct Sizes {
  int modulus, grok_epochs, grok_every;  // grokking: modadd:P, epochs (7 steps each at P = 113), a checkpoint every N steps
  const char* grok_lr;
  const char* grok_weight_decay;
  int clean_steps, branch_steps;         // backdoor: clean stage, then the branches up to this step
  int stage_steps;                       // forgetting: steps per stage
  int count;                             // test examples for the baselines
  int lm_steps, lm_checkpoints;          // language model: at most this many steps, log-spaced checkpoints
};
Sizes sizes(Scale scale) {
  // Quick: half the steps with a stronger push (lr 3e-3, weight decay 1) in place of the
  // published 1e-3 and 0.3, long enough for validation accuracy to pass 99% (28k steps);
  // smaller moduli leave too few training pairs for a batch of 512.
  // The language model: one epoch of the fortunes is 2157 steps; quick stops at 600, past
  // the fall of the loss where the first phase ends.
  if (scale == Scale::Quick) return {113, 4000, 1500, "3e-3", "1.0", 1500, 2500, 1000, 1000, 600, 7};
  return {113, 8000, 1000, "1e-3", "0.3", 4690, 7035, 2000, 2000, 3000, 10};
}

// A bilinear MLP on Fashion-MNIST. The backdoor runs the small model (784 → 64 → 10, weight
// decay 0.05); forgetting runs the paper's (an embedding of 128, hidden 256) with weight decay
// 0.5, under which the removed class's slice falls nearly as far as the paper's (the study in
// analysis/results/tensor_similarity.md, "Why the effects are weaker here").
struct BilinearSize {
  const char* dim;
  const char* hidden;
  const char* weight_decay;
};
constexpr BilinearSize kBackdoorModel{"0", "64", "0.05"}, kForgettingModel{"128", "256", "0.5"};

std::vector<std::string> bilinear_fmnist(const BilinearSize& size, int seed) {
  return {"train", "--model", "bilinear_mlp", "--dim", size.dim, "--hidden", size.hidden, "--optimizer", "adamw",
          "--lr", "1e-3", "--weight-decay", size.weight_decay, "--schedule", "constant", "--batch", "128",
          "--no-augment", "--epochs", "1000", "--seed", cat(seed)};
}

std::vector<std::string> plus(std::vector<std::string> words, const std::vector<std::string>& more) {
  words.insert(words.end(), more.begin(), more.end());
  return words;
}

std::vector<Part> parts(Scale scale, int seeds) {
  const Sizes z = sizes(scale);
  // Expected seconds per kind of part (ETA weights): quick as measured here, full estimated.
  const bool quick = scale == Scale::Quick;
  const double grok_seconds = quick ? 290 : 600, run_similarity_seconds = quick ? 2 : 60, train_seconds = quick ? 4 : 12,
               pair_similarity_seconds = quick ? 1 : 2, lm_train_seconds = quick ? 5 : 15,
               lm_similarity_seconds = quick ? 120 : 250;
  std::vector<Part> out;
  for (int s = 0; s < seeds; ++s) {
    const std::string S = cat("_s", s);
    auto at = [&](const std::string& name) { return cat("{parts}/", name, S, "/checkpoint.safetensors"); };
    // Language, first, so that a machine without Debian's fortunes package is told at once: a
    // 2-block bilinear-attention transformer on the fortunes, byte-level,
    // small enough for the attention term of the recursion (its cost grows with the sixth
    // power of the head width); its checkpoints compared pairwise over 4 positions, with
    // Gaussian inputs of the one-hot tokens' norm (1/16 for 256 byte values).
    out.push_back({"lm" + S,
                   {"train", "--model", "bilinear_lm", "--attention", "bilinear", "--dim", "16", "--depth", "2", "--heads",
                    "2", "--mlp-ratio", "2", "--residual-scale", "0.5", "--data", "fortunes:16", "--optimizer", "adamw",
                    "--lr", "3e-3", "--weight-decay", "0.05", "--batch", "64", "--epochs", "1", "--max-steps",
                    cat(z.lm_steps), "--schedule", "cosine", "--warmup", "100", "--keep-checkpoints",
                    cat("log:", z.lm_checkpoints), "--eval-limit", "2000", "--seed", cat(s), "--out", "{out}"},
                   lm_train_seconds});
    out.push_back({"lm_similarity" + S,
                   {"tensorsim", "--run", cat("{parts}/lm", S), "--positions", "4", "--input-std", "0.0625", "--count",
                    "2000", "--out", "{out}"},
                   lm_similarity_seconds});
    // Grokking.
    out.push_back({"grok" + S,
                   {"train", "--model", "bilinear_mlp", "--hidden", "64", "--data", cat("modadd:", z.modulus),
                    "--optimizer", "adamw", "--lr", z.grok_lr, "--weight-decay", z.grok_weight_decay, "--batch", "512", "--epochs",
                    cat(z.grok_epochs), "--schedule", "constant", "--keep-checkpoints", cat("every:", z.grok_every),
                    "--seed", cat(s), "--out", "{out}"},
                   grok_seconds});
    out.push_back({"grok_similarity" + S, {"tensorsim", "--run", cat("{parts}/grok", S), "--count", "0", "--out", "{out}"},
                   run_similarity_seconds});
    // Backdoor: a clean stage, then poisoned and control branches on the same batches.
    out.push_back({"backdoor_clean" + S,
                   plus(bilinear_fmnist(kBackdoorModel, s), {"--data", "fashion-mnist", "--max-steps", cat(z.clean_steps), "--out", "{out}"}),
                   train_seconds});
    for (const char* branch : {"poison", "control"}) {
      const std::string data = std::string(branch) == "poison" ? cat("fashion-mnist+backdoor:0.1:", kBackdoorTarget)
                                                               : "fashion-mnist";
      out.push_back({cat("backdoor_", branch, S),
                     plus(bilinear_fmnist(kBackdoorModel, s), {"--data", data, "--max-steps", cat(z.branch_steps), "--continue-from",
                                               at("backdoor_clean"), "--out", "{out}"}),
                     train_seconds});
      out.push_back({cat("backdoor_", branch, "_similarity", S),
                     {"tensorsim", at("backdoor_clean"), cat("{parts}/backdoor_", branch, S, "/checkpoint.safetensors"),
                      "--slices", "--data", "fashion-mnist", "--count", cat(z.count), "--out", "{out}"},
                     pair_similarity_seconds});
    }
    // Forgetting: classes 0–4, all, all but one (or all: control), all again.
    std::string without;
    for (int c = 0; c < kClasses; ++c)
      if (c != kRemovedClass) without += cat(without.empty() ? "" : ",", c);
    struct Stage {
      const char* name;
      std::string data;
      int stages;        // cumulative steps, in stages
      const char* from;  // the stage it continues, or none
    };
    const Stage stages[] = {{"forget_stage1", "fashion-mnist+classes:0-4", 1, nullptr},
                            {"forget_stage2", "fashion-mnist", 2, "forget_stage1"},
                            {"forget_removed", cat("fashion-mnist+classes:", without), 3, "forget_stage2"},
                            {"forget_control", "fashion-mnist", 3, "forget_stage2"},
                            {"forget_readded", "fashion-mnist", 4, "forget_removed"}};
    for (const Stage& st : stages) {
      std::vector<std::string> words =
          plus(bilinear_fmnist(kForgettingModel, s), {"--data", st.data, "--max-steps", cat(st.stages * z.stage_steps), "--out", "{out}"});
      if (st.from) words = plus(words, {"--continue-from", at(st.from)});
      out.push_back({st.name + S, words, train_seconds});
    }
    for (const char* later : {"forget_removed", "forget_control", "forget_readded"})
      out.push_back({cat(later, "_similarity", S),
                     {"tensorsim", at("forget_stage2"), at(later), "--slices", "--data", "fashion-mnist", "--count",
                      cat(z.count), "--out", "{out}"},
                     pair_similarity_seconds});
  }
  return out;
}

// One measure ("slice_3", "tensor_similarity") of a tensorsim part's tensorsim.csv.
double measure(const std::string& parts_dir, const std::string& part, int seed, const std::string& name) {
  return read_csv(cat(parts_dir, "/", part, "_s", seed, "/tensorsim.csv")).number("value", {{"measure", name}});
}

// The grokking run's columns over steps: step, validation accuracy, similarity to the last checkpoint.
struct GrokCurve {
  std::vector<double> step, accuracy, similarity;
};
GrokCurve grok_curve(const std::string& parts_dir, int seed) {
  const CsvRows t = read_csv(cat(parts_dir, "/grok_similarity_s", seed, "/run_similarity.csv"));
  const size_t step = t.column("step"), acc = t.column("test_accuracy"), sim = t.column("tensor_similarity_to_last");
  GrokCurve c;
  for (const auto& row : t.rows) {
    c.step.push_back(std::atof(row[step].c_str()));
    c.accuracy.push_back(std::atof(row[acc].c_str()));
    c.similarity.push_back(std::atof(row[sim].c_str()));
  }
  return c;
}

// The index of the first checkpoint whose validation accuracy reaches `level`; an Error when none does.
size_t first_reaching(const GrokCurve& c, double level, const std::string& parts_dir, int seed) {
  for (size_t i = 0; i < c.accuracy.size(); ++i)
    if (c.accuracy[i] >= level) return i;
  throw Error(cat(parts_dir, "/grok_similarity_s", seed, ": validation accuracy never reaches ", level));
}

// Per class: the slice drop the poison (or the removal) adds to the control's drift.
double slice_drop(const std::string& parts_dir, int seed, const std::string& treated, const std::string& control,
                  int cls) {
  const std::string slice = cat("slice_", cls);
  return measure(parts_dir, control, seed, slice) - measure(parts_dir, treated, seed, slice);
}

// A language model's checkpoint-by-checkpoint similarity matrix (tensorsim --run), in step order.
struct CheckpointMatrix {
  std::vector<std::string> steps;
  std::vector<std::vector<double>> similarity;
};
CheckpointMatrix checkpoint_matrix(const std::string& parts_dir, int seed) {
  const CsvRows t = read_csv(cat(parts_dir, "/lm_similarity_s", seed, "/pairwise_similarity.csv"));
  CheckpointMatrix m;
  for (const auto& row : t.rows) {
    if (row.size() != t.header.size() || row.size() != t.rows.size() + 1)
      throw Error(cat(t.path, ": not a square matrix of checkpoints"));
    m.steps.push_back(row[0]);
    std::vector<double> values;
    for (size_t j = 1; j < row.size(); ++j) values.push_back(std::atof(row[j].c_str()));
    m.similarity.push_back(values);
  }
  if (m.steps.size() < 4) throw Error(cat(t.path, ": ", m.steps.size(), " checkpoints, too few for two blocks"));
  return m;
}

// The largest standard error in the checkpoint matrix: 0 when every pair was exact (tensorsim
// writes pairwise_similarity_se.csv only for sampled pairs). The matrix itself must be there, and
// the errors' table of its shape: a part that never ran is not measured, not exact.
double largest_standard_error(const std::string& parts_dir, int seed) {
  const CsvRows matrix = read_csv(cat(parts_dir, "/lm_similarity_s", seed, "/pairwise_similarity.csv"));
  const std::string path = cat(parts_dir, "/lm_similarity_s", seed, "/pairwise_similarity_se.csv");
  if (!std::filesystem::exists(path)) return 0.0;
  const CsvRows t = read_csv(path);
  if (t.header != matrix.header || t.rows.size() != matrix.rows.size())
    throw Error(cat(t.path, ": not the shape of ", matrix.path));
  double largest = 0;
  for (const auto& row : t.rows)
    for (size_t j = 1; j < row.size(); ++j) largest = std::max(largest, std::atof(row[j].c_str()));
  return largest;
}

// Block structure in one number: over every cut of the checkpoints (in step order) into an
// earlier and a later block of at least two each, the largest gap between the mean
// similarity of two checkpoints in the same block and that of two in different blocks.
// A run that drifts at an even pace has no cut with a large gap; one with phases does.
double block_contrast(const CheckpointMatrix& m) {
  const size_t n = m.steps.size();
  double best = -INFINITY;
  for (size_t cut = 2; cut + 2 <= n; ++cut) {
    double within = 0, across = 0;
    int64_t within_pairs = 0, across_pairs = 0;
    for (size_t i = 0; i < n; ++i)
      for (size_t j = i + 1; j < n; ++j) {
        if ((i < cut) == (j < cut)) within += m.similarity[i][j], ++within_pairs;
        else across += m.similarity[i][j], ++across_pairs;
      }
    best = std::max(best, within / double(within_pairs) - across / double(across_pairs));
  }
  return best;
}

std::vector<Claim> claims() {
  Claim grokked;
  grokked.text = "A bilinear MLP groks modular addition (validation accuracy reaches 99%)";
  grokked.paper_figure = "grokking: validation accuracy rises to ~100% long after training accuracy";
  grokked.ours = "highest validation accuracy over the kept checkpoints";
  grokked.sources = {"grok_similarity_s{seed}"};
  grokked.value = [](const std::string& dir, int seed) {
    const GrokCurve c = grok_curve(dir, seed);
    return *std::max_element(c.accuracy.begin(), c.accuracy.end());
  };
  grokked.bound = {Bound::AtLeast, 0.99};

  Claim keeps_changing;
  keeps_changing.text = "The weights keep moving after validation accuracy saturates";
  keeps_changing.paper_figure = "similarity to the final model still rising when validation accuracy is ~100%";
  keeps_changing.ours = "similarity to the last checkpoint at the first one with validation accuracy ≥ 99%";
  keeps_changing.sources = {"grok_similarity_s{seed}"};
  keeps_changing.value = [](const std::string& dir, int seed) {
    const GrokCurve c = grok_curve(dir, seed);
    return c.similarity[first_reaching(c, 0.99, dir, seed)];
  };
  keeps_changing.bound = {Bound::AtMost, 0.99};

  Claim backdoor;
  backdoor.text = "From the weights alone, the backdoor's target class stands out";
  backdoor.paper_figure = "the target class's slice drops most against the clean model";
  backdoor.ours = cat("drop (control − poison) of ", class_label(kBackdoorTarget), "'s slice minus the largest other class's drop");
  backdoor.sources = {"backdoor_poison_similarity_s{seed}", "backdoor_control_similarity_s{seed}"};
  backdoor.value = [](const std::string& dir, int seed) {
    double largest_other = -INFINITY;
    for (int c = 0; c < kClasses; ++c)
      if (c != kBackdoorTarget)
        largest_other = std::max(largest_other, slice_drop(dir, seed, "backdoor_poison_similarity",
                                                           "backdoor_control_similarity", c));
    return slice_drop(dir, seed, "backdoor_poison_similarity", "backdoor_control_similarity", kBackdoorTarget) -
           largest_other;
  };
  backdoor.bound = {Bound::AtLeast, 0.0};

  Claim forgotten;
  forgotten.text = "A removed class's slice falls against a control that keeps it";
  forgotten.paper_figure = "forgetting: the removed class's slice similarity drops, the others stay";
  forgotten.ours = cat(class_label(kRemovedClass), "'s slice: control − removed, both against the weights before removal");
  forgotten.sources = {"forget_removed_similarity_s{seed}", "forget_control_similarity_s{seed}"};
  forgotten.value = [](const std::string& dir, int seed) {
    return slice_drop(dir, seed, "forget_removed_similarity", "forget_control_similarity", kRemovedClass);
  };
  forgotten.bound = {Bound::AtLeast, 0.1};

  Claim readded;
  readded.text = "Re-adding the class brings its slice back towards the weights before removal";
  readded.paper_figure = "after re-adding, the removed class's slice similarity rises again";
  readded.ours = cat(class_label(kRemovedClass), "'s slice: re-added − removed, both against the weights before removal");
  readded.sources = {"forget_readded_similarity_s{seed}", "forget_removed_similarity_s{seed}"};
  readded.value = [](const std::string& dir, int seed) {
    const std::string slice = cat("slice_", kRemovedClass);
    return measure(dir, "forget_readded_similarity", seed, slice) - measure(dir, "forget_removed_similarity", seed, slice);
  };
  readded.bound = {Bound::AtLeast, 0.0};

  Claim phases;
  phases.text = "A language model's checkpoint similarity matrix has block structure: the phases of training";
  phases.paper_figure = "checkpoint × checkpoint similarity of a 2-layer bilinear transformer shows blocks";
  phases.ours = "over cuts into an earlier and a later block: largest (mean similarity within a block − across the blocks)";
  phases.sources = {"lm_similarity_s{seed}"};
  phases.value = [](const std::string& dir, int seed) { return block_contrast(checkpoint_matrix(dir, seed)); };
  phases.bound = {Bound::AtLeast, 0.5};
  Claim phases_bar;
  phases_bar.text = "Every entry of the language model's checkpoint matrix is exact or carries a standard error of 0.005 or less";
  phases_bar.paper_figure = "the paper's matrix is the Gaussian-closure recursion, without error bars";
  phases_bar.ours = "largest standard error in the matrix (tensorsim's Monte Carlo estimate where no exact route applies)";
  phases_bar.sources = {"lm_similarity_s{seed}"};
  phases_bar.value = largest_standard_error;
  phases_bar.bound = {Bound::AtMost, 0.005};
  return {grokked, keeps_changing, backdoor, forgotten, readded, phases, phases_bar};
}

std::vector<std::string> draw(const std::string& parts_dir, int seeds, const std::string& figures_dir) {
  std::vector<std::string> stems;
  // Grokking: similarity to the final model and validation accuracy over steps, per seed.
  LineChart chart;
  chart.title = "Grokking, bilinear MLP on modular addition: tensor similarity to the final model and validation accuracy";
  chart.x_label = "training step";
  chart.y_label = "similarity to the last checkpoint / validation accuracy";
  chart.y_min = 0;
  chart.y_max = 1;
  int colour = 0;
  for (int s = 0; s < seeds; ++s) {
    try {
      const GrokCurve c = grok_curve(parts_dir, s);
      if (chart.x.empty()) chart.x = c.step;
      if (c.step != chart.x) continue;  // another run length: not on the same axis
      chart.series.push_back({cat("similarity, seed ", s), c.similarity, kSeriesColours[colour++ % 8]});
      chart.series.push_back({cat("validation accuracy, seed ", s), c.accuracy, kSeriesColours[colour++ % 8]});
    } catch (const Error&) {
    }
  }
  if (!chart.series.empty()) {
    stems.push_back(figures_dir + "/grokking");
    Figure(chart).write(stems.back());
  }
  // Slices per class for each comparison (seed 0): where the backdoor and the removal show.
  struct Row {
    const char* part;
    const char* label;
  };
  const Row rows[] = {{"backdoor_poison_similarity", "poisoned vs clean stage"},
                      {"backdoor_control_similarity", "control vs clean stage"},
                      {"forget_removed_similarity", "class removed vs before"},
                      {"forget_control_similarity", "control vs before"},
                      {"forget_readded_similarity", "re-added vs before"}};
  HeatMap map;
  map.title = "Per-class slice similarity of bilinear MLPs on Fashion-MNIST (seed 0): backdoor and forgetting";
  map.x_label = "class";
  map.y_label = "comparison";
  map.rows = int64_t(std::size(rows));
  map.cols = kClasses;
  for (const Row& r : rows) {
    map.row_labels.push_back(r.label);
    for (int c = 0; c < kClasses; ++c) {
      double v = NAN;
      try {
        v = measure(parts_dir, r.part, 0, cat("slice_", c));
      } catch (const Error&) {
      }
      map.values.push_back(v);
    }
  }
  map.col_labels = class_names_of("fashion-mnist");
  std::tie(map.lo, map.hi) = data_range(map.values);
  map.range_note = "scale from the data";
  map.print_values = true;
  stems.push_back(figures_dir + "/slices");
  Figure(map).write(stems.back());

  // The language model's checkpoint matrix (seed 0).
  try {
    const CheckpointMatrix m = checkpoint_matrix(parts_dir, 0);
    HeatMap lm;
    lm.title = cat("Bilinear-attention transformer on fortunes (seed 0): tensor similarity between checkpoints (standard error ≤ ",
                   largest_standard_error(parts_dir, 0), ")");
    lm.x_label = "checkpoint (training step)";
    lm.y_label = "checkpoint (training step)";
    lm.rows = lm.cols = int64_t(m.steps.size());
    for (const auto& row : m.similarity) lm.values.insert(lm.values.end(), row.begin(), row.end());
    lm.row_labels = lm.col_labels = m.steps;
    std::tie(lm.lo, lm.hi) = data_range(lm.values);
    lm.range_note = "scale from the data";
    lm.print_values = true;
    stems.push_back(figures_dir + "/language_checkpoints");
    Figure(lm).write(stems.back());
  } catch (const Error&) {
  }
  return stems;
}

}  // namespace

Paper tensor_similarity_paper() {
  Paper p;
  p.name = "tensor-similarity";
  p.title = "Tensor similarity of bilinear networks: grokking, a backdoor, forgetting and a language model's phases, from the weights";
  p.claims = claims();
  p.parts = parts;
  p.draw = draw;
  p.default_seeds[0] = 1;
  p.default_seeds[1] = 3;
  p.quick_time = "6m19s measured here at commit 5969e86 (1 seed, 1 thread, another job on the 2-core machine: the "
                 "grokking run ~4 min to 99.6% validation accuracy, the language model's 7 checkpoints compared pairwise "
                 "~1.5 min, 10 Fashion-MNIST runs of a few seconds)";
  p.full_time = "45m09s measured here at commit 6bd7c71 (3 seeds, 1 thread, two other jobs on the 2-core machine: "
                "grokking at the published lr 1e-3 and weight decay 0.3 for 56k steps, 8–9 min a seed, the language "
                "model's 10 checkpoints compared pairwise, 5–6 min a seed, and the Fashion-MNIST runs of up to 8k steps)";
  return p;
}

}  // namespace adjoint::reproduce
