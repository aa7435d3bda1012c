// `adjoint tensorsim` end to end (tools/tensorsim.cpp) on tiny bilinear models trained here
// on modular addition: its numbers are the library's, its files are complete, and bad
// input is one line with the right exit code.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include "analysis/similarity/model_similarity.h"
#include "engine/io/json.h"
#include "engine/io/safetensors.h"
#include "engine/threads.h"
#include "models/checkpoint.h"
#include "models/training.h"
#include "tests/support.h"

using namespace adjoint;
using adjoint::testing::CommandOutcome;
using adjoint::testing::run_adjoint;
using adjoint::testing::read_text;
namespace fs = std::filesystem;

namespace {

// A run of a tiny bilinear MLP on modadd:7, 3 epochs of 3 steps, keeping a checkpoint every 3 steps.
void train_tiny_run(const std::string& dir, uint64_t seed) {
  adjoint::testing::train_tiny_bilinear(seed, [&](TrainOptions& o) {
    o.epochs = 3, o.out_dir = dir, o.keep_checkpoints = "every:3";
  });
}

}  // namespace

TEST_CASE("tensorsim command: a pair, a run, and bad input") {
  adjoint::testing::TempDir dir;
  const std::string run = dir.file("run"), other = dir.file("other");
  train_tiny_run(run, 1);
  train_tiny_run(other, 2);
  const std::string a = kept_checkpoint_path(run, 3), b = kept_checkpoint_path(other, 9);

  SUBCASE("a pair: the library's numbers, with slices and baselines, in three formats") {
    const CommandOutcome o = run_adjoint({"tensorsim", a, b, "--slices", "--out", dir.file("pair")});
    REQUIRE_MESSAGE(o.code == 0, o.err);
    const Json j = parse_json(read_text(dir.file("pair/tensorsim.json")));
    auto ma = model_from_checkpoint(load_checkpoint(a)), mb = model_from_checkpoint(load_checkpoint(b));
    const TensorSimScore want = tensor_similarity(*ma, *mb, TensorSimOptions{});
    CHECK(j.find("tensor_similarity")->as_number() == doctest::Approx(want.total).epsilon(1e-12));
    REQUIRE(j.find("slices")->size() == 7);
    CHECK(j.find("slices")->as_array()[3].as_number() == doctest::Approx(want.slices[3]).epsilon(1e-12));
    CHECK(j.find("baselines")->find("cka_logits") != nullptr);
    CHECK(read_text(dir.file("pair/tensorsim.csv")).rfind("measure,value\ntensor_similarity,", 0) == 0);
    CHECK(read_text(dir.file("pair/tensorsim.md")).find("| slice 6 |") != std::string::npos);
  }
  SUBCASE("a difference tensor: (A - A0) against B") {
    const std::string a0 = kept_checkpoint_path(run, 6);
    const CommandOutcome o = run_adjoint({"tensorsim", a, b, "--diff", a0, "--no-baselines", "--out", dir.file("diff")});
    REQUIRE_MESSAGE(o.code == 0, o.err);
    const Json j = parse_json(read_text(dir.file("diff/tensorsim.json")));
    CHECK(j.find("diff_reference")->as_string() == a0);
    auto ma = model_from_checkpoint(load_checkpoint(a)), mb = model_from_checkpoint(load_checkpoint(b));
    auto m0 = model_from_checkpoint(load_checkpoint(a0));
    const double want = tensor_similarity(*ma, *mb, TensorSimOptions{}, m0.get()).total;
    CHECK(j.find("tensor_similarity")->as_number() == doctest::Approx(want).epsilon(1e-12));
    CHECK(std::abs(want - tensor_similarity(*ma, *mb, TensorSimOptions{}).total) > 1e-3);  // not the plain score
  }
  SUBCASE("a run: every checkpoint against the last and each other") {
    const CommandOutcome o = run_adjoint({"tensorsim", "--run", run, "--no-baselines"});
    REQUIRE_MESSAGE(o.code == 0, o.err);
    const std::vector<std::string> files = {"run_similarity.csv", "run_similarity.json", "run_similarity.md",
                                            "pairwise_similarity.csv", "pairwise_similarity.png",
                                            "similarity_over_steps.png"};
    for (const std::string& f : files) CHECK_MESSAGE(fs::exists(run + "/tensorsim/" + f), f);
    const Json j = parse_json(read_text(run + "/tensorsim/run_similarity.json"));
    const auto& rows = j.find("checkpoints")->as_array();
    REQUIRE(rows.size() == 3);  // steps 3, 6, 9
    CHECK(rows[2].find("tensor_similarity_to_last")->as_number() == doctest::Approx(1.0));
    auto m3 = model_from_checkpoint(load_checkpoint(kept_checkpoint_path(run, 3)));
    auto m6 = model_from_checkpoint(load_checkpoint(kept_checkpoint_path(run, 6)));
    CHECK(j.find("pairwise")->as_array()[0].as_array()[1].as_number() ==
          doctest::Approx(tensor_similarity(*m3, *m6, TensorSimOptions{}).total).epsilon(1e-12));
  }
  SUBCASE("bad input: one line naming the file, the folder or the option") {
    CommandOutcome o = run_adjoint({"tensorsim", "--run", dir.file("nowhere")});
    CHECK(o.code == 1);
    CHECK(o.err.find("no checkpoints folder") != std::string::npos);
    o = run_adjoint({"tensorsim", a, b, "--metric", "cosine"});
    CHECK(o.code == 2);
    CHECK(o.err.find("unknown metric 'cosine'") != std::string::npos);
    o = run_adjoint({"tensorsim", a});
    CHECK(o.code == 2);
    // NaN weights: the file and the layer are named.
    const SafetensorsFile file = read_safetensors(a);
    std::map<std::string, Tensor> tensors = file.tensors;
    Tensor poisoned = tensors.at("model.bilinear.left").clone();
    poisoned.data()[5] = NAN;
    tensors["model.bilinear.left"] = poisoned;
    write_safetensors(dir.file("nan.safetensors"), tensors, file.metadata);
    o = run_adjoint({"tensorsim", dir.file("nan.safetensors"), b});
    CHECK(o.code == 1);
    CAPTURE(o.err);
    CHECK(o.err.find("nan.safetensors (bilinear_mlp): tensor 'bilinear.left' holds 1 NaN") != std::string::npos);
    // A model of another shape: the files are named.
    DataSource data = open_data("modadd:5");
    ModelConfig c;
    c.arch = "bilinear_mlp", c.hidden = 8;
    fit_config_to_data(c, data);
    Generator gen(0);
    auto small = make_model(c, gen);
    save_checkpoint(dir.file("small.safetensors"), *small, nullptr, 0, 0, {{"data.spec", "modadd:5"}});
    o = run_adjoint({"tensorsim", dir.file("small.safetensors"), b, "--no-baselines"});
    CHECK(o.code == 1);
    CHECK(o.err.find("small.safetensors vs ") != std::string::npos);
    CHECK(o.err.find("cannot be compared") != std::string::npos);
  }
}
