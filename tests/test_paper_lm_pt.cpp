// The tensor-similarity paper's LM checkpoints as torch.save'd state dicts (the .pt files its
// code ships): read through the one state-dict reader (engine/io/state_dict_file.h), the same
// tensors as the safetensors fixture, the same logits, and `tensorsim --run` over a folder of
// checkpoints/step_*.pt. tests/goldens/paper_lm.pt is written by gen_paper_lm_pt.py.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>

#include "engine/io/json.h"
#include "engine/io/safetensors.h"
#include "engine/io/state_dict_file.h"
#include "models/paper_lm.h"
#include "tests/support.h"

using namespace adjoint;
namespace fs = std::filesystem;

namespace {
const std::string kPaperLmPt = std::string(ADJOINT_SOURCE_DIR) + "/tests/goldens/paper_lm.pt";
}  // namespace

TEST_CASE("paper LM: a torch.save'd state dict holds the fixture's tensors and gives PyTorch's logits") {
  const SafetensorsFile pt = read_state_dict(kPaperLmPt);
  const SafetensorsFile& st = adjoint::testing::fixture("paper_lm");
  REQUIRE(pt.tensors.size() == st.tensors.size());
  for (const auto& [name, t] : st.tensors) {
    REQUIRE(pt.tensors.count(name) == 1);
    CHECK(pt.tensors.at(name).shape() == t.shape());
    CHECK(pt.tensors.at(name).to_vector() == t.to_vector());
  }
  const SafetensorsFile& expected = adjoint::testing::fixture("paper_lm_logits");
  auto model = paper_lm_model(pt.tensors, {2, 0.35}, "paper_lm.pt");
  const std::vector<float> ours = model->forward(expected.tensors.at("tokens")).to_vector(),
                           theirs = expected.tensors.at("logits").to_vector();
  REQUIRE(ours.size() == theirs.size());
  for (size_t i = 0; i < ours.size(); ++i) CHECK(ours[i] == doctest::Approx(theirs[i]).epsilon(1e-5).scale(1e-3));
}

TEST_CASE("paper LM: tensorsim --run over a folder of checkpoints/step_*.pt") {
  adjoint::testing::TempDir dir;
  const std::string run = dir.file("run");
  fs::create_directories(run + "/checkpoints");
  std::ofstream(run + "/config.json")
      << R"({"model": {"vocab_size": 11, "d_model": 8, "n_head": 2, "n_layers": 2, "attn_scale": 0.35, "use_bias_qk": true, "attn_type": "bilinear"}})";
  // The same weights under two steps, unpadded names (step_5 sorts before step_40).
  fs::copy_file(kPaperLmPt, run + "/checkpoints/step_40.pt");
  fs::copy_file(kPaperLmPt, run + "/checkpoints/step_5.pt");
  const adjoint::testing::CommandOutcome o = adjoint::testing::run_adjoint(
      {"tensorsim", "--run", run, "--out", dir.file("out"), "--positions", "2", "--tolerance", "0.05", "--input-std", "0.2"});
  REQUIRE_MESSAGE(o.code == 0, o.err);
  const std::string matrix = adjoint::testing::read_text(dir.file("out/pairwise_similarity.csv"));
  MESSAGE(matrix);
  CHECK(matrix.find("\n5,") < matrix.find("\n40,"));
  // A network against itself: cosine 1 whatever the draws.
  const Json j = parse_json(adjoint::testing::read_text(dir.file("out/run_similarity.json")));
  CHECK(adjoint::testing::contains(j.find("method")->as_string(), "monte-carlo"));
  CHECK(matrix.find("1,1\n") != std::string::npos);
}

TEST_CASE("paper LM: tensorsim --run says how many pairs' intervals the tail diagnostic marks unreliable") {
  // The fixture against itself with its last layer's output halved, at input std 0.25: its
  // draws stay heavy-tailed, importance-sampled directions or not (analysis/results/monte_carlo_tails.md).
  // Without tempering, which would replace the marked estimate (at minutes' cost).
  adjoint::testing::TempDir dir;
  const std::string run = dir.file("run");
  fs::create_directories(run + "/checkpoints");
  std::ofstream(run + "/config.json") << R"({"n_head": 2})";
  std::map<std::string, Tensor> halved = read_state_dict(kPaperLmPt).tensors;
  std::vector<float> w = halved.at("layers.1.o.weight").to_vector();
  for (float& x : w) x *= 0.5f;
  halved["layers.1.o.weight"] = Tensor::from_vector({8, 8}, w);
  fs::copy_file(kPaperLmPt, run + "/checkpoints/step_1.pt");
  write_safetensors(run + "/checkpoints/step_2.safetensors", halved, {});
  const adjoint::testing::CommandOutcome o = adjoint::testing::run_adjoint(
      {"tensorsim", "--run", run, "--out", dir.file("out"), "--tolerance", "0.05", "--input-std", "0.25",
       "--no-tempering"});
  REQUIRE_MESSAGE(o.code == 0, o.err);
  const Json j = parse_json(adjoint::testing::read_text(dir.file("out/run_similarity.json")));
  MESSAGE(j.find("method")->as_string());
  CHECK(adjoint::testing::contains(j.find("method")->as_string(), "NO reliable interval"));
  CHECK(adjoint::testing::contains(j.find("method")->as_string(), "1 of 1 pairs marked unreliable"));
}
