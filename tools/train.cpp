// `adjoint train`, `adjoint eval`, `adjoint info` and `adjoint predict`: the model life
// cycle on the command line. The work is in models/training.cpp; this file turns options
// into TrainOptions and results into files and lines.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>

#include "analysis/common/figure.h"
#include "analysis/common/robustness.h"
#include "engine/autograd.h"
#include "engine/io/csv.h"
#include "engine/data/loader.h"
#include "engine/data/open.h"
#include "engine/distributed/ranks.h"
#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/io/safetensors.h"
#include "engine/io/table.h"
#include "engine/threads.h"
#include "models/checkpoint.h"
#include "models/model_source.h"
#include "models/training.h"
#include "ops/layout.h"
#include "tools/attack_options.h"
#include "tools/cli.h"
#include "tools/folder_lock.h"
#include "tools/html_report.h"
#include "tools/model_options.h"
#include "tools/progress.h"

namespace adjoint {
namespace {

int64_t count_parameters(const Module& m) {
  int64_t n = 0;
  for (const auto& [name, t] : m.named_parameters()) n += t.numel();
  return n;
}

// What --adversarial chooses: the step function of the training loop.
struct TrainingKind {
  const char* name;
  const char* help;
  TrainingStep (*make)(const cli::Args& a, const TrainOptions& o, const DataSource& data);
};
const TrainingKind kTrainingKinds[] = {
    {"none", "standard training on the batches as they come",
     [](const cli::Args&, const TrainOptions& o, const DataSource&) { return classification_step(o); }},
    {"pgd", "PGD adversarial training (Madry et al.): each batch attacked with --pgd-* first",
     [](const cli::Args& a, const TrainOptions& o, const DataSource& data) {
       const PgdOptions attack = attack_options(a, float(a.number("pgd-eps")), o.seed);
       if (!data.images) throw UsageError(cat("--adversarial pgd: ", data.spec, " is not an image data set"));
       return adversarial_training_step(o, attack, data.mean, data.std);
     }},
};

TrainingStep training_step(const cli::Args& a, const TrainOptions& o, const DataSource& data) {
  const std::string name = a.text("adversarial");
  std::string names;
  for (const TrainingKind& k : kTrainingKinds) {
    if (name == k.name) return k.make(a, o, data);
    names += cat(names.empty() ? "" : ", ", k.name);
  }
  throw UsageError(cat("--adversarial: unknown training '", name, "'; choices: ", names));
}

// The loss and accuracy curves of a run, over steps: the running means over each epoch
// that the progress reported (this process's steps) and the test set's at each epoch's end;
// OUT/training_loss and OUT/training_accuracy, .png and .svg.
void write_training_curves(const std::string& dir, const std::string& title, const std::vector<Progress>& steps,
                           const std::vector<EpochRecord>& records) {
  std::map<int64_t, size_t> column;  // step → position on the x axis
  for (const Progress& p : steps) column[p.step];
  for (const EpochRecord& r : records) column[r.step];
  if (column.empty()) return;
  std::vector<double> x;
  for (auto& [step, at] : column) at = x.size(), x.push_back(double(step));
  const auto chart = [&](const char* what, double Progress::*running, double EpochRecord::*train_end,
                         double EpochRecord::*test_end, double scale) {
    std::vector<double> run(x.size(), NAN), train_at_end(x.size(), NAN), test(x.size(), NAN);
    for (const Progress& p : steps) run[column[p.step]] = scale * p.*running;
    for (const EpochRecord& r : records) train_at_end[column[r.step]] = scale * r.*train_end, test[column[r.step]] = scale * r.*test_end;
    return LineChart{.title = cat(title, ": ", what), .x_label = "step", .y_label = what, .x = x,
                     .series = {{"train, running mean over the epoch", run, kSeriesColours[0]},
                                {"train, epoch mean", train_at_end, kSeriesColours[2]},
                                {"test, end of epoch", test, kSeriesColours[1]}}};
  };
  Figure(chart("loss", &Progress::loss, &EpochRecord::train_loss, &EpochRecord::test_loss, 1)).write(dir + "/training_loss");
  Figure(chart("accuracy (%)", &Progress::accuracy, &EpochRecord::train_accuracy, &EpochRecord::test_accuracy, 100))
      .write(dir + "/training_accuracy");
}

int run_train(const cli::Args& a) {
  const bool quick = a.flag("quick");
  DataSource data = open_data(a.text("data"));
  ModelConfig config = model_config(a);
  if (quick && !a.has("width")) config.width = 0.25;
  fit_config_to_data(config, data);

  TrainOptions o;
  Generator init(uint64_t(a.integer("seed")));
  auto model = make_model(config, init);
  // The optimizer, when none is given, is the one the model's family trains with.
  o.optimizer = a.has("optimizer") ? a.text("optimizer") : model->facts().default_optimizer;
  o.lr = a.has("lr") ? a.number("lr") : (o.optimizer == "adamw" ? 1e-3 : 0.1);
  o.momentum = a.number("momentum");
  o.weight_decay = a.has("weight-decay") ? a.number("weight-decay") : (o.optimizer == "adamw" ? 0.05 : 5e-4);
  o.nesterov = !a.flag("no-nesterov");
  o.schedule = a.text("schedule");
  o.warmup_steps = a.integer("warmup");
  o.label_smoothing = a.number("label-smoothing");
  o.epochs = quick && !a.has("epochs") ? 1 : a.integer("epochs");
  o.max_steps = quick && !a.has("max-steps") ? 150 : a.integer("max-steps");
  o.batch_size = a.integer("batch");
  o.data_parallel = a.integer("data-parallel");
  if (o.data_parallel < 1) throw UsageError(cat("--data-parallel must be at least 1, got ", o.data_parallel));
  o.shards = a.has("shards") ? a.integer("shards") : 0;
  if (a.has("shards") && o.shards < 1) throw UsageError(cat("--shards must be at least 1, got ", o.shards));
  o.bucket_mib = a.number("bucket-mib");
  if (!(o.bucket_mib > 0 && std::isfinite(o.bucket_mib)))
    throw UsageError(cat("option --bucket-mib must be a positive number of MiB, got ", o.bucket_mib));
  const double rank_timeout = a.number("rank-timeout");
  if (!(rank_timeout > 0 && std::isfinite(rank_timeout)))
    throw UsageError(cat("option --rank-timeout must be a positive number of seconds, got ", rank_timeout));
  distributed::set_rank_timeout(rank_timeout);
  o.augment = !a.flag("no-augment");
  if (a.has("random-rescale")) {
    o.random_rescale = parse_rescale_range(a.text("random-rescale"));
    if (!data.images) throw UsageError(cat("--random-rescale: ", data.spec, " is not an image data set"));
  }
  o.seed = uint64_t(a.integer("seed"));
  o.eval_limit = quick && !a.has("eval-limit") ? 2000 : a.integer("eval-limit");
  o.out_dir = a.has("out") ? a.text("out") : "runs/" + config.arch;
  o.checkpoint_every = a.integer("checkpoint-every");
  o.keep_checkpoints = a.has("keep-checkpoints") ? a.text("keep-checkpoints") : "";
  o.resume = a.has("resume") ? a.text("resume") : "";
  o.continue_from = a.has("continue-from") ? a.text("continue-from") : "";
  if (!o.resume.empty() && !o.continue_from.empty()) throw UsageError("give --resume or --continue-from, not both");
  o.overwrite = a.flag("overwrite");
  const TrainingStep step = training_step(a, o, data);
  const auto lock = cli::lock_output_folder(o.out_dir);

  // Every rank trains; rank 0 alone speaks (and writes: models/training.cpp).
  const bool speaks = distributed::rank() == 0;
  const Sharding sharding = sharding_of(o);
  if (!speaks) {
    train(*model, data, o, step);
    return 0;
  }
  std::printf("adjoint train: %s (%lld parameters) on %s, %lld train / %lld test examples, %d threads\n",
              config.arch.c_str(), (long long)count_parameters(*model), data.spec.c_str(), (long long)data.train->size(),
              (long long)data.test->size(), num_threads());
  std::printf("  %s lr %g, weight decay %g, %s schedule, batch %lld%s, %lld epochs%s; writing %s\n",
              o.optimizer.c_str(), o.lr, o.weight_decay, o.schedule.c_str(), (long long)o.batch_size,
              sharding.shards > 1 ? cat(" in ", sharding.shards, " shards").c_str() : "",
              (long long)o.epochs, o.max_steps ? cat(" (at most ", o.max_steps, " steps)").c_str() : "",
              o.out_dir.c_str());
  if (distributed::size() > 1 || sharding.threads > 1)
    std::printf("  data parallel: %d ranks × %lld threads, %lld shards of %lld examples per step (the same bits at any "
                "rank count dividing %lld); gradients exchanged in buckets of %g MiB during backward\n",
                distributed::size(), (long long)sharding.threads, (long long)sharding.shards,
                (long long)(o.batch_size / sharding.shards), (long long)sharding.shards, sharding.bucket_mib);
  if (a.text("adversarial") != "none") {
    std::printf("  %s:", step.name.c_str());
    for (const auto& [key, value] : step.metadata) std::printf(" %s=%s", key.c_str(), value.c_str());
    std::printf("\n");
  }
  std::fflush(stdout);

  std::unique_ptr<cli::ProgressBar> bar;
  int64_t bar_epoch = -1;
  bool first_step = true;
  std::vector<Progress> steps;  // for the training curves
  auto on_progress = [&](const Progress& p) {
    steps.push_back(p);
    if (first_step && p.resumed_from > 0) {
      std::printf("resumed from step %lld\n", (long long)p.resumed_from);
      std::fflush(stdout);  // before the bar, which goes to stderr
    }
    first_step = false;
    if (p.epoch != bar_epoch) {
      // The batches of this epoch done before this process started (a resumed run) do
      // not count towards the rate and ETA.
      bar = std::make_unique<cli::ProgressBar>(cat("epoch ", p.epoch, "/", p.epochs), p.batches, "batch", p.batch - 1);
      bar_epoch = p.epoch;
    }
    char detail[128];
    std::snprintf(detail, sizeof detail, "loss %.4f acc %.2f%% %.0f samples/s lr %.4g", p.loss, 100 * p.accuracy,
                  p.samples_per_second, p.lr);
    bar->update(p.batch, detail);
  };
  // Which test images the accuracy was measured on: all of them, or the first --eval-limit.
  const int64_t test_images = o.eval_limit > 0 ? std::min(o.eval_limit, data.test->size()) : data.test->size();
  const std::string test_set = o.eval_limit > 0 && o.eval_limit < data.test->size()
                                   ? cat("first ", test_images, " of ", data.test->size(), " test examples")
                                   : cat("all ", test_images, " test examples");
  auto on_epoch = [&](const EpochRecord& r) {
    bar.reset();
    bar_epoch = -1;
    // "epoch 1 (150 of 468 batches)" for a run cut short, as `info` and `eval` then say.
    std::printf("%s: train loss %.4f acc %.2f%% | test loss %.4f acc %.2f%% | %s, %.0f samples/s\n",
                training_position(r.step, r.epoch, r.batches_per_epoch).c_str(), r.train_loss, 100 * r.train_accuracy, r.test_loss, 100 * r.test_accuracy,
                cli::format_duration(r.seconds).c_str(), r.samples_per_second);
    std::fflush(stdout);
  };
  auto records = train(*model, data, o, step, on_progress, on_epoch);
  if (!records.empty() && records.back().diverged) {
    const EpochRecord& r = records.back();
    throw Error(cat("train: the run diverged: test loss ", csv_number(r.test_loss), " after epoch ", r.epoch,
                    " (step ", r.step, "); training stopped, ", o.out_dir,
                    "/log.csv records the epoch and the checkpoint keeps the last finite weights. Lower --lr or "
                    "check the data"));
  }
  if (!records.empty())
    std::printf("done: test accuracy %.2f%% (%s); checkpoint %s/checkpoint.safetensors, log %s/log.csv\n",
                100 * records.back().test_accuracy, test_set.c_str(), o.out_dir.c_str(), o.out_dir.c_str());
  const std::string title = cat(config.arch, " on ", data.spec, ", ", o.optimizer, " lr ", o.lr, ", seed ", o.seed);
  write_training_curves(o.out_dir, title, steps, records);
  cli::write_html_report(o.out_dir, a, cli::folder_report(o.out_dir, "adjoint train: " + title));
  return 0;
}

// Under mpirun a rank that fails alone would leave the others waiting for it in the next
// collective: it ends the whole job instead, naming itself (exit 2 for bad usage, else 1).
int run_train_on_every_rank(const cli::Args& a) {
  try {
    return run_train(a);
  } catch (const UsageError& e) {
    if (distributed::size() > 1) distributed::abort(2, cat("adjoint train: ", e.what()).c_str());
    throw;
  } catch (const std::exception& e) {
    if (distributed::size() > 1) distributed::abort(1, cat("adjoint train: ", e.what()).c_str());
    throw;
  }
}

const cli::Registration train_command({
    .name = "train",
    .summary = "train a model on a data set, with checkpoints and a per-epoch log",
    .description =
        "Data sets: fashion-mnist[:FOLDER] (default), mnist:FOLDER, cifar10:FOLDER, images:ROOT[:SIZE],\n"
        "modadd[:P], text:FILE[:LEN]; an image data set may be followed by variants made in code:\n"
        "+classes:LIST, +backdoor:FRACTION:TARGET[:SIZE], +trigger:TARGET[:SIZE], +shortcut[:SIZE],\n"
        "+shortcut-train[:SIZE], +invert, +mosaics[:FRACTION] (engine/data/variants.h).\n"
        "Writes OUT/checkpoint.safetensors after every epoch and\n"
        "OUT/log.csv, OUT/log.json. --resume OUT/checkpoint.safetensors with the same options continues\n"
        "the run; the final weights equal an uninterrupted run's bit for bit (same seed and threads).\n"
        "Under mpirun -n K every rank trains its shards of each batch (--shards S, a multiple of K) and rank 0\n"
        "writes; the same S gives the same weights at any K dividing it (docs/cluster.md).\n"
        "--adversarial pgd trains on PGD adversarial examples of every batch (model in eval mode during the\n"
        "attack, as the robustness library does); the attack is recorded in the checkpoint's metadata.",
    .arguments = "",
    .options = with_attack_options(with_model_options({
        {"data", "SPEC", "the data set", "fashion-mnist"},
        {"epochs", "N", "passes over the training set", "10"},
        {"batch", "N", "examples per step", "128"},
        {"data-parallel", "N", "compute N shards of each batch at once, one thread each", "1"},
        {"shards", "S",
         "split each batch into S shards (own gradient and BatchNorm statistics, summed in a fixed order): the same "
         "weights in one process and over mpirun -n K for every K dividing S (default: --data-parallel; required "
         "under mpirun)",
         ""},
        {"bucket-mib", "X",
         "with shards: exchange the gradients in buckets of about X MiB, each sent while backward computes the earlier "
         "layers (changes the speed, never the weights)",
         "25"},
        {"rank-timeout", "SECONDS",
         "under mpirun or srun: end the job, naming the rank and the step, when a rank's part of an exchange has not "
         "arrived after this long",
         "300"},
        {"optimizer", "NAME", "sgd (momentum, Nesterov) or adamw (default: the model's own; adamw for a ViT, else sgd)", ""},
        {"lr", "X", "peak learning rate (default 0.1 for sgd, 1e-3 for adamw)", ""},
        {"momentum", "X", "SGD momentum", "0.9"},
        {"no-nesterov", "", "plain momentum instead of Nesterov", ""},
        {"weight-decay", "X", "L2 (sgd) or decoupled (adamw) decay (default 5e-4 / 0.05)", ""},
        {"schedule", "NAME", "cosine, step or constant", "cosine"},
        {"warmup", "N", "linear warm-up steps", "0"},
        {"label-smoothing", "X", "cross-entropy label smoothing", "0"},
        {"no-augment", "", "no random crop / flip on images", ""},
        {"random-rescale", "LO,HI",
         "also shrink each training image to a random fraction in [LO, HI] of its side, placed at a random position on "
         "black (0.5,1: 14 to 28 pixels on Fashion-MNIST)",
         ""},
        {"seed", "N", "initialisation, shuffling and augmentation", "0"},
        {"max-steps", "N", "stop after N steps in all (0: no limit)", "0"},
        {"eval-limit", "N", "evaluate on the first N test examples (0: all)", "0"},
        {"out", "DIR", "where checkpoints and logs go (default runs/MODEL)", ""},
        {"checkpoint-every", "N", "also checkpoint every N steps", "0"},
        {"keep-checkpoints", "SCHEDULE",
         "keep checkpoints for later analysis in OUT/checkpoints: every:N steps or log:K (K log-spaced steps)", ""},
        {"resume", "FILE", "continue from a checkpoint (same optimizer, seed, batch, data and attack)", ""},
        {"continue-from", "FILE",
         "start from another run's checkpoint (weights, optimizer state, step) on this run's data; --epochs counts from "
         "that run's start",
         ""},
        {"overwrite", "", "replace a checkpoint already in --out instead of refusing", ""},
        {"quick", "", "a demo of about 35 s on 2 cores: width 0.25, 150 steps, 2000 test images", ""},
        {"adversarial", "NAME", "none, or pgd: PGD adversarial training (Madry et al.) with the --pgd-* attack", "none"},
        {"pgd-eps", "X", "PGD radius in [0,1] pixel units (--adversarial pgd)", "0.1"},
    })),
    .run = run_train_on_every_rank,
});

// The first `count` test images as raw pixels in [0, 1] (the pipeline's normalisation
// undone) with their labels.
std::pair<Tensor, std::vector<int64_t>> raw_test_images(const std::string& who, const DataSource& data, int64_t count) {
  const int64_t n = std::min(count, data.test->size());
  Loader loader(data.test, LoaderOptions{256, false, false, false, 0, data.eval_transforms()});
  std::vector<Tensor> parts;
  std::vector<int64_t> labels;
  for (int64_t b = 0; int64_t(labels.size()) < n; ++b) {
    const Batch batch = loader.batch(0, b);
    const int64_t take = std::min(batch.size(), n - int64_t(labels.size()));
    parts.push_back(slice(raw_pixels(batch.inputs, data.mean, data.std, who), 0, 0, take).contiguous());
    labels.insert(labels.end(), batch.labels.begin(), batch.labels.begin() + take);
  }
  return {concat(parts, 0), labels};
}

// `adjoint eval --pgd-eps LIST`: the accuracy under PGD at each ε and the area under it.
void print_robust_accuracy(const cli::Args& a, const Checkpoint& ck, Model& model, const DataSource& data,
                           int64_t batch) {
  const std::vector<float> grid = eps_grid(a, "pgd-eps");
  const PgdOptions attack = attack_options(a, grid.front(), uint64_t(a.integer("seed")));
  const int64_t count = a.integer("pgd-images");
  if (count < 1) throw UsageError(cat("option --pgd-images must be at least 1, got ", count));
  check(data.images, "eval --pgd-eps: ", data.spec, " is not an image data set");
  const std::string who = "PGD: " + ck.path;
  model.train(false);
  const auto [raw, labels] = raw_test_images(who, data, count);
  std::printf("PGD %s, %lld steps, step %s, %s start, on the first %lld test images:\n", attack.norm.c_str(),
              (long long)attack.steps, attack.step_size > 0 ? cat(attack.step_size).c_str() : "2.5·ε/steps",
              attack.random_start ? "random" : "clean", (long long)labels.size());
  std::fflush(stdout);
  const std::vector<double> accuracy = robust_accuracy(
      [&](const Tensor& x) { return model.forward(normalise_pixels(x, data.mean, data.std, who)); }, raw, labels, grid,
      attack, batch);
  for (size_t k = 0; k < grid.size(); ++k)
    std::printf("  eps %-8g robust accuracy %.2f%%\n", grid[k], 100 * accuracy[k]);
  const double area = area_under_accuracy(grid, accuracy);
  std::printf("AuA %.5f over eps [%g, %g] (mean robust accuracy %.2f%%)\n", area, grid.front(), grid.back(),
              100 * area / double(grid.back() - grid.front()));
}

int run_eval(const cli::Args& a) {
  Checkpoint ck = load_checkpoint(a.text("checkpoint"));
  auto model = model_from_checkpoint(ck);
  const int64_t batch = a.integer("batch"), limit = a.integer("limit");
  if (batch < 1) throw UsageError(cat("option --batch must be at least 1, got ", batch));
  if (limit < 0) throw UsageError(cat("option --limit must be 0 (all) or a count of examples, got ", limit));
  const std::string spec = a.has("data") ? a.text("data") : ck.metadata.count("data.spec") ? ck.metadata.at("data.spec") : "";
  if (spec.empty()) throw UsageError("eval: the checkpoint names no data set; give --data");
  DataSource data;
  try {
    data = open_data(spec, DataSplits::TestOnly);  // eval reads no training files
  } catch (const UsageError& e) {
    if (a.has("data")) throw;
    throw Error(cat("checkpoint ", ck.path, ": metadata data.spec: ", e.what()));  // not the user's option
  }
  std::printf("adjoint eval: %s (%s, step %lld) on %s (%lld test examples)\n", ck.config.arch.c_str(),
              training_position(ck).c_str(), (long long)ck.step, spec.c_str(), (long long)data.test->size());
  Evaluation e = evaluate(*model, data.test, data.eval_transforms(), batch, limit);
  std::printf("test loss %.4f, accuracy %.2f%% (%lld examples)\n", e.loss, 100 * e.accuracy, (long long)e.count);
  if (a.has("pgd-eps")) print_robust_accuracy(a, ck, *model, data, batch);
  return 0;
}

const cli::Registration eval_command({
    .name = "eval",
    .summary = "evaluate a checkpoint on a test set",
    .description =
        "Uses the data set the checkpoint was trained on unless --data names another. --pgd-eps adds the\n"
        "accuracy under PGD at each ε (raw [0,1] pixels, the checkpoint's normalisation applied after) and\n"
        "the area under that curve (trapezoid).",
    .arguments = "",
    .options = with_attack_options({{"checkpoint", "FILE", "a checkpoint written by adjoint train", ""},
                                    {"data", "SPEC", "the data set (default: the checkpoint's)", ""},
                                    {"batch", "N", "examples per batch", "256"},
                                    {"limit", "N", "evaluate the first N examples (0: all)", "0"},
                                    {"pgd-eps", "LIST",
                                     "also the accuracy under PGD at each ε of LIST (e.g. 0,0.025,0.05,0.1) and its AuA",
                                     ""},
                                    {"pgd-images", "N", "test images attacked for --pgd-eps", "1000"},
                                    {"seed", "N", "PGD's random start", "0"}}),
    .run = run_eval,
});

int run_info(const cli::Args& a) {
  if (a.positionals().size() != 1) throw UsageError("info: give exactly one checkpoint file");
  Checkpoint ck = load_checkpoint(a.positionals()[0]);
  auto model = model_from_checkpoint(ck);
  std::printf("checkpoint %s\n  model %s, %lld parameters, %zu blocks\n  %s, step %lld\n",
              a.positionals()[0].c_str(), ck.config.arch.c_str(), (long long)count_parameters(*model),
              model->num_blocks(), training_position(ck).c_str(), (long long)ck.step);
  std::printf("  config:");
  for (const auto& [k, v] : ck.config.to_map()) std::printf(" %s=%s", k.c_str(), v.c_str());
  std::printf("\n  metadata:");
  for (const auto& [k, v] : ck.metadata)
    if (k.rfind("config.", 0) != 0) std::printf(" %s=%s", k.c_str(), v.c_str());
  std::printf("\n  blocks:");
  for (const auto& b : model->blocks()) std::printf(" %s", b.name.c_str());
  std::printf("\n  optimizer state: %zu tensors\n", ck.optimizer.size());
  if (ck.checksum.empty())
    std::printf("  tensors: no checksum recorded (a checkpoint from before they were), not checked\n");
  else
    std::printf("  tensors: crc32 %s, as recorded\n", ck.checksum.c_str());
  return 0;
}

const cli::Registration info_command({
    .name = "info",
    .summary = "describe a checkpoint: model, config, epoch, blocks",
    .description = "",
    .arguments = "CHECKPOINT",
    .options = {},
    .run = run_info,
});

// The inputs of predict: one tensor of a safetensors file, or image files decoded to the
// model's size.
Tensor load_inputs(const cli::Args& a, const LoadedModel& m) {
  if (a.has("input")) return load_input_tensor(a.text("input"), a.has("tensor") ? a.text("tensor") : "");
  if (a.positionals().empty()) throw UsageError("predict: give --input FILE.safetensors or image files");
  return load_image_files(a.positionals(), m);
}

int run_predict(const cli::Args& a) {
  LoadedModel m = load_model(a);
  Tensor x = load_inputs(a, m);
  check_model_input(m, x, a.has("input") ? a.text("input") : "predict");
  Tensor logits;
  {
    NoGrad off;
    logits = m.model->forward(x).contiguous();
  }
  const std::string out = a.text("out");
  const std::vector<std::string> names = class_names_for(m, m.data_spec);  // "class 9 (ankle boot)"
  // Both files are written to temporaries and renamed only when both are complete, so
  // that a failure leaves neither half of the output.
  AtomicFile tensor_file(out + ".safetensors", "predict");
  write_safetensors(tensor_file, {{"logits", logits}}, {{"model", m.model->config().arch}});
  Table csv{{"index", "predicted"}};
  const int64_t n = logits.size(0), k = logits.numel() / std::max<int64_t>(n, 1);
  for (int64_t j = 0; j < k; ++j) csv.header.push_back(cat("logit_", j));
  for (int64_t i = 0; i < n; ++i) {
    const float* row = logits.data() + i * k;
    int64_t best = 0;
    for (int64_t j = 1; j < k; ++j)
      if (row[j] > row[best]) best = j;
    std::vector<std::string> cells = {cat(i), cat(best)};
    for (int64_t j = 0; j < k; ++j) cells.push_back(csv_number(row[j]));
    csv.add_row(cells);
    const std::string name = best < int64_t(names.size()) ? cat(" (", names[size_t(best)], ")") : "";
    std::printf("%lld: class %lld%s (logit %.4f)\n", (long long)i, (long long)best, name.c_str(), row[best]);
  }
  AtomicFile csv_file(out + ".csv", "predict");
  csv_file.write(csv.csv());
  csv_file.commit();
  tensor_file.commit();
  std::printf("wrote %s.safetensors and %s.csv\n", out.c_str(), out.c_str());
  return 0;
}

const cli::Registration predict_command({
    .name = "predict",
    .summary = "run a model on a tensor file or images and write the logits",
    .description =
        "The model comes from --checkpoint, or from --model with --weights (a state dict in\n"
        "torchvision/timm naming, F32/F16/BF16). Images are decoded, resized to the model's input size\n"
        "and normalised with the checkpoint's statistics (or --mean/--std); a --input tensor is used\n"
        "as it is. Writes OUT.safetensors (tensor 'logits') and OUT.csv.",
    .arguments = "[IMAGE...]",
    .options = with_model_source_options({
        {"input", "FILE", "a .safetensors file holding the input batch", ""},
        {"tensor", "NAME", "which tensor of --input", ""},
        {"out", "PREFIX", "output files PREFIX.safetensors and PREFIX.csv", "predictions"},
    }),
    .run = run_predict,
});

}  // namespace
}  // namespace adjoint
