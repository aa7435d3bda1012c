// Checkpoints kept over a training run for later analysis (--keep-checkpoints): the schedule
// and the files a run leaves.
#include <doctest/doctest.h>

#include <filesystem>

#include "engine/error.h"
#include "models/checkpoint.h"
#include "models/training.h"
#include "tests/support.h"

using namespace adjoint;

TEST_CASE("kept checkpoints: every:N and log:K schedules") {
  CHECK(checkpoint_steps("every:3", 10) == std::vector<int64_t>{3, 6, 9, 10});
  CHECK(checkpoint_steps("every:5", 10) == std::vector<int64_t>{5, 10});
  // log:K: round(total^(i/(K-1))), i = 0..K-1: 1000^(0, 1/3, 2/3, 1) = 1, 10, 100, 1000.
  CHECK(checkpoint_steps("log:4", 1000) == std::vector<int64_t>{1, 10, 100, 1000});
  // Coinciding steps appear once: 4^(i/4) rounds to 1, 1, 2, 3, 4.
  CHECK(checkpoint_steps("log:5", 4) == std::vector<int64_t>{1, 2, 3, 4});
  for (const char* bad : {"every:0", "log:1", "every", "sometimes:3", "every:3x"}) {
    CAPTURE(bad);
    CHECK_THROWS_WITH_AS(checkpoint_steps(bad, 10), doctest::Contains("expected every:N (N ≥ 1) or log:K (K ≥ 2)"),
                         UsageError);
  }
}

TEST_CASE("kept checkpoints: a run leaves one loadable checkpoint per scheduled step") {
  adjoint::testing::TempDir dir;
  const std::string out = dir.path().string();
  auto model = adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) {
    o.out_dir = out;  // 2 epochs of 3 steps
    o.keep_checkpoints = "every:4";
  });
  for (int64_t step : {4, 6}) {
    CAPTURE(step);
    REQUIRE(std::filesystem::exists(kept_checkpoint_path(out, step)));
    CHECK(load_checkpoint(kept_checkpoint_path(out, step)).step == step);
  }
  CHECK(!std::filesystem::exists(kept_checkpoint_path(out, 3)));
  // The last kept checkpoint holds the final weights.
  const Checkpoint last = load_checkpoint(kept_checkpoint_path(out, 6));
  for (const auto& [name, t] : model->state_dict()) CHECK(last.model.at(name).to_vector() == t.to_vector());
}

TEST_CASE("continue-from: a new run starts where another stopped, on its own data") {
  adjoint::testing::TempDir dir;
  auto run = [&](const std::string& out, int64_t epochs, const std::string& from) {
    return adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) {
      o.weight_decay = 0.1, o.epochs = epochs, o.out_dir = dir.file(out), o.continue_from = from;
    });
  };
  run("first", 2, "");
  auto continued = run("second", 3, dir.file("first/checkpoint.safetensors"));
  auto straight = run("straight", 3, "");
  // Same data, so the continued run is the uninterrupted one, bit for bit.
  for (const auto& [name, t] : straight->state_dict()) CHECK(continued->state_dict().at(name).to_vector() == t.to_vector());
  CHECK(load_checkpoint(dir.file("second/checkpoint.safetensors")).step == 9);
  CHECK_THROWS_WITH_AS(run("third", 2, dir.file("second/checkpoint.safetensors")),
                       doctest::Contains("the checkpoint is at step 9, this run ends at step 6"), Error);
}

TEST_CASE("kept checkpoints: a run resumed from any kept step ends with the uninterrupted run's weights") {
  adjoint::testing::TempDir dir;
  const std::string out = dir.file("run");
  auto straight = adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) {
    o.out_dir = out;  // 2 epochs of 3 steps, AdamW: the moments must be kept too
    o.keep_checkpoints = "every:2";
  });
  for (int64_t step : {2, 4}) {  // before and after the first epoch's checkpoint.safetensors
    CAPTURE(step);
    const std::string resumed_out = dir.file("resumed_" + std::to_string(step));
    auto resumed = adjoint::testing::train_tiny_bilinear(0, [&](TrainOptions& o) {
      o.out_dir = resumed_out;
      o.resume = kept_checkpoint_path(out, step);
    });
    for (const auto& [name, t] : straight->state_dict()) CHECK(resumed->state_dict().at(name).to_vector() == t.to_vector());
  }
}
