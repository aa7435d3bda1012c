// Training runs: resuming from a checkpoint gives the same final weights, bit for bit,
// as an uninterrupted run; logs and checkpoints are written; bad options are refused.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/data/synthetic.h"
#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/io/safetensors.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "models/checkpoint.h"
#include "models/training.h"
#include "tests/support.h"
#include "tools/progress.h"

using namespace adjoint;
using adjoint::testing::read_text;

namespace {

// 64 images of 1×8×8 whose label is the brightest quadrant: small enough to train in
// milliseconds, image-shaped so that ResNet's BatchNorm buffers take part.
// `poisoned`: every image's first pixel is NaN (a test set that makes any model diverge).
std::shared_ptr<Dataset> make_quadrants(uint64_t seed, bool poisoned = false) {
  Generator gen(seed);
  std::vector<float> pixels = uniform({64, 1, 8, 8}, 0.0f, 1.0f, gen).to_vector();
  std::vector<int64_t> labels;
  for (int64_t i = 0; i < 64; ++i) {
    const int64_t q = i % 4, r0 = (q / 2) * 4, c0 = (q % 2) * 4;
    for (int64_t r = r0; r < r0 + 4; ++r)
      for (int64_t c = c0; c < c0 + 4; ++c) pixels[size_t(i * 64 + r * 8 + c)] += 1.0f;
    if (poisoned) pixels[size_t(i * 64)] = std::nanf("");
    labels.push_back(q);
  }
  return std::make_shared<InMemoryDataset>("quadrants", Shape{1, 8, 8}, std::move(pixels), std::move(labels), 4);
}

DataSource quadrants() {
  DataSource d;
  d.spec = "quadrants";
  d.train = make_quadrants(1);
  d.test = make_quadrants(2);
  d.mean = {0.5f};
  d.std = {0.5f};
  d.images = true;
  return d;
}

std::vector<float> all_weights(const Model& m) {
  std::vector<float> out;
  for (auto& [name, t] : m.state_dict()) {
    auto v = t.to_vector();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

struct Interrupted {};

// Trains `config` on `data` for 3 epochs, uninterrupted and interrupted after step
// `stop_at` then resumed, and checks the final weights are bitwise equal.
void check_resume(ModelConfig config, const DataSource& data, TrainOptions o, int64_t stop_at) {
  fit_config_to_data(config, data);
  o.epochs = 3;
  o.batch_size = 16;
  o.checkpoint_every = 1;

  const testing::TempDir straight_dir, interrupted_dir;
  o.out_dir = straight_dir.path().string();
  Generator g1(o.seed);
  auto straight = make_model(config, g1);
  auto records = train(*straight, data, o);
  CHECK(records.size() == 3);
  CHECK(std::filesystem::exists(o.out_dir + "/log.csv"));

  o.out_dir = interrupted_dir.path().string();
  Generator g2(o.seed);
  auto first = make_model(config, g2);
  CHECK_THROWS_AS(train(*first, data, o,
                        [&](const Progress& p) {
                          if (p.step == stop_at) throw Interrupted{};
                        }),
                  Interrupted);
  Checkpoint ck = load_checkpoint(o.out_dir + "/checkpoint.safetensors");
  CHECK(ck.step == stop_at);

  o.resume = o.out_dir + "/checkpoint.safetensors";
  Generator g3(12345);  // a different initialisation: everything must come from the checkpoint
  auto resumed = make_model(config, g3);
  int64_t resumed_from = -1;
  auto rest = train(*resumed, data, o, [&](const Progress& p) {
    if (resumed_from < 0) resumed_from = p.resumed_from;
  });
  CHECK(resumed_from == stop_at);  // what "resumed from step N" prints
  CHECK(rest.back().epoch == 3);
  CHECK(all_weights(*resumed) == all_weights(*straight));
}

}  // namespace

TEST_CASE("training: resume is bitwise identical to an uninterrupted run (ResNet, SGD, mid-epoch)") {
  set_num_threads(2);
  ModelConfig c;
  c.arch = "resnet18";
  c.width = 0.0625;
  TrainOptions o;
  o.lr = 0.05;
  check_resume(c, quadrants(), o, 6);  // 4 steps per epoch: interrupted in epoch 2
  set_num_threads(0);
}

TEST_CASE("training: resume is bitwise identical (bilinear MLP, AdamW, modular addition)") {
  DataSource d;
  d.spec = "modadd:11";
  d.train = std::make_shared<ModularAddition>(11, "train", 0.5, 0);
  d.test = std::make_shared<ModularAddition>(11, "validation", 0.5, 0);
  ModelConfig c;
  c.arch = "bilinear_mlp";
  c.hidden = 16;
  TrainOptions o;
  o.optimizer = "adamw";
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  check_resume(c, d, o, 4);
}

TEST_CASE("training: a learning run improves test accuracy; bad options are refused") {
  DataSource data = quadrants();
  ModelConfig c;
  c.arch = "resnet18";
  c.width = 0.0625;
  fit_config_to_data(c, data);
  CHECK(c.in_channels == 1);
  CHECK(c.num_classes == 4);
  Generator gen(0);
  auto model = make_model(c, gen);
  TrainOptions o;
  o.epochs = 8;
  o.batch_size = 16;
  o.lr = 0.05;
  o.augment = false;
  Evaluation before = evaluate(*model, data.test, data.eval_transforms(), 32);
  auto records = train(*model, data, o);
  INFO("accuracy before ", before.accuracy, " after ", records.back().test_accuracy);
  CHECK(records.back().test_accuracy >= 0.9);
  CHECK(records.back().test_loss < before.loss);

  o.optimizer = "adam";
  CHECK_THROWS_WITH_AS(train(*model, data, o), doctest::Contains("--optimizer"), UsageError);
  o.optimizer = "sgd";
  o.batch_size = 1000;
  CHECK_THROWS_WITH_AS(train(*model, data, o), doctest::Contains("no full batch of 1000"), Error);
}

TEST_CASE("training: data-parallel parts give the batch gradient, reproducibly") {
  set_num_threads(2);
  std::vector<int> inside(3, 0);
  run_concurrently(3, [&](int64_t i) { inside[size_t(i)] = num_threads(); });
  CHECK(inside == std::vector<int>{1, 1, 1});  // each part is confined to its thread
  CHECK(num_threads() == 2);

  DataSource data = quadrants();
  ModelConfig c;
  c.arch = "vit_custom", c.dim = 16, c.depth = 1, c.heads = 2, c.patch = 4;
  fit_config_to_data(c, data);
  // Plain SGD: the weights move by lr times the gradient, so they compare the gradients
  // (Adam would magnify rounding in near-zero gradient components to a full step).
  TrainOptions o;
  o.lr = 0.1, o.momentum = 0, o.weight_decay = 0;
  o.epochs = 1;
  o.batch_size = 16;
  o.augment = false;
  auto weights_after = [&](int64_t parts) {
    Generator gen(5);
    auto model = make_model(c, gen);
    o.data_parallel = parts;
    auto records = train(*model, data, o);
    return std::make_pair(all_weights(*model), records.back().train_loss);
  };
  const auto [whole, whole_loss] = weights_after(1);
  for (int64_t parts : {2, 3}) {  // 3 parts of 16 examples: 5, 5 and 6
    CAPTURE(parts);
    const auto [split, split_loss] = weights_after(parts);
    REQUIRE(split.size() == whole.size());
    double worst = 0;
    for (size_t i = 0; i < whole.size(); ++i) worst = std::max(worst, double(std::abs(split[i] - whole[i])));
    CHECK(worst < 1e-6);
    CHECK(split_loss == doctest::Approx(whole_loss).epsilon(1e-5));
    CHECK(weights_after(parts).first == split);  // same parts, same threads: same bits
  }
  // The weights did move: the comparison above is not between untouched models.
  Generator gen(5);
  auto fresh = make_model(c, gen);
  CHECK(all_weights(*fresh) != whole);
  // Evaluation in parts (batches of 24 of the 64 test images: 8 parts of 3, and a last
  // batch of 16 in parts of 2) sees every image once.
  const Evaluation one = evaluate(*fresh, data.test, data.eval_transforms(), 24);
  const Evaluation eight = evaluate(*fresh, data.test, data.eval_transforms(), 24, 0, 8);
  CHECK(eight.count == 64);
  CHECK(eight.accuracy == one.accuracy);
  CHECK(eight.loss == doctest::Approx(one.loss).epsilon(1e-6));
  // (BatchNorm models in shards: tests/test_distributed.cpp.)
  set_num_threads(0);
}

TEST_CASE("training: a run whose test loss is NaN stops, logs null / nan and keeps no diverged checkpoint") {
  DataSource data = quadrants();
  data.test = make_quadrants(2, /*poisoned=*/true);
  ModelConfig c;
  c.arch = "resnet18";
  c.width = 0.0625;
  fit_config_to_data(c, data);
  Generator gen(0);
  auto model = make_model(c, gen);
  testing::TempDir dir;
  TrainOptions o;
  o.epochs = 3;
  o.batch_size = 16;
  o.out_dir = dir.path().string();
  auto records = train(*model, data, o);
  REQUIRE(records.size() == 1);  // stopped after the first epoch, not three
  CHECK(records[0].diverged);
  CHECK(std::isnan(records[0].test_loss));
  CHECK(std::isfinite(records[0].train_loss));
  const std::string json = read_text(o.out_dir + "/log.json");
  CAPTURE(json);
  CHECK(testing::contains(json, "\"test_loss\": null"));
  const std::string csv = read_text(o.out_dir + "/log.csv");
  CAPTURE(csv);
  CHECK(testing::contains(csv, ",nan,"));
  CHECK(!testing::contains(csv, "-nan"));
  CHECK(!std::filesystem::exists(o.out_dir + "/checkpoint.safetensors"));
}

namespace {

// A small run of the quadrants ResNet into `dir`: 4 steps per epoch.
TrainOptions small_run(const std::string& dir) {
  TrainOptions o;
  o.epochs = 1;
  o.batch_size = 16;
  o.lr = 0.05;
  o.out_dir = dir;
  return o;
}

std::shared_ptr<Model> small_model(const DataSource& data) {
  ModelConfig c;
  c.arch = "resnet18";
  c.width = 0.0625;
  fit_config_to_data(c, data);
  Generator gen(0);
  return make_model(c, gen);
}

// The id of a process that has exited (and been reaped): nothing runs under it.
pid_t dead_pid() {
  const pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  return child;
}

}  // namespace

TEST_CASE("training: options that would fail at step 1 or train nonsense are refused, naming the option") {
  DataSource data = quadrants();
  auto model = small_model(data);
  const auto refused = [&](TrainOptions o, const std::string& message) {
    CHECK_THROWS_WITH_AS(train(*model, data, o), doctest::Contains(message.c_str()), UsageError);
  };
  TrainOptions o = small_run("");
  o.lr = std::nan("");
  refused(o, "option --lr must be a finite number above 0, got nan");
  o.lr = INFINITY;
  refused(o, "option --lr must be a finite number above 0, got inf");
  o.lr = -0.1;
  refused(o, "option --lr must be a finite number above 0, got -0.1");
  o = small_run("");
  o.momentum = std::nan("");
  refused(o, "option --momentum must be a finite number at least 0 and at most 1, got nan");
  o = small_run("");
  o.weight_decay = std::nan("");
  refused(o, "option --weight-decay must be a finite number at least 0, got nan");
  o = small_run("");
  o.label_smoothing = 2;
  refused(o, "option --label-smoothing must be a finite number at least 0 and at most 1, got 2");
}

TEST_CASE("training: a folder holding a checkpoint is not overwritten unless resumed or --overwrite") {
  DataSource data = quadrants();
  testing::TempDir dir;
  const std::string out = dir.path().string(), ck = out + "/checkpoint.safetensors";
  auto model = small_model(data);
  TrainOptions o = small_run(out);
  train(*model, data, o);
  REQUIRE(std::filesystem::exists(ck));
  CHECK_THROWS_WITH_AS(train(*model, data, o),
                       doctest::Contains(("already holds checkpoint.safetensors; give --resume " + ck).c_str()), UsageError);
  o.overwrite = true;
  CHECK(train(*model, data, o).size() == 1);
}

TEST_CASE("training: --resume refuses a checkpoint of another optimizer, seed, batch or data set, or without its state") {
  DataSource data = quadrants();
  testing::TempDir dir;
  const std::string out = dir.path().string(), ck = out + "/checkpoint.safetensors";
  TrainOptions o = small_run(out);
  o.epochs = 2;
  o.max_steps = 2;
  o.schedule = "constant";  // so that the resumed run may go on past --max-steps
  auto model = small_model(data);
  train(*model, data, o);
  o.max_steps = 0;
  o.resume = ck;
  const auto refused = [&](TrainOptions changed, const DataSource& d, const std::string& message) {
    auto fresh = small_model(d);
    CHECK_THROWS_WITH_AS(train(*fresh, d, changed), doctest::Contains(message.c_str()), Error);
  };
  TrainOptions changed = o;
  changed.optimizer = "adamw";
  refused(changed, data, "the checkpoint was trained with --optimizer sgd, this run has --optimizer adamw");
  changed = o;
  changed.seed = 7;
  refused(changed, data, "the checkpoint was trained with --seed 0, this run has --seed 7");
  changed = o;
  changed.batch_size = 8;
  refused(changed, data, "the checkpoint was trained with --batch 16, this run has --batch 8");
  DataSource other = data;
  other.spec = "other-quadrants";
  refused(o, other, "the checkpoint was trained with --data quadrants, this run has --data other-quadrants");

  // One momentum tensor removed; then all of them. The checksum would refuse both files
  // first; without it (a checkpoint from before checksums) the count of tensors does.
  const SafetensorsFile whole = read_safetensors(ck);
  std::map<std::string, Tensor> tensors = whole.tensors;
  tensors.erase("optim.momentum.fc.weight");
  write_safetensors(ck, tensors, whole.metadata);
  refused(o, data, "its tensors do not match the crc32 its metadata records");
  std::map<std::string, std::string> metadata = whole.metadata;
  metadata.erase("tensors.crc32");
  write_safetensors(ck, tensors, metadata);
  refused(o, data, "optimizer tensors but");
  std::erase_if(tensors, [](const auto& item) { return item.first.rfind("optim.", 0) == 0; });
  metadata.erase("train.optimizer_tensors");  // as a checkpoint from before that key was stored
  write_safetensors(ck, tensors, metadata);
  refused(o, data, "the checkpoint holds no optimizer state");

  // The intact checkpoint resumes.
  write_safetensors(ck, whole.tensors, whole.metadata);
  auto resumed = small_model(data);
  CHECK(train(*resumed, data, o).back().epoch == 2);
}

TEST_CASE("training: stale temporary files of dead writers are removed; a run failing at step 1 leaves no folder") {
  DataSource data = quadrants();
  testing::TempDir dir;
  const std::string out = dir.path().string();
  const std::string stale = out + "/checkpoint.safetensors.tmp." + std::to_string(dead_pid());
  const std::string live = out + "/log.json.tmp." + std::to_string(::getppid());  // a running process's
  write_file_atomic(stale, "half a checkpoint");
  write_file_atomic(live, "being written");
  write_file_atomic(out + "/notes.tmp.txt", "not a temporary of ours");
  CHECK(remove_stale_temporaries(out) == 1);
  CHECK(!std::filesystem::exists(stale));
  CHECK(std::filesystem::exists(live));
  CHECK(std::filesystem::exists(out + "/notes.tmp.txt"));
  // A new run (as a resumed one) into the folder cleans up the same way.
  write_file_atomic(stale, "half a checkpoint");
  auto model = small_model(data);
  train(*model, data, small_run(out));
  CHECK(!std::filesystem::exists(stale));

  // A training set that makes the first step's loss NaN: the run fails before writing.
  DataSource poisoned = data;
  poisoned.train = make_quadrants(1, /*poisoned=*/true);
  const std::string fresh = out + "/never";
  auto other = small_model(poisoned);
  CHECK_THROWS_WITH_AS(train(*other, poisoned, small_run(fresh)), doctest::Contains("diverged"), Error);
  CHECK(!std::filesystem::exists(fresh));
}

TEST_CASE("files: a write interrupted by SIGINT or SIGTERM removes its temporary; the signal still ends the process") {
  testing::TempDir dir;
  for (const int signal_number : {SIGINT, SIGTERM}) {
    CAPTURE(signal_number);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
      ::signal(signal_number, SIG_DFL);  // as in the command line (the test runner has its own handler)
      AtomicFile file(dir.file("checkpoint.safetensors"), "test");
      file.write("half a checkpoint");
      ::raise(signal_number);
      ::_exit(7);  // not reached: the signal ends the process
    }
    int status = 0;
    ::waitpid(child, &status, 0);
    CHECK(WIFSIGNALED(status));
    CHECK(WTERMSIG(status) == signal_number);
    CHECK(std::filesystem::is_empty(dir.path()));
  }
}

TEST_CASE("files: SIGINT removes every temporary open at the time, however many are open at once") {
  // Threads write many files at once (the pictures of a report): each of them is removed,
  // not only the first few, or they stay behind as empty *.tmp.PID files.
  testing::TempDir dir;
  const pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    ::signal(SIGINT, SIG_DFL);
    std::vector<std::unique_ptr<AtomicFile>> files;
    for (int i = 0; i < 100; ++i) {
      files.push_back(std::make_unique<AtomicFile>(dir.file("picture_" + std::to_string(i) + ".png"), "test"));
      files.back()->write("not yet flushed");
    }
    ::raise(SIGINT);
    ::_exit(7);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  CHECK(WIFSIGNALED(status));
  std::vector<std::string> left;
  for (const auto& e : std::filesystem::directory_iterator(dir.path())) left.push_back(e.path().filename().string());
  CAPTURE(left.size());
  CHECK(left.empty());
}

TEST_CASE("training: the train command refuses to overwrite a run and says 'resumed from step N' on --resume") {
  testing::TempDir dir;
  const std::string out = dir.file("run");
  const std::vector<std::string> run = {"train", "--data", "modadd:11", "--model", "bilinear_mlp", "--hidden", "8",
                                        "--epochs", "2", "--batch", "8", "--schedule", "constant", "--out", out};
  std::vector<std::string> first = run;
  first.insert(first.end(), {"--max-steps", "2"});
  REQUIRE(testing::run_adjoint(first).code == 0);

  const testing::CommandOutcome again = testing::run_adjoint(run);
  CAPTURE(again.err);
  CHECK(again.code == 2);
  CHECK(testing::contains(again.err, "already holds checkpoint.safetensors; give --resume " + out +
                                         "/checkpoint.safetensors to continue that run, or --overwrite"));

  std::vector<std::string> resume = run;
  resume.insert(resume.end(), {"--resume", out + "/checkpoint.safetensors"});
  const testing::CommandOutcome resumed = testing::run_adjoint(resume);
  CAPTURE(resumed.out);
  CAPTURE(resumed.err);
  CHECK(resumed.code == 0);
  CHECK(testing::contains(resumed.out, "resumed from step 2\n"));

  std::vector<std::string> overwrite = run;
  overwrite.push_back("--overwrite");
  const testing::CommandOutcome fresh = testing::run_adjoint(overwrite);
  CHECK(fresh.code == 0);
  CHECK(!testing::contains(fresh.out, "resumed from"));
}

TEST_CASE("progress: after a resume the rate and ETA count only the items of this process") {
  // 2 of 4 batches were done before the resume; 1 more in 1 s: 1 batch/s, 1 s to go.
  const cli::Pace resumed = cli::pace_of(3, 2, 4, 0.75, 1.0);
  CHECK(resumed.per_second == 1.0);
  CHECK(resumed.eta_seconds == doctest::Approx(1.0));
  // A fresh run: 3 batches in 1 s, the last one in a third of a second.
  const cli::Pace fresh = cli::pace_of(3, 0, 4, 0.75, 1.0);
  CHECK(fresh.per_second == 3.0);
  CHECK(fresh.eta_seconds == doctest::Approx(1.0 / 3));
  CHECK(cli::pace_of(2, 2, 4, 0.5, 0.0).per_second == 0.0);  // nothing done yet, no time passed
}

TEST_CASE("train command: the final line says which test examples its accuracy was measured on") {
  testing::TempDir dir;
  const std::vector<std::string> base = {"train", "--model", "bilinear_mlp", "--hidden", "8", "--data", "modadd:11",
                                         "--batch", "8", "--epochs", "1", "--out", dir.file("run")};
  std::vector<std::string> limited = base;
  limited.insert(limited.end(), {"--eval-limit", "20"});
  const testing::CommandOutcome some = testing::run_adjoint(limited);
  REQUIRE_MESSAGE(some.code == 0, some.err);
  CHECK(testing::contains(some.out, "(first 20 of 85 test examples)"));
  std::vector<std::string> all = base;
  all.push_back("--overwrite");
  const testing::CommandOutcome every = testing::run_adjoint(all);
  REQUIRE_MESSAGE(every.code == 0, every.err);
  CHECK(testing::contains(every.out, "(all 85 test examples)"));
}
