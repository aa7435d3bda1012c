// Sharded data-parallel training (models/training.h, Sharding; engine/distributed/ranks.h):
// the fixed-order tree sum, shards' gradients and BatchNorm statistics against each shard
// computed on its own, and `adjoint train` under `mpirun -n K` ending with the same bits at
// every K, with threads, and after a resume at another K.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <sstream>

#include "analysis/common/robustness.h"
#include "engine/autograd.h"
#include "engine/data/idx.h"
#include "engine/data/loader.h"
#include "engine/data/transform.h"
#include "engine/data/open.h"
#include "engine/distributed/ranks.h"
#include "engine/error.h"
#include "engine/distributed/gradient_buckets.h"
#include "engine/io/json.h"
#include "engine/random.h"
#include "models/checkpoint.h"
#include "models/training.h"
#include "ops/layout.h"
#include "tests/support.h"

using namespace adjoint;
using adjoint::testing::adjoint_exe;
using adjoint::testing::TempDir;
using adjoint::testing::read_text;
using adjoint::testing::adjoint_run;
using adjoint::testing::mpi_tests_skipped;
using adjoint::testing::mpirun_available;
using adjoint::testing::write_square_images;
namespace fs = std::filesystem;

namespace {

// Values whose float sum depends on the order of the additions.
std::vector<float> order_sensitive_rows(int64_t count, int64_t length, uint64_t seed) {
  Generator gen(seed);
  std::vector<float> rows = normal({count, length}, 0.0f, 1.0f, gen).to_vector();
  for (int64_t i = 0; i < count; ++i) rows[size_t(i * length)] = (i % 2 ? -1.0f : 1.0f) * 1e8f + float(i);
  return rows;
}

}  // namespace

TEST_CASE("distributed: the tree sum adds rows in one fixed pairwise order, and pre-summed aligned blocks keep it") {
  // Row by row: a = 1e8, b = 1, c = −1e8, d = 1 sum to ((a+b)+(c+d)) = 0 by the tree, but to
  // 1 left to right: the test below would notice a sum in arrival order.
  std::vector<float> four = {1e8f, 1.0f, -1e8f, 1.0f};
  tree_sum_rows(four.data(), 4, 1);
  CHECK(four[0] == (1e8f + 1.0f) + (-1e8f + 1.0f));
  CHECK(four[0] == 0.0f);
  CHECK(((1e8f + 1.0f) + -1e8f) + 1.0f == 1.0f);

  // 8 shards on K = 1, 2, 4, 8 ranks: each rank sums its block (a subtree), the blocks' sums
  // are summed by the same tree: every K gives the bits of the whole tree.
  const int64_t shards = 8, length = 33;
  const std::vector<float> rows = order_sensitive_rows(shards, length, 3);
  std::vector<float> whole = rows;
  tree_sum_rows(whole.data(), shards, length);
  whole.resize(size_t(length));
  for (int64_t ranks : {2, 4, 8}) {
    CAPTURE(ranks);
    const int64_t block = shards / ranks;
    std::vector<float> partial(size_t(ranks * length));
    for (int64_t r = 0; r < ranks; ++r) {
      std::vector<float> mine(rows.begin() + r * block * length, rows.begin() + (r + 1) * block * length);
      tree_sum_rows(mine.data(), block, length);
      std::copy(mine.begin(), mine.begin() + length, partial.begin() + r * length);
    }
    tree_sum_rows(partial.data(), ranks, length);
    partial.resize(size_t(length));
    CHECK(partial == whole);
  }
  // Left to right gives other bits on these rows (what a sum by arrival would do).
  std::vector<float> sequential(rows.begin(), rows.begin() + length);
  for (int64_t s = 1; s < shards; ++s)
    for (int64_t k = 0; k < length; ++k) sequential[size_t(k)] += rows[size_t(s * length + k)];
  CHECK(sequential != whole);
  // Six rows: the tree is (((0+1)+(2+3))+(4+5)); blocks of two are subtrees of it too.
  std::vector<double> six = {1, 2, 4, 8, 16, 32};
  tree_sum_rows(six.data(), 6, 1);
  CHECK(six[0] == 63);
}

namespace {

// Images whose every get() is counted (the decodes a loader does), per dataset index.
class CountedImages : public Dataset {
public:
  explicit CountedImages(int64_t n) : gets_(size_t(n)) {}
  std::string name() const override { return "counted"; }
  int64_t size() const override { return int64_t(gets_.size()); }
  Shape shape() const override { return {1, 6, 6}; }
  int64_t num_classes() const override { return 10; }
  void get(int64_t index, float* input, int64_t* targets) const override {
    ++gets_[size_t(index)];
    for (int64_t p = 0; p < 36; ++p) input[p] = float((index * 7 + p) % 11);
    *targets = index % 10;
  }
  int64_t gets(int64_t index) const { return gets_[size_t(index)]; }

private:
  mutable std::vector<std::atomic<int64_t>> gets_;
};

}  // namespace

TEST_CASE("data loading: each rank decodes and augments only the rows of its own shards, with the values one process "
          "gives them, for classification and PGD training alike") {
  const int64_t examples = 96, batch = 24, shards = 12;
  const Transforms augment = {std::make_shared<RandomCrop>(6, 6, 2), std::make_shared<RandomHorizontalFlip>()};
  auto whole_data = std::make_shared<CountedImages>(examples);
  const Loader whole(whole_data, LoaderOptions{batch, true, false, false, 9, augment});
  const Batch reference = whole.batch(1, 2);
  // The rows train() has each rank's loader decode (rows_to_decode) for each step function.
  TrainOptions training;
  training.batch_size = batch;
  training.shards = shards;
  const Sharding sharding = sharding_of(training);
  PgdOptions pgd;
  pgd.random_start = true;
  struct Step {
    const char* name;
    TrainingStep step;
  };
  const Step steps[] = {{"classification", classification_step(training)},
                        {"pgd", adversarial_training_step(training, pgd, {0.5f}, {0.25f})}};
  for (const Step& step : steps) {
    const std::string step_name = step.name;
    CAPTURE(step_name);
    for (int64_t ranks : {1, 2, 3, 4}) {
      CAPTURE(ranks);
      const int64_t mine = shards / ranks;
      std::vector<int64_t> decodes_per_example(size_t(examples), 0);
      for (int64_t rank = 0; rank < ranks; ++rank) {
        CAPTURE(rank);
        auto data = std::make_shared<CountedImages>(examples);
        LoaderOptions options{batch, true, false, false, 9, augment};
        options.decode = rows_to_decode(step.step, sharding, rank, ranks);
        const Loader loader(data, options);
        const Batch b = loader.batch(1, 2);
        REQUIRE(b.indices == reference.indices);
        const int64_t first = rank * mine * batch / shards, last = (rank + 1) * mine * batch / shards;
        int64_t decoded = 0;
        for (int64_t row = 0; row < batch; ++row) {
          const int64_t index = b.indices[size_t(row)];
          decoded += data->gets(index);
          decodes_per_example[size_t(index)] += data->gets(index);
          const bool own = row >= first && row < last;
          CHECK(data->gets(index) == (own ? 1 : 0));
          if (own) {  // its own rows: the single process's values, augmentation included
            CHECK(slice(b.inputs, 0, row, row + 1).to_vector() == slice(reference.inputs, 0, row, row + 1).to_vector());
            CHECK(b.labels[size_t(row)] == reference.labels[size_t(row)]);
          }
        }
        CHECK(decoded == last - first);
      }
      for (int64_t index : reference.indices) CHECK(decodes_per_example[size_t(index)] == 1);  // once, on one rank
    }
  }
  // A step function that may read any row has every row decoded on every rank.
  TrainingStep reads_all = steps[0].step;
  reads_all.reads_own_shards_only = false;
  const LoaderOptions::Rows all_rows = rows_to_decode(reads_all, sharding, 2, 4);
  CHECK((all_rows.of == 1 && all_rows.first == 0 && all_rows.count == 1));
  LoaderOptions bad{batch, true, false, false, 9, augment};
  bad.decode = {4, 3, 2};
  CHECK_THROWS_WITH(Loader(whole_data, bad), doctest::Contains("parts 3 … 4 of 4"));
}

TEST_CASE("distributed: a single process is rank 0 of 1; its collectives copy its own values") {
  CHECK(distributed::rank() == 0);
  CHECK(distributed::size() == 1);
  const std::vector<float> mine = {1.5f, -2.0f};
  std::vector<float> all(2);
  distributed::allgather(mine.data(), 2, all.data());
  CHECK(all == mine);
  std::vector<float> values = {3.0f};
  distributed::broadcast(values.data(), 1);
  CHECK(values == std::vector<float>{3.0f});
  distributed::barrier();
}

TEST_CASE("training: shards of a BatchNorm model normalise themselves; their gradients and running statistics are "
          "each shard's own, combined in order") {
  // A tiny ResNet on 16 random 1×8×8 images in 4 shards of 4.
  const ModelConfig c = adjoint::testing::grey_resnet18(0.0625, 8, 3);
  const Batch batch = adjoint::testing::random_grey_batch(16, 8, 3, 7);
  auto fresh = [&] {
    Generator gen(11);
    auto model = make_model(c, gen);
    model->train(true);
    return model;
  };
  auto gradients = [](const Model& m) {
    std::vector<float> out;
    for (const Tensor& p : m.parameters()) {
      const std::vector<float> g = p.grad().to_vector();
      out.insert(out.end(), g.begin(), g.end());
    }
    return out;
  };
  auto statistics = [](const Model& m) {
    std::vector<float> out;
    for (const auto& [name, b] : m.named_buffers()) {
      const std::vector<float> v = b.to_vector();
      out.insert(out.end(), v.begin(), v.end());
    }
    return out;
  };

  auto sharded = fresh();
  const StepOutcome outcome = classification_step(*sharded, batch, 0.0f, Sharding{4, 1}, 0);
  CHECK(outcome.rows == 16);
  // Threads do not change a BatchNorm model's bits: without replicas its shards run in
  // turn; with them, 2 or 4 threads each run their shards on a model of their own.
  for (int64_t threads : {2, 4}) {
    CAPTURE(threads);
    auto in_turn = fresh(), threaded = fresh();
    classification_step(*in_turn, batch, 0.0f, Sharding{4, threads}, 0);
    std::vector<std::shared_ptr<Model>> replicas;
    classification_step(*threaded, batch, 0.0f, Sharding{4, threads}, 0, &replicas);
    CHECK(replicas.size() == size_t(threads - 1));
    CHECK(gradients(*in_turn) == gradients(*sharded));
    CHECK(gradients(*threaded) == gradients(*sharded));
    CHECK(statistics(*threaded) == statistics(*sharded));
  }

  // Each shard on a model of its own: its gradient weighted by its quarter of the rows, its
  // running statistics updated from the step's start by its own batch statistics.
  std::vector<double> gradient_sum, statistics_sum;
  for (int64_t s = 0; s < 4; ++s) {
    auto alone = fresh();
    Batch part;
    part.inputs = slice(batch.inputs, 0, 4 * s, 4 * s + 4).contiguous();
    part.labels.assign(batch.labels.begin() + 4 * s, batch.labels.begin() + 4 * s + 4);
    classification_step(*alone, part, 0.0f, 1, 0);
    const std::vector<float> g = gradients(*alone), r = statistics(*alone);
    gradient_sum.resize(g.size()), statistics_sum.resize(r.size());
    for (size_t i = 0; i < g.size(); ++i) gradient_sum[i] += 0.25 * g[i];
    for (size_t i = 0; i < r.size(); ++i) statistics_sum[i] += 0.25 * r[i];
  }
  const std::vector<float> g = gradients(*sharded), r = statistics(*sharded);
  REQUIRE(g.size() == gradient_sum.size());
  REQUIRE(r.size() == statistics_sum.size());
  double worst_gradient = 0, worst_statistic = 0, largest = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    worst_gradient = std::max(worst_gradient, std::abs(g[i] - gradient_sum[i]));
    largest = std::max(largest, std::abs(gradient_sum[i]));
  }
  for (size_t i = 0; i < r.size(); ++i) worst_statistic = std::max(worst_statistic, std::abs(r[i] - statistics_sum[i]));
  CHECK(largest > 1e-2);  // the gradient is not zero
  CHECK(worst_gradient < 1e-6 * std::max(1.0, largest) * 10);
  CHECK(worst_statistic < 1e-6);

  // Ghost batches: the whole batch normalised at once gives another gradient.
  auto whole = fresh();
  classification_step(*whole, batch, 0.0f, 1, 0);
  double difference = 0;
  const std::vector<float> gw = gradients(*whole);
  for (size_t i = 0; i < g.size(); ++i) difference = std::max(difference, double(std::abs(gw[i] - g[i])));
  CHECK(difference > 1e-4);
}

namespace {

testing::ProgramRun train_run(const std::string& args, int ranks, const TempDir& dir) {
  return adjoint_run("train " + args, ranks, dir);
}

std::map<std::string, std::vector<float>> final_weights(const std::string& run) {
  std::map<std::string, std::vector<float>> out;
  for (const auto& [name, t] : load_checkpoint(run + "/checkpoint.safetensors").model) out[name] = t.to_vector();
  return out;
}

// The figures of a run's log that must not depend on K: losses and accuracies.
std::vector<double> logged_figures(const std::string& run) {
  std::vector<double> out;
  const Json log = parse_json(read_text(run + "/log.json"));
  for (const Json& r : log.as_array())
    for (const char* key : {"train_loss", "train_accuracy", "test_loss", "test_accuracy"})
      out.push_back(r.find(key)->as_number());
  return out;
}

// Trains `model` on the squares for 4 steps of 32 in 4 shards: in one process (1 and 4
// threads) and over 2 and 4 ranks; all end with the same weights and logged figures. Then a
// run stopped after 2 steps on 4 ranks, resumed on 2, ends where the others did.
void check_same_bits_at_any_rank_count(const std::string& name, const std::string& model, const std::string& data,
                                       const TempDir& dir) {
  const std::string common = "--model " + model + " --data " + data +
                             " --batch 32 --shards 4 --epochs 1 --schedule constant --lr 0.05 --seed 3 --overwrite";
  struct Way {
    const char* name;
    int ranks;  // 0: one process, without mpirun
    const char* extra;
  };
  const Way ways[] = {{"one", 0, "--data-parallel 1 --threads 2"},
                      {"threads", 0, "--data-parallel 4 --threads 2"},
                      {"two", 2, "--threads 1"},
                      {"four", 4, "--threads 1"}};
  const std::string reference = dir.file(name + "-one");
  for (const Way& way : ways) {
    const std::string way_name = way.name;
    CAPTURE(way_name);
    const std::string out = dir.file(name + "-" + way.name);
    const testing::ProgramRun run = train_run(common + " --max-steps 4 --out " + out + " " + way.extra, way.ranks, dir);
    CAPTURE(run.output);
    REQUIRE(run.exit_code == 0);
    if (way.ranks > 1) {
      CHECK(testing::contains(run.output, cat("data parallel: ", way.ranks, " ranks")));
      CHECK(testing::contains(read_text(out + "/log.json"), cat("\"ranks\": ", way.ranks)));
    }
    if (out == reference) continue;
    CHECK(final_weights(out) == final_weights(reference));
    CHECK(logged_figures(out) == logged_figures(reference));
  }
  // The weights move from step to step: the runs above are not comparing untouched models.
  const std::string one_step = dir.file(name + "-one-step");
  REQUIRE(train_run(common + " --max-steps 1 --out " + one_step, 0, dir).exit_code == 0);
  CHECK(final_weights(one_step) != final_weights(reference));

  const std::string resumed = dir.file(name + "-resumed");
  REQUIRE(train_run(common + " --max-steps 2 --checkpoint-every 1 --out " + resumed + " --threads 1", 4, dir).exit_code ==
          0);
  const testing::ProgramRun rest = train_run(
      common + " --max-steps 4 --out " + resumed + " --resume " + resumed + "/checkpoint.safetensors --threads 1", 2, dir);
  CAPTURE(rest.output);
  REQUIRE(rest.exit_code == 0);
  CHECK(testing::contains(rest.output, "resumed from step 2"));
  CHECK(final_weights(resumed) == final_weights(reference));
}

}  // namespace

TEST_CASE("adjoint train under mpirun: the same weights at 1, 2 and 4 ranks, with threads, and after a resume at "
          "another rank count (ResNet with BatchNorm, ViT)") {
  if (mpi_tests_skipped()) return;
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  TempDir dir;
  const std::string data = write_square_images(dir);
  check_same_bits_at_any_rank_count("resnet", "resnet18 --width 0.0625", data, dir);
  check_same_bits_at_any_rank_count("vit", "vit_custom --dim 16 --depth 1 --heads 2 --patch 4", data, dir);

  // The shard count must be chosen under mpirun, and divide among the ranks.
  const testing::ProgramRun unchosen = train_run("--model resnet18 --width 0.0625 --data " + data +
                                                     " --batch 32 --max-steps 1 --out " + dir.file("x"),
                                                 2, dir);
  CHECK_MESSAGE(unchosen.exit_code == 2, unchosen.output);  // the output says how a rank ended otherwise
  CHECK(testing::contains(unchosen.output, "give --shards S, a multiple of 2"));
  const testing::ProgramRun uneven = train_run("--model resnet18 --width 0.0625 --data " + data +
                                                   " --batch 32 --shards 3 --max-steps 1 --out " + dir.file("y"),
                                               2, dir);
  CHECK_MESSAGE(uneven.exit_code == 2, uneven.output);
  CHECK(testing::contains(uneven.output, "--shards 3: not a multiple of the 2 ranks"));
  CHECK(!fs::exists(dir.file("x")));
}

TEST_CASE("adjoint train under mpirun: a run resumed from a kept checkpoint ends with the uninterrupted run's weights") {
  if (mpi_tests_skipped()) return;
  TempDir dir;
  const std::string common = "--model resnet18 --width 0.0625 --data " + write_square_images(dir) +
                             " --batch 32 --shards 2 --epochs 1 --max-steps 4 --schedule constant --lr 0.05 --seed 3 "
                             "--threads 1";
  const std::string whole = dir.file("whole"), resumed = dir.file("resumed");
  const testing::ProgramRun first = train_run(common + " --keep-checkpoints every:2 --out " + whole, 2, dir);
  CAPTURE(first.output);
  REQUIRE(first.exit_code == 0);
  const testing::ProgramRun rest =
      train_run(common + " --out " + resumed + " --resume " + whole + "/checkpoints/step_00000002.safetensors", 2, dir);
  CAPTURE(rest.output);
  REQUIRE(rest.exit_code == 0);
  CHECK(testing::contains(rest.output, "resumed from step 2"));
  CHECK(final_weights(resumed) == final_weights(whole));
}

namespace {

// The values a run's gradient exchange sums: every parameter and running statistic.
int64_t summed_values(const std::string& run) {
  int64_t n = 0;
  for (const auto& [name, t] : load_checkpoint(run + "/checkpoint.safetensors").model) n += t.numel();
  return n;
}

// 24 shards of a batch of 48 over K = 2, 3, 4 and 8 ranks (blocks of 12, 8, 6 and 3 shards:
// one subtree each where the block is a power of two, several where not) end with the
// weights of one process; each rank's exchange in a step (one bucket) costs what the
// formulas of engine/distributed/gradient_buckets.h say.
void check_reduce_scatter(const std::string& name, const std::string& model, const std::string& data,
                          const TempDir& dir) {
  const std::string common = "--model " + model + " --data " + data +
                             " --batch 48 --shards 24 --epochs 1 --schedule constant --lr 0.05 --seed 5 --overwrite "
                             "--max-steps 2 --threads 1";
  const std::string reference = dir.file(name + "-rs-one");
  REQUIRE(train_run(common + " --out " + reference, 0, dir).exit_code == 0);
  for (int ranks : {2, 3, 4, 8}) {
    CAPTURE(ranks);
    const std::string out = dir.file(name + "-rs-" + std::to_string(ranks));
    const testing::ProgramRun run = train_run(common + " --out " + out, ranks, dir);
    CAPTURE(run.output);
    REQUIRE(run.exit_code == 0);
    CHECK(final_weights(out) == final_weights(reference));
    CHECK(logged_figures(out) == logged_figures(reference));
    const Json log = parse_json(read_text(out + "/log.json"));
    const Json* per_rank = log.as_array().back().find("exchange_per_rank");
    REQUIRE(per_rank != nullptr);
    REQUIRE(per_rank->as_array().size() == size_t(ranks));
    const int64_t length = summed_values(out);
    for (int r = 0; r < ranks; ++r) {
      CAPTURE(r);
      const Json& c = per_rank->as_array()[size_t(r)];
      const ExchangeCounts expected = exchange_formula(24, ranks, r, length);
      CHECK(int64_t(c.find("bytes_sent")->as_number()) == expected.bytes_sent);
      CHECK(int64_t(c.find("receive_bytes")->as_number()) == expected.receive_bytes);
      CHECK(int64_t(c.find("additions")->as_number()) == expected.additions);
      if (ranks == 3) {  // a block of 8 shards, one subtree: the ring's bytes
        CHECK(double(expected.bytes_sent) <= 2.0 * (ranks - 1) / ranks * 4.0 * double(length) + 8.0 * ranks);
        CHECK(expected.receive_bytes <= 4 * (2 * length + ranks));
      }
    }
  }
}

}  // namespace

TEST_CASE("adjoint train under mpirun: the reduce-scatter along the shard tree gives one process's weights at K = 2, "
          "3, 4 and 8, at the formulas' cost (ResNet with BatchNorm, ViT)") {
  if (mpi_tests_skipped()) return;
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  TempDir dir;
  const std::string data = write_square_images(dir);
  check_reduce_scatter("resnet", "resnet18 --width 0.0625", data, dir);
  check_reduce_scatter("vit", "vit_custom --dim 16 --depth 1 --heads 2 --patch 4", data, dir);
}

TEST_CASE("adjoint train --adversarial pgd under mpirun: each rank attacks only its own shards, and 12 shards over "
          "K = 2, 3 and 4 ranks end with one process's weights") {
  if (mpi_tests_skipped()) return;
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  TempDir dir;
  const std::string plain = "--model resnet18 --width 0.0625 --data " + write_square_images(dir) +
                            " --batch 24 --shards 12 --epochs 1 --max-steps 2 --schedule constant --lr 0.05 --seed 4 "
                            "--threads 1 --overwrite";
  const std::string attacked = plain + " --adversarial pgd --pgd-eps 0.1 --pgd-steps 2";
  const std::string common = attacked + " --pgd-random-start";
  const std::string reference = dir.file("pgd-one");
  const testing::ProgramRun one = train_run(common + " --out " + reference, 0, dir);
  CAPTURE(one.output);
  REQUIRE(one.exit_code == 0);
  for (int ranks : {2, 3, 4}) {
    CAPTURE(ranks);
    const std::string out = dir.file("pgd-" + std::to_string(ranks));
    const testing::ProgramRun run = train_run(common + " --out " + out, ranks, dir);
    CAPTURE(run.output);
    REQUIRE(run.exit_code == 0);
    CHECK(testing::contains(run.output, cat("data parallel: ", ranks, " ranks")));
    CHECK(final_weights(out) == final_weights(reference));
    CHECK(logged_figures(out) == logged_figures(reference));
  }
  // The runs train on the attack from its random start: without the attack, or from the
  // clean image, the weights differ.
  for (const std::string& other : {plain, attacked}) {
    CAPTURE(other);
    const std::string out = dir.file("pgd-other");
    REQUIRE(train_run(other + " --out " + out, 0, dir).exit_code == 0);
    CHECK(final_weights(out) != final_weights(reference));
  }
}

TEST_CASE("adjoint train under mpirun: a rank that stops is named, with the step, within --rank-timeout") {
  TempDir dir;
  const std::string data = write_square_images(dir);
  const std::string common = "--model resnet18 --width 0.0625 --data " + data +
                             " --batch 32 --shards 4 --epochs 1 --max-steps 3 --threads 1 --overwrite";
  for (const char* bad : {"0", "-2", "nan"}) {
    const testing::ProgramRun refused = train_run(common + " --rank-timeout " + bad + " --out " + dir.file("bad"), 0, dir);
    CHECK(refused.exit_code == 2);
    CHECK(testing::contains(refused.output, "option --rank-timeout must be a positive number of seconds"));
  }
  if (mpi_tests_skipped()) return;
  const auto start = std::chrono::steady_clock::now();
  // Checkpointed after every step, inside the epoch (10 batches): the job stops in step 1.
  const testing::ProgramRun stalled =
      adjoint_run("train " + common + " --checkpoint-every 1 --rank-timeout 2 --out " + dir.file("stalled"), 2, dir,
                  "ADJOINT_TEST_RANK_STALLS_AT=1:1", /*limit_seconds=*/120);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  CAPTURE(stalled.output);
  CHECK(stalled.exit_code != 0);
  const std::string line = "rank 1 did not send its part of step 1 within 2 s (--rank-timeout)";
  const size_t at = stalled.output.find(line);
  CHECK(at != std::string::npos);
  CHECK(stalled.output.find(line, at + 1) == std::string::npos);  // said once, by the rank that waited
  CHECK(seconds < 30);
  // The checkpoint of step 1, resumed at a smaller K (one process), ends where an
  // uninterrupted run does.
  const testing::ProgramRun resumed = train_run(common + " --out " + dir.file("stalled") + " --resume " +
                                                    dir.file("stalled") + "/checkpoint.safetensors",
                                                0, dir);
  CAPTURE(resumed.output);
  REQUIRE(resumed.exit_code == 0);
  CHECK(testing::contains(resumed.output, "resumed from step 1"));
  REQUIRE(train_run(common + " --out " + dir.file("uninterrupted"), 0, dir).exit_code == 0);
  CHECK(final_weights(dir.file("stalled")) == final_weights(dir.file("uninterrupted")));

  // A rank that stops just before the one-time broadcast of the bucket order (after the
  // first step's buckets): rank 0, the root, is named by rank 1, which waited for it; rank
  // 1 is named by rank 0, which waited for it (at the broadcast, or at the step's next
  // exchange where its small message went out at once).
  struct Stall {
    const char* hook;
    const char* line;
  };
  const Stall stalls[] = {
      {"ADJOINT_TEST_RANK_STALLS_AT=0:0:bucket-order",
       "rank 1 of 2: adjoint train: train: rank 0 did not send its part of step 0 within 2 s (--rank-timeout)"},
      {"ADJOINT_TEST_RANK_STALLS_AT=1:0:bucket-order",
       "rank 0 of 2: adjoint train: train: rank 1 did not send its part of step 0 within 2 s (--rank-timeout)"},
      // And one that stops before the evaluation at the epoch's end (after step 3).
      {"ADJOINT_TEST_RANK_STALLS_AT=1:3:evaluation",
       "rank 0 of 2: adjoint train: train: rank 1 did not send its part of the evaluation after step 3 within 2 s "
       "(--rank-timeout)"},
  };
  for (const Stall& stall : stalls) {
    const std::string hook = stall.hook;
    CAPTURE(hook);
    const auto began = std::chrono::steady_clock::now();
    const testing::ProgramRun run =
        adjoint_run("train " + common + " --rank-timeout 2 --out " + dir.file("order"), 2, dir, hook, 120);
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
    CAPTURE(run.output);
    CHECK(run.exit_code != 0);
    const size_t found = run.output.find(stall.line);
    CHECK(found != std::string::npos);
    CHECK(run.output.find("did not send", found + std::strlen(stall.line)) == std::string::npos);  // once
    CHECK(took < 30);
  }
}

namespace {

int64_t count_lines_of(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

// The files of a sweep's folder that hold its results.
std::map<std::string, std::string> sweep_tables(const std::string& out) {
  std::map<std::string, std::string> files;
  for (const char* name : {"results.csv", "results.json", "results.md", "layer_map_hlm_standard.csv",
                           "layer_map_dm_invariance.csv", "layer_maps.md"})
    files[name] = read_text(out + "/" + name);
  return files;
}

// How many lines of `text` contain `what`.
int64_t lines_with(const std::string& text, const std::string& what) {
  int64_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

}  // namespace

TEST_CASE("adjoint stitch under mpirun: cells handed out over 3 ranks give the single process's tables byte for byte, "
          "and a sweep that loses a rank finishes on a rerun with the same bytes") {
  if (mpi_tests_skipped()) return;
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  TempDir dir;
  const std::string data = write_square_images(dir);
  // Two tiny ResNets, 6 steps each.
  for (const char* name : {"A", "B"}) {
    const testing::ProgramRun made = train_run("--model resnet18 --width 0.0625 --data " + data +
                                                   " --batch 32 --max-steps 6 --lr 0.05 --threads 1 --seed " +
                                                   (name[0] == 'A' ? "1" : "2") + " --out " + dir.file(name),
                                               0, dir);
    REQUIRE_MESSAGE(made.exit_code == 0, made.output);
  }
  // 2 stitch points × 2 objectives × 2 protocols = 8 cells; invariance needs the IRI sets of
  // front blocks 2 and 4, each made once.
  const std::string sweep = "stitch --front " + dir.file("A/checkpoint.safetensors") + " --end " +
                            dir.file("B/checkpoint.safetensors") +
                            " --pairs 2:2,4:3 --train-images 60 --steps 60 --batch 20 --objectives hlm,dm"
                            " --protocol standard,invariance --iri-images 10 --iri-steps 10 --threads 1 --out ";
  const testing::ProgramRun one = adjoint_run(sweep + dir.file("one"), 0, dir);
  REQUIRE_MESSAGE(one.exit_code == 0, one.output);
  const std::map<std::string, std::string> reference = sweep_tables(dir.file("one"));
  REQUIRE(count_lines_of(reference.at("results.csv")) == 9);

  const testing::ProgramRun three = adjoint_run(sweep + dir.file("three"), 3, dir);
  CAPTURE(three.output);
  REQUIRE(three.exit_code == 0);
  CHECK(sweep_tables(dir.file("three")) == reference);
  // Every cell made once, and by more than one rank; each IRI set made (drawn) once.
  CHECK(lines_with(three.output, ": stitched ") == 8);
  int ranks_that_worked = 0;
  for (int r = 0; r < 3; ++r) {
    std::stringstream lines(three.output);
    bool worked = false;
    for (std::string line; std::getline(lines, line);)
      worked |= testing::contains(line, ": stitched ") && testing::contains(line, cat("(rank ", r, ")"));
    ranks_that_worked += worked;
  }
  CHECK(ranks_that_worked >= 2);
  CHECK(lines_with(three.output, "block 2: relative distance median") == 1);
  CHECK(lines_with(three.output, "block 4: relative distance median") == 1);
  CHECK(fs::exists(dir.file("three/iris/front_block_4.png")));
  // The IRI sets are judged (and drawn) once, as in one process: here both are POOR.
  CHECK(lines_with(one.output, "is POOR") == 2);
  CHECK(lines_with(three.output, "is POOR") == 2);

  // Rank 2 dies (SIGKILL) when handed a cell after its first: with the hook set, ranks 1 and
  // 2 take the cells in turn, so rank 2 is handed cells 1 and 3 whatever the load, and dies
  // holding cell 3. mpirun ends the job; the cells finished so far stay, no tables are
  // written; the rerun makes the rest and writes the same bytes.
  const std::string cut = dir.file("cut");
  const testing::ProgramRun killed = adjoint_run(sweep + cut, 3, dir, "ADJOINT_TEST_RANK_DIES_AFTER=2:1");
  CAPTURE(killed.output);
  CHECK(killed.exit_code != 0);
  CHECK(!fs::exists(cut + "/results.csv"));
  int64_t finished = 0;
  for (const auto& entry : fs::directory_iterator(cut + "/cells")) finished += entry.path().extension() == ".json";
  CHECK(finished >= 1);
  CHECK(finished <= 4);  // cells 3, 5 and 7 are rank 2's after its first
  const testing::ProgramRun rerun = adjoint_run(sweep + cut, 3, dir);
  CAPTURE(rerun.output);
  REQUIRE(rerun.exit_code == 0);
  CHECK(lines_with(rerun.output, "done before") == finished);
  CHECK(sweep_tables(cut) == reference);
}

TEST_CASE("adjoint tensorsim --run under mpirun: checkpoint pairs over 2 ranks give the single process's tables") {
  if (mpi_tests_skipped()) return;
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  TempDir dir;
  // A depth-2 bilinear MLP: compared pair by pair (no closed form), 5 kept checkpoints, 10 pairs.
  const std::string run = dir.file("run");
  const testing::ProgramRun trained =
      adjoint_run("train --data modadd:11 --model bilinear_mlp --hidden 8 --depth 2 --epochs 1 --batch 8 "
                  "--keep-checkpoints every:1 --threads 1 --out " + run, 0, dir);
  REQUIRE_MESSAGE(trained.exit_code == 0, trained.output);
  const std::string common = "tensorsim --run " + run + " --no-baselines --threads 1 --out ";
  const testing::ProgramRun one = adjoint_run(common + dir.file("one"), 0, dir);
  REQUIRE_MESSAGE(one.exit_code == 0, one.output);
  const testing::ProgramRun two = adjoint_run(common + dir.file("two"), 2, dir);
  CAPTURE(two.output);
  REQUIRE(two.exit_code == 0);
  const std::string json = read_text(dir.file("one/run_similarity.json"));
  CHECK(!testing::contains(json, "closed form"));  // the pair loop, not the all-at-once closed form
  for (const char* name : {"run_similarity.csv", "run_similarity.json", "run_similarity.md", "pairwise_similarity.csv"})
    CHECK_MESSAGE(read_text(dir.file(std::string("two/") + name)) == read_text(dir.file(std::string("one/") + name)), name);
  // The pairs differ from one another: a matrix of copies would not test the gathering.
  const Json pairwise = *parse_json(json).find("pairwise");
  CHECK(pairwise.as_array()[0].as_array()[1].as_number() != pairwise.as_array()[0].as_array()[2].as_number());
}

TEST_CASE("adjoint bench scaling: times other processes, so only by the wall clock") {
  TempDir dir;
  const testing::ProgramRun cpu = adjoint_run("bench scaling --clock cpu", 0, dir);
  CHECK(cpu.exit_code == 2);
  CHECK(testing::contains(cpu.output, "bench scaling: --clock cpu: the ranks are other processes"));
  const testing::ProgramRun steps = adjoint_run("bench scaling --steps 0", 0, dir);
  CHECK(steps.exit_code == 2);
  CHECK(testing::contains(steps.output, "--steps expects a count >= 1, got 0"));
}

TEST_CASE("adjoint train under mpirun: gradient buckets of any size, sent while backward runs, give the same weights") {
  TempDir dir;
  const std::string data = write_square_images(dir);
  const std::string common = "--model resnet18 --width 0.0625 --data " + data +
                             " --batch 32 --shards 4 --epochs 1 --schedule constant --lr 0.05 --seed 3 --overwrite "
                             "--max-steps 3";
  // The size is checked before any work, in one process too.
  for (const char* bad : {"0", "-1", "nan", "inf"}) {
    const testing::ProgramRun refused = train_run(common + " --bucket-mib " + bad + " --out " + dir.file("bad"), 0, dir);
    CHECK(refused.exit_code == 2);
    CHECK(testing::contains(refused.output, "--bucket-mib must be a positive number of MiB"));
  }
  CHECK(!fs::exists(dir.file("bad")));
  if (mpi_tests_skipped()) return;
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  struct Way {
    const char* name;
    int ranks;  // 0: one process, without mpirun
    const char* extra;
  };
  // The reference: one process, one bucket (25 MiB holds the whole tiny ResNet).
  const Way ways[] = {{"reference", 0, "--threads 1"},
                      {"small-buckets", 0, "--threads 2 --data-parallel 2 --bucket-mib 0.001"},
                      {"two-ranks", 2, "--threads 1 --bucket-mib 0.001"},
                      {"two-ranks-mib", 2, "--threads 1 --bucket-mib 1"},
                      {"two-ranks-threads", 2, "--threads 2 --data-parallel 2 --bucket-mib 0.001"}};
  const std::string reference = dir.file("reference");
  for (const Way& way : ways) {
    const std::string way_name = way.name;
    CAPTURE(way_name);
    const std::string out = dir.file(way.name);
    const testing::ProgramRun run = train_run(common + " --out " + out + " " + way.extra, way.ranks, dir);
    CAPTURE(run.output);
    REQUIRE(run.exit_code == 0);
    if (out != reference) CHECK(final_weights(out) == final_weights(reference));
  }
}

TEST_CASE("launchers: a process srun started as one of several tasks that cannot join them refuses in one line, "
          "before any work; an sbatch script's own process runs alone") {
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  TempDir dir;
  const std::string data = write_square_images(dir);
  const std::string args = " train --model resnet18 --width 0.0625 --data " + data + " --batch 32 --max-steps 1 --out ";
  // The variables Slurm sets: srun's step (here without PMIx's PMIX_RANK), or an sbatch
  // allocation of 2 tasks whose script starts adjoint directly (no step of its own).
  auto run_with = [&](const std::string& environment, const std::string& out) {
    const std::string log = dir.file("launch.log");
    const int status = std::system(("env " + environment + " " + adjoint_exe() + args + out + " > " + log + " 2>&1").c_str());
    return testing::ProgramRun{WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(log)};
  };
  const testing::ProgramRun plain_srun =
      run_with("SLURM_JOB_ID=7 SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=1", dir.file("srun"));
  CHECK(plain_srun.exit_code == 1);
  CHECK(count_lines_of(plain_srun.output) == 1);
  CHECK(testing::contains(plain_srun.output,
                          distributed::built_with_mpi()
                              ? "srun started this adjoint as one of 2 tasks without PMI, so they cannot find each other; "
                                "launch with srun --mpi=pmix (or mpirun)"
                              : "this adjoint was built without MPI (Meson feature 'mpi'), but srun started it as one of 2"));
  CHECK(!fs::exists(dir.file("srun")));
  if (!distributed::built_with_mpi()) {  // nothing to join with: PMIx's variables do not help
    const testing::ProgramRun pmix =
        run_with("SLURM_NTASKS=2 SLURM_STEP_NUM_TASKS=2 SLURM_PROCID=0 PMIX_RANK=0", dir.file("pmix"));
    CHECK(pmix.exit_code == 1);
    CHECK(testing::contains(pmix.output, "but srun --mpi=pmix started it as one of 2 ranks"));
    CHECK(!fs::exists(dir.file("pmix")));
  }
  const testing::ProgramRun batch_script = run_with("SLURM_JOB_ID=7 SLURM_NTASKS=2 SLURM_PROCID=0", dir.file("batch"));
  CHECK_MESSAGE(batch_script.exit_code == 0, batch_script.output);
  CHECK(fs::exists(dir.file("batch/checkpoint.safetensors")));
}

TEST_CASE("adjoint train under a real one-node Slurm: srun -n 2 gives one process's weights; srun without PMI "
          "refuses in one line") {
  if (!distributed::built_with_mpi()) {
    MESSAGE("skipped: this build has no MPI");
    return;
  }
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  TempDir dir;
  const std::string script = std::string(ADJOINT_SOURCE_DIR) + "/tests/slurm_one_node.sh";
  const std::string slurm = dir.file("slurm");
  const int started = std::system((script + " start " + slurm + " > " + dir.file("slurm.out") + " 2>&1").c_str());
  const std::string said = read_text(dir.file("slurm.out"));
  struct Stop {
    std::string command;
    ~Stop() { std::system(command.c_str()); }
  } stop{script + " stop " + slurm + " > /dev/null 2>&1"};
  if (WEXITSTATUS(started) != 0) {
    REQUIRE_MESSAGE(testing::contains(said, "skip: "), said);  // installed but broken: a failure
    MESSAGE(said);
    return;
  }
  const std::string data = write_square_images(dir);
  const std::string common = "--model resnet18 --width 0.0625 --data " + data +
                             " --batch 32 --shards 4 --epochs 1 --schedule constant --lr 0.05 --seed 3 --max-steps 3";
  const std::string reference = dir.file("one");
  REQUIRE(train_run(common + " --out " + reference, 0, dir).exit_code == 0);
  auto srun = [&](const std::string& options, const std::string& out) {
    const std::string log = dir.file("srun.log");
    const std::string command = "SLURM_CONF=" + slurm + "/slurm.conf timeout 300 srun " + options +
                                " --overcommit " + adjoint_exe() + " --threads 1 train " + common + " --out " + out +
                                " > " + log + " 2>&1";
    const int status = std::system(command.c_str());
    return testing::ProgramRun{WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(log)};
  };
  const testing::ProgramRun two = srun("-n 2", dir.file("srun"));  // the test Slurm's MpiDefault is pmix
  CAPTURE(two.output);
  REQUIRE(two.exit_code == 0);
  CHECK(testing::contains(two.output, "data parallel: 2 ranks"));
  CHECK(final_weights(dir.file("srun")) == final_weights(reference));
  const testing::ProgramRun plain = srun("--mpi=none -n 2", dir.file("plain"));
  CAPTURE(plain.output);
  CHECK(plain.exit_code != 0);
  CHECK(testing::contains(plain.output, "srun started this adjoint as one of 2 tasks without PMI"));
  CHECK(!fs::exists(dir.file("plain/checkpoint.safetensors")));
}

TEST_CASE("a build without MPI: one process runs as always, and mpirun's ranks are refused with one line, nothing "
          "written") {
  // Run by adjoint_tests_without_mpi (tests/meson.build), the suite linked without MPI.
  if (distributed::built_with_mpi() || !mpirun_available()) {
    MESSAGE("skipped: ", std::string(distributed::built_with_mpi() ? "this build has MPI (adjoint_tests_without_mpi runs this)"
                                                                   : "no mpirun on PATH"));
    return;
  }
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  TempDir dir;
  const std::string data = write_square_images(dir);
  const std::string args = "train --model resnet18 --width 0.0625 --data " + data + " --batch 32 --max-steps 1";
  const testing::ProgramRun alone = adjoint_run(args + " --out " + dir.file("alone"), 0, dir);
  CHECK_MESSAGE(alone.exit_code == 0, alone.output);
  CHECK(fs::exists(dir.file("alone/checkpoint.safetensors")));

  const testing::ProgramRun ranks = adjoint_run(args + " --out " + dir.file("ranks"), 2, dir);
  CHECK(ranks.exit_code != 0);
  CHECK(testing::contains(ranks.output, "this adjoint was built without MPI (Meson feature 'mpi'), but mpirun started "
                                        "it as one of 2 ranks"));
  CHECK(!fs::exists(dir.file("ranks/checkpoint.safetensors")));
}

TEST_CASE("distributed: for_each_item with needs runs each item once, in order in one process, and refuses a need "
          "on a later item") {
  std::vector<int64_t> order;
  distributed::for_each_item(4, {{}, {0}, {0}, {1, 2}}, [&](int64_t item) { order.push_back(item); });
  CHECK(order == std::vector<int64_t>{0, 1, 2, 3});
  order.clear();
  distributed::for_each_item(3, [&](int64_t item) { order.push_back(item); });  // no needs
  CHECK(order == std::vector<int64_t>{0, 1, 2});
  auto nothing = [](int64_t) {};
  CHECK_THROWS_WITH_AS(distributed::for_each_item(2, {{1}, {}}, nothing),
                       doctest::Contains("item 0 needs item 1, not an earlier one"), Error);
  CHECK_THROWS_WITH_AS(distributed::for_each_item(2, {{}}, nothing), doctest::Contains("needs for 1 items, not 2"),
                       Error);
  // Inside a JobOfOne, this process is rank 0 of 1.
  {
    const distributed::JobOfOne alone;
    CHECK(distributed::rank() == 0);
    CHECK(distributed::size() == 1);
  }
}
