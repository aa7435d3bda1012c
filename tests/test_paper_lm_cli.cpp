// `adjoint tensorsim` over the tensor-similarity paper's LM checkpoints (models/paper_lm.h):
// a folder laid out as the paper's code downloads it (config.json beside checkpoints/), its
// files written here from the golden fixture's random weights in the paper's names. Every
// number is a Monte Carlo estimate with its standard error: the library's for the views read
// from the files, and, where the answer is known (a network against itself rescaled: cosine 1,
// ⟨A|B⟩/⟨A|A⟩ the scale), that answer. Bad folders are refused in one line.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "analysis/similarity/monte_carlo.h"
#include "engine/io/json.h"
#include "engine/io/safetensors.h"
#include "engine/io/table.h"
#include "models/paper_lm.h"
#include "tests/support.h"

using namespace adjoint;
using adjoint::testing::CommandOutcome;
using adjoint::testing::fixture;
using adjoint::testing::golden;
using adjoint::testing::read_text;
using adjoint::testing::run_adjoint;
namespace fs = std::filesystem;

namespace {

using State = std::map<std::string, Tensor>;

State scaled(State s, const std::string& name, float by) {
  std::vector<float> w = s.at(name).to_vector();
  for (float& x : w) x *= by;
  s[name] = Tensor::from_vector(s.at(name).shape(), w);
  return s;
}

const char* kConfig =
    R"({"model": {"vocab_size": 11, "d_model": 8, "n_head": 2, "n_layers": 2, "n_ctx": 512, "attn_scale": 0.35,)"
    R"( "use_bias_qk": true, "attn_type": "bilinear"}})";

void write_text(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

// A folder of three checkpoints: the fixture with the second layer's output at 0, ½ and 1.
std::string write_run(const adjoint::testing::TempDir& dir, const std::string& name) {
  const State& base = fixture("paper_lm").tensors;
  const std::string run = dir.file(name);
  fs::create_directories(run + "/checkpoints");
  write_text(run + "/config.json", kConfig);
  write_safetensors(run + "/checkpoints/step_00000.safetensors", scaled(base, "layers.1.o.weight", 0.0f), {});
  write_safetensors(run + "/checkpoints/step_00100.safetensors", scaled(base, "layers.1.o.weight", 0.5f), {});
  write_safetensors(run + "/checkpoints/step_01000.safetensors", base, {});
  return run;
}

std::vector<std::vector<double>> csv_matrix(const std::string& text) {
  std::vector<std::vector<double>> rows;
  std::istringstream in(text);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::vector<double> row;
    const std::vector<std::string> cells = csv_fields(line);
    for (size_t i = 1; i < cells.size(); ++i) row.push_back(std::stod(cells[i]));
    rows.push_back(row);
  }
  return rows;
}

bool one_line(const std::string& err) { return !err.empty() && err.find('\n') == err.size() - 1; }

// A usage error's own line (the usage and the pointer to --help stand around it).
std::string error_line(const std::string& err) {
  const size_t at = err.find("adjoint: error: ");
  return at == std::string::npos ? "" : err.substr(at, err.find('\n', at) - at);
}

}  // namespace

TEST_CASE("paper LM: the model's forward gives PyTorch's logits") {
  const SafetensorsFile& weights = fixture("paper_lm");
  const Tensor tokens = golden("paper_lm_logits", "tokens"), logits = golden("paper_lm_logits", "logits");
  auto model = paper_lm_model(weights.tensors, {2, 0.35}, "paper_lm.safetensors");
  const std::vector<float> ours = model->forward(tokens).to_vector(), theirs = logits.to_vector();
  REQUIRE(ours.size() == theirs.size());
  double worst = 0, largest = 0;
  for (size_t i = 0; i < ours.size(); ++i)
    worst = std::max(worst, double(std::abs(ours[i] - theirs[i]))), largest = std::max(largest, double(std::abs(theirs[i])));
  CHECK(largest > 0.1);
  CHECK(worst <= 1e-5 * largest);
  CHECK(model->num_blocks() == 2);  // the residual stream, then the unembedding: what CKA reads
}

TEST_CASE("paper LM: tensorsim --run over a folder of the paper's checkpoints, every number with its interval") {
  adjoint::testing::TempDir dir;
  const std::string run = write_run(dir, "run"), out = dir.file("out");
  const double input_std = 1 / std::sqrt(11.0);
  // Without tempering, which would replace marked estimates at minutes' cost.
  const CommandOutcome o = run_adjoint({"tensorsim", "--run", run, "--out", out, "--positions", "3", "--tolerance", "0.02",
                                        "--input-std", cat(input_std), "--no-tempering"});
  REQUIRE_MESSAGE(o.code == 0, o.err);
  CHECK(adjoint::testing::contains(o.out, "test loss, accuracy and CKA left out"));
  const Json j = parse_json(read_text(out + "/run_similarity.json"));
  CHECK(adjoint::testing::contains(j.find("method")->as_string(), "monte-carlo"));
  CHECK(adjoint::testing::contains(j.find("method")->as_string(), "'layers.0.attention'"));
  const auto sim = csv_matrix(read_text(out + "/pairwise_similarity.csv"));
  const auto se = csv_matrix(read_text(out + "/pairwise_similarity_se.csv"));
  REQUIRE(sim.size() == 3);
  REQUIRE(se.size() == 3);
  for (size_t i = 0; i < 3; ++i) {
    CHECK(sim[i][i] == 1.0);
    CHECK(se[i][i] == 0.0);
    for (size_t j2 = 0; j2 < 3; ++j2)
      if (j2 != i) {
        CHECK(se[i][j2] > 0);
        CHECK(se[i][j2] <= 0.02);
        CHECK(sim[i][j2] == sim[j2][i]);
        CHECK(std::abs(sim[i][j2]) < 1.0);
      }
  }
  CHECK(read_text(out + "/run_similarity.md").find("left out") != std::string::npos);
  // The page's matrix: every sampled pair as estimate ± standard error, from the CSVs' numbers.
  const std::string page = read_text(out + "/run_similarity.md");
  for (size_t i = 0; i < 3; ++i)
    for (size_t j2 = i + 1; j2 < 3; ++j2) {
      char cell[64];
      std::snprintf(cell, sizeof cell, "| %.4f ± %.4f |", sim[i][j2], se[i][j2]);
      CHECK_MESSAGE(adjoint::testing::contains(page, cell), "no cell ", cell, " in\n", page);
    }
  // The last pair is the library's sized estimate of the views read from the files: the same
  // number for the same draws (pair (1, 2) of three draws with seed 1 + 2), to rounding.
  const State& base = fixture("paper_lm").tensors;
  const PolynomialView a = paper_lm_view(scaled(base, "layers.1.o.weight", 0.5f), {2, 0.35}, 3, "a");
  const PolynomialView b = paper_lm_view(base, {2, 0.35}, 3, "b");
  MonteCarloPlan plan;
  plan.tolerance = 0.02, plan.input_std = input_std, plan.seed = 3, plan.tempering = false;
  const MonteCarloSimilarity direct = monte_carlo_sized(a, b, plan);
  CHECK(sim[1][2] == doctest::Approx(direct.similarity).epsilon(1e-4));  // summed in another order
  CHECK(se[1][2] == doctest::Approx(direct.similarity_se).epsilon(1e-3));
}

TEST_CASE("paper LM: the pair form, a network against itself rescaled, and the routes that refuse it") {
  adjoint::testing::TempDir dir;
  const std::string run = write_run(dir, "run");
  const std::string a = run + "/checkpoints/step_01000.safetensors", b = dir.file("b.safetensors");
  // B: A's unembedding doubled and its final norm's energy 2.5 → 0.9: f_B = c·f_A with c known.
  State sb = scaled(fixture("paper_lm").tensors, "unembed.weight", 2.0f);
  sb["final_norm.running_mean_energy"] = Tensor::from_vector({1}, {0.9f});
  write_safetensors(b, sb, {});
  const double c = 2.0 * std::sqrt(2.5 + 1e-6) / std::sqrt(0.9 + 1e-6);
  const CommandOutcome o =
      run_adjoint({"tensorsim", a, b, "--config", run + "/config.json", "--positions", "2", "--out", dir.file("pair"), "--no-tempering"});
  REQUIRE_MESSAGE(o.code == 0, o.err);
  CHECK(adjoint::testing::contains(o.out, "baselines left out"));
  const Json j = parse_json(read_text(dir.file("pair/tensorsim.json")));
  CHECK(j.find("method")->as_string() == "monte-carlo");
  CHECK(j.find("tensor_similarity")->as_number() == doctest::Approx(1.0).epsilon(1e-9));
  const double na = j.find("norm_a")->as_number(), nb = j.find("norm_b")->as_number();
  CHECK(na > 0);
  CHECK(j.find("inner_ab")->as_number() / (na * na) == doctest::Approx(c).epsilon(1e-6));
  CHECK(nb / na == doctest::Approx(c).epsilon(1e-6));

  SUBCASE("the exact routes and the recursion refuse it, naming the layer") {
    const std::string config = run + "/config.json";
    const CommandOutcome id = run_adjoint({"tensorsim", a, b, "--config", config, "--metric", "identity", "--positions", "2"});
    CHECK(id.code == 2);
    CHECK(adjoint::testing::contains(error_line(id.err), "identity metric at depth does not take attention with QK biases or rotary positions ('layers.0.attention')"));
    const CommandOutcome rec = run_adjoint({"tensorsim", a, b, "--config", config, "--recursion", "--positions", "2"});
    CHECK(rec.code == 2);
    CHECK(adjoint::testing::contains(error_line(rec.err), "--recursion; the recursion does not take attention with QK biases or rotary positions ('layers.0.attention')"));
  }
}

TEST_CASE("paper LM: a bad folder is refused in one line") {
  adjoint::testing::TempDir dir;
  const std::string run = write_run(dir, "run");
  SUBCASE("no config.json") {
    fs::remove(run + "/config.json");
    const CommandOutcome o = run_adjoint({"tensorsim", "--run", run, "--positions", "2"});
    CHECK(o.code == 1);
    CHECK(one_line(o.err));
    CHECK(adjoint::testing::contains(o.err, "step_00000.safetensors: not an adjoint checkpoint"));
    CHECK(adjoint::testing::contains(o.err, "no config.json"));
  }
  SUBCASE("a config without the head count") {
    write_text(run + "/config.json", R"({"model": {"d_model": 8}})");
    const CommandOutcome o = run_adjoint({"tensorsim", "--run", run, "--positions", "2"});
    CHECK(o.code == 1);
    CHECK(one_line(o.err));
    CHECK(adjoint::testing::contains(o.err, "config.json: no 'n_head'"));
  }
  SUBCASE("a config whose sizes are not the tensors'") {
    write_text(run + "/config.json", R"({"model": {"n_head": 2, "n_layers": 3}})");
    const CommandOutcome o = run_adjoint({"tensorsim", "--run", run, "--positions", "2"});
    CHECK(o.code == 1);
    CHECK(adjoint::testing::contains(o.err, "2 attention layers, the config's n_layers is 3"));
  }
  SUBCASE("a tensor under another name") {
    State s = fixture("paper_lm").tensors;
    s["layers.1.k2.b"] = s.at("layers.1.k2.bias");
    s.erase("layers.1.k2.bias");
    write_safetensors(run + "/checkpoints/step_00100.safetensors", s, {});
    const CommandOutcome o = run_adjoint({"tensorsim", "--run", run, "--positions", "2"});
    CHECK(o.code == 1);
    CHECK(one_line(o.err));
    CHECK(adjoint::testing::contains(o.err, "step_00100.safetensors: no tensor 'layers.1.k2.bias'"));
  }
  SUBCASE("a tensor the layout does not have") {
    State s = fixture("paper_lm").tensors;
    s["layers.0.v.bias"] = Tensor::zeros({8});
    write_safetensors(run + "/checkpoints/step_00100.safetensors", s, {});
    const CommandOutcome o = run_adjoint({"tensorsim", "--run", run, "--positions", "2"});
    CHECK(o.code == 1);
    CHECK(one_line(o.err));
    CHECK(adjoint::testing::contains(o.err, "unexpected tensor 'layers.0.v.bias'"));
  }
}
