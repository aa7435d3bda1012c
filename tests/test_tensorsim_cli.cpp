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
#include "models/model_source.h"
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
    CHECK(read_text(dir.file("pair/tensorsim.csv")).rfind("measure,value,inner_product,norm_a,norm_b,compared\ntensor_similarity,", 0) == 0);
    CHECK(read_text(dir.file("pair/tensorsim.md")).find("| slice 6 |") != std::string::npos);
  }
  SUBCASE("slices are labelled with the class names of the data spec") {
    // modadd names no classes (above: "| slice 6 |"); a named data set labels the same slices.
    const CommandOutcome o =
        run_adjoint({"tensorsim", a, b, "--slices", "--no-baselines", "--data", "fashion-mnist", "--out", dir.file("named")});
    REQUIRE_MESSAGE(o.code == 0, o.err);
    CHECK(read_text(dir.file("named/tensorsim.md")).find("| slice 3 (dress) |") != std::string::npos);
    CHECK(read_text(dir.file("named/tensorsim.csv")).find("\nslice_3,") != std::string::npos);  // machine keys unchanged
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
    std::map<std::string, std::string> unchecked = file.metadata;
    unchecked.erase("tensors.crc32");  // as a file from before checksums: the finite check is what is tested
    write_safetensors(dir.file("nan.safetensors"), tensors, unchecked);
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

namespace {

// The CSV row whose first field is `measure`, split at commas.
std::vector<std::string> csv_row(const std::string& csv, const std::string& measure) {
  std::istringstream lines(csv);
  for (std::string line; std::getline(lines, line);) {
    std::vector<std::string> fields;
    std::istringstream cells(line);
    for (std::string f; std::getline(cells, f, ',');) fields.push_back(f);
    if (!fields.empty() && fields[0] == measure) return fields;
  }
  return {};
}

// A one-layer (or residual, depth 1) bilinear MLP on modadd:7 with random weights, saved.
std::string save_model(const adjoint::testing::TempDir& dir, const std::string& name, int64_t hidden, int64_t depth,
                       uint64_t seed, bool zero = false) {
  DataSource data = open_data("modadd:7");
  ModelConfig c;
  c.arch = "bilinear_mlp", c.hidden = hidden, c.depth = depth;
  fit_config_to_data(c, data);
  Generator gen(seed);
  auto m = make_model(c, gen);
  if (zero)
    for (auto& [n, t] : m->named_parameters()) t.copy_from(Tensor::from_vector(t.shape(), std::vector<float>(size_t(t.numel()), 0.0f)));
  const std::string path = dir.file(name + ".safetensors");
  save_checkpoint(path, *m, nullptr, 0, 0, {{"data.spec", "modadd:7"}});
  return path;
}

}  // namespace

TEST_CASE("tensorsim command: routes, refusals and what its tables say") {
  adjoint::testing::TempDir dir;
  SUBCASE("bilinear_mlp --depth 1 is compared by the closed form") {
    const std::string a = save_model(dir, "d1a", 6, 1, 1), b = save_model(dir, "d1b", 6, 1, 2);
    const CommandOutcome o = run_adjoint({"tensorsim", a, b, "--no-baselines", "--out", dir.file("d1")});
    REQUIRE_MESSAGE(o.code == 0, o.err);
    CHECK(o.out.find("closed form, gaussian metric") != std::string::npos);
    CHECK(o.err.find("--deep") == std::string::npos);
  }
  SUBCASE("different hidden widths: the score, and the weight cosine left out and said so") {
    const std::string a = save_model(dir, "h6", 6, 0, 1), b = save_model(dir, "h4", 4, 0, 2);
    const CommandOutcome o = run_adjoint({"tensorsim", a, b, "--out", dir.file("widths")});
    REQUIRE_MESSAGE(o.code == 0, o.err);
    CHECK(o.out.find("weight_cosine        left out: the models' parameters differ") != std::string::npos);
    const std::string csv = read_text(dir.file("widths/tensorsim.csv"));
    CHECK(csv_row(csv, "weight_cosine").empty());
    CHECK(!csv_row(csv, "cka_logits").empty());
    const Json j = parse_json(read_text(dir.file("widths/tensorsim.json")));
    CHECK(j.find("baselines_left_out")->find("weight_cosine") != nullptr);
  }
  SUBCASE("zero norms and a NaN input scale are refused, never written as nan") {
    const std::string a = save_model(dir, "a", 6, 0, 1), b = save_model(dir, "b", 6, 0, 2);
    const std::string zero = save_model(dir, "zero", 6, 0, 3, true);
    CommandOutcome o = run_adjoint({"tensorsim", zero, b, "--no-baselines", "--out", dir.file("z")});
    CHECK(o.code == 1);
    CHECK(o.err.find("zero.safetensors vs ") != std::string::npos);
    CHECK(o.err.find("has zero norm") != std::string::npos);
    // Deeper networks (the recursion): the same refusal.
    const std::string deep_zero = save_model(dir, "deep_zero", 6, 2, 4, true), deep = save_model(dir, "deep", 6, 2, 5);
    o = run_adjoint({"tensorsim", deep_zero, deep, "--no-baselines", "--out", dir.file("z")});
    CHECK(o.code == 1);
    CHECK(o.err.find("deep_zero.safetensors vs ") != std::string::npos);
    CHECK(o.err.find("undefined") != std::string::npos);
    o = run_adjoint({"tensorsim", a, a, "--diff", a, "--no-baselines", "--out", dir.file("z")});
    CHECK(o.code == 1);
    CHECK(o.err.find("has zero norm") != std::string::npos);
    o = run_adjoint({"tensorsim", a, b, "--input-std", "nan", "--no-baselines", "--out", dir.file("z")});
    CHECK(o.code == 2);
    CHECK(o.err.find("--input-std must be a positive finite number, got nan") != std::string::npos);
    CHECK(!fs::exists(dir.file("z")));
  }
  SUBCASE("the CSV holds full precision, the raw inner products and both norms") {
    const std::string a = save_model(dir, "a", 6, 0, 1), b = save_model(dir, "b", 5, 0, 2);
    const CommandOutcome o = run_adjoint({"tensorsim", a, b, "--slices", "--no-baselines", "--out", dir.file("csv")});
    REQUIRE_MESSAGE(o.code == 0, o.err);
    auto ma = model_from_checkpoint(load_checkpoint(a)), mb = model_from_checkpoint(load_checkpoint(b));
    const TensorSimScore want = tensor_similarity(*ma, *mb, TensorSimOptions{});
    const std::string csv = read_text(dir.file("csv/tensorsim.csv"));
    const std::vector<std::string> total = csv_row(csv, "tensor_similarity");
    REQUIRE(total.size() == 6);
    CHECK(std::stod(total[1]) == want.total);  // bit for bit: 17 significant digits round-trip
    CHECK(std::stod(total[2]) == want.inner_ab);
    CHECK(std::stod(total[3]) == std::sqrt(want.inner_aa));
    CHECK(std::stod(total[4]) == std::sqrt(want.inner_bb));
    CHECK(std::stod(csv_row(csv, "slice_2")[1]) == want.slices[2]);
    CHECK(std::stod(csv_row(csv, "slice_2")[2]) == want.slice_ab[2]);
    CHECK(!csv_row(csv, "tensor_similarity_identity").empty());  // the other metrics beside it
  }
  SUBCASE("with --diff the baselines say that they compare A and B themselves") {
    const std::string a = save_model(dir, "a", 6, 0, 1), b = save_model(dir, "b", 6, 0, 2), a0 = save_model(dir, "a0", 6, 0, 3);
    const CommandOutcome o = run_adjoint({"tensorsim", a, b, "--diff", a0, "--out", dir.file("diff")});
    REQUIRE_MESSAGE(o.code == 0, o.err);
    CHECK(o.out.find("baselines between A and B themselves") != std::string::npos);
    const std::string csv = read_text(dir.file("diff/tensorsim.csv"));
    CHECK(csv_row(csv, "cka_logits").back() == "A vs B");
    CHECK(csv_row(csv, "tensor_similarity").back().rfind("A - ", 0) == 0);
    CHECK(parse_json(read_text(dir.file("diff/tensorsim.json"))).find("baselines_compare")->as_string() == "A vs B");
  }
  SUBCASE("a plain weights file: no hint at options tensorsim lacks") {
    write_safetensors(dir.file("plain.safetensors"), {{"w", Tensor::from_vector({2}, {1.0f, 2.0f})}}, {});
    const std::string b = save_model(dir, "b", 6, 0, 2);
    const CommandOutcome o = run_adjoint({"tensorsim", dir.file("plain.safetensors"), b});
    CHECK(o.code == 1);
    CHECK(o.err.find("not an adjoint checkpoint") != std::string::npos);
    CHECK(o.err.find("--weights") == std::string::npos);
  }
  SUBCASE("--run names both checkpoints of a pair that cannot be compared") {
    const std::string run = dir.file("run");
    train_tiny_run(run, 1);
    // The last kept checkpoint replaced by a model of another input size.
    DataSource data = open_data("modadd:5");
    ModelConfig c;
    c.arch = "bilinear_mlp", c.hidden = 8;
    fit_config_to_data(c, data);
    Generator gen(0);
    save_checkpoint(kept_checkpoint_path(run, 9), *make_model(c, gen), nullptr, 0, 9, {{"data.spec", "modadd:7"}});
    const CommandOutcome o = run_adjoint({"tensorsim", "--run", run, "--no-baselines"});
    CHECK(o.code == 1);
    CAPTURE(o.err);
    CHECK(o.err.find(fs::path(kept_checkpoint_path(run, 9)).filename().string()) != std::string::npos);
    CHECK(o.err.find("cannot be compared") != std::string::npos);
  }
}

TEST_CASE("tensorsim command: the data metric reads the mean and covariance of the --count test examples") {
  adjoint::testing::TempDir dir;
  const std::string a = save_model(dir, "a", 6, 0, 1), b = save_model(dir, "b", 5, 0, 2);
  const CommandOutcome o = run_adjoint({"tensorsim", a, b, "--metric", "data", "--count", "20", "--out", dir.file("data")});
  REQUIRE_MESSAGE(o.code == 0, o.err);
  const Examples ex = load_examples(open_data("modadd:7", DataSplits::TestOnly), "test", 20);
  Matrix64 rows(ex.inputs.size(0), ex.inputs.numel() / ex.inputs.size(0));
  const std::vector<float> v = ex.inputs.contiguous().to_vector();
  std::copy(v.begin(), v.end(), rows.data.begin());
  const InputDistribution moments = input_distribution(rows);
  TensorSimOptions options;
  options.metric = "data", options.data = &moments;
  auto ma = model_from_checkpoint(load_checkpoint(a)), mb = model_from_checkpoint(load_checkpoint(b));
  const TensorSimScore want = tensor_similarity(*ma, *mb, options);
  const Json j = parse_json(read_text(dir.file("data/tensorsim.json")));
  CHECK(j.find("method_detail")->as_string() == "closed form, data metric");
  CHECK(j.find("tensor_similarity")->as_number() == doctest::Approx(want.total).epsilon(1e-12));
  // Beside it, the other metrics; the Gaussian one differs.
  const double gaussian = j.find("other_metrics")->find("gaussian")->as_number();
  CHECK(gaussian == doctest::Approx(tensor_similarity(*ma, *mb, TensorSimOptions{}).total).epsilon(1e-12));
  CHECK(std::abs(gaussian - want.total) > 1e-3);
  // On all test examples the statistics (and so the score) differ from those of the first 20.
  const CommandOutcome all = run_adjoint({"tensorsim", a, b, "--metric", "data", "--count", "0", "--no-baselines", "--out", dir.file("all")});
  REQUIRE_MESSAGE(all.code == 0, all.err);
  CHECK(std::abs(parse_json(read_text(dir.file("all/tensorsim.json"))).find("tensor_similarity")->as_number() - want.total) > 1e-6);
}

TEST_CASE("tensorsim command: a bad --check-mc is refused before any score is printed") {
  adjoint::testing::TempDir dir;
  const std::string a = dir.file("a"), b = dir.file("b");
  adjoint::testing::train_tiny_bilinear(1, [&](TrainOptions& o) { o.out_dir = a; });
  adjoint::testing::train_tiny_bilinear(2, [&](TrainOptions& o) { o.out_dir = b; });
  const std::string ca = a + "/checkpoint.safetensors", cb = b + "/checkpoint.safetensors";
  for (const auto& [words, message] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"--check-mc", "1"}, "--check-mc expects 0 (none) or 2 to 100000000 samples, got 1"},
           {{"--check-mc", "-5"}, "--check-mc expects 0 (none) or 2 to 100000000 samples, got -5"},
           {{"--check-mc", "1000000000000"}, "--check-mc expects 0 (none) or 2 to 100000000 samples, got 1000000000000"},
           {{"--check-mc", "100", "--metric", "identity"}, "--check-mc samples the Gaussian metric with the bias coordinate"},
           {{"--check-mc", "100", "--no-bias"}, "--check-mc samples the Gaussian metric with the bias coordinate"}}) {
    std::vector<std::string> command = {"tensorsim", ca, cb, "--no-baselines"};
    command.insert(command.end(), words.begin(), words.end());
    const CommandOutcome o = run_adjoint(command);
    CAPTURE(message);
    CAPTURE(o.err);
    CHECK(o.code == 2);
    CHECK(adjoint::testing::contains(o.err, message));
    CHECK(o.out.empty());  // refused before the score
  }
}
