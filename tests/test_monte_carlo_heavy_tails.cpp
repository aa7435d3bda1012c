// Heavy tails on a small network with an exact answer: a one-block attention LM at input std 2,
// where a few directions carry most of each self term ⟨A|A⟩, ⟨B|B⟩. A fixed budget of draws then
// misses them by many of its own standard errors; every such estimate must be marked unreliable
// (its draws' Pareto shape over the limit), and the sampled route, which tempers over directions
// in place of a marked estimate, must cover the exact values. The same pathology as the trained
// one-block LMs at 4 positions and input std 1 (analysis/results/lm_exact_check.md), at a size
// whose exact route takes a moment.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "analysis/similarity/model_similarity.h"
#include "analysis/similarity/monte_carlo.h"
#include "engine/io/json.h"
#include "engine/random.h"
#include "models/checkpoint.h"
#include "models/model.h"
#include "tests/support.h"

using namespace adjoint;

namespace {

ModelConfig heavy_tailed_lm() {
  ModelConfig c;
  c.arch = "bilinear_lm", c.attention = "bilinear", c.vocab = 5, c.seq_len = 3, c.dim = 4, c.depth = 1, c.heads = 2;
  c.mlp_ratio = 1, c.residual_scale = 0.5;
  return c;
}
constexpr double kInputStd = 2;

// The largest of the four estimates' distances from the exact values, in their own standard errors.
double largest_miss(const MonteCarloSimilarity& mc, const TensorSimScore& exact) {
  return std::max({std::abs(mc.similarity - exact.total) / mc.similarity_se, std::abs(mc.inner_ab - exact.inner_ab) / mc.inner_ab_se,
                   std::abs(mc.inner_aa - exact.inner_aa) / mc.inner_aa_se, std::abs(mc.inner_bb - exact.inner_bb) / mc.inner_bb_se});
}

}  // namespace

TEST_CASE("heavy tails: a fixed budget that misses the self terms is marked, and the tempered route covers them") {
  Generator ga(51), gb(52);
  const std::shared_ptr<Model> a = make_model(heavy_tailed_lm(), ga), b = make_model(heavy_tailed_lm(), gb);
  TensorSimOptions o;
  o.input_std = kInputStd;
  const TensorSimScore exact = tensor_similarity(*a, *b, o);
  REQUIRE(exact.kind == "exact");
  // Six independent batches of 20 000 evaluations, the budget of lm_exact_check's batches.
  int missed = 0;
  for (uint64_t seed = 1; seed <= 6; ++seed) {
    CAPTURE(seed);
    const MonteCarloSimilarity mc = monte_carlo_check(*a, *b, o, 20000, nullptr, seed);
    const double miss = largest_miss(mc, exact);
    MESSAGE("batch ", seed, ": largest miss ", miss, " s.e., Pareto shape ", mc.pareto_shape, " (limit ", mc.pareto_limit,
            "), effective draws ", mc.effective_draws, mc.reliable ? std::string() : std::string(", marked"));
    missed += miss > 4;
    // An estimate outside 3 of its own standard errors is never reported unmarked.
    if (miss > 3) CHECK_FALSE(mc.reliable);
  }
  CHECK(missed >= 1);  // the pathology is there to be caught
  // The sampled route: tempering over directions replaces the marked estimate, and covers.
  o.sampled = true, o.tolerance = 0.005;
  for (uint64_t seed = 1; seed <= 2; ++seed) {
    CAPTURE(seed);
    o.seed = seed;
    const TensorSimScore s = tensor_similarity(*a, *b, o);
    CHECK(s.kind == "monte-carlo");
    CHECK(s.method.find("runs of tempering over directions") != std::string::npos);
    CHECK(s.reliable);
    CHECK(std::abs(s.total - exact.total) < 3 * s.standard_error);
    CHECK(std::abs(s.inner_ab - exact.inner_ab) < 3 * s.inner_ab_se);
    CHECK(std::abs(s.inner_aa - exact.inner_aa) < 3 * s.inner_aa_se);
    CHECK(std::abs(s.inner_bb - exact.inner_bb) < 3 * s.inner_bb_se);
  }
}

TEST_CASE("tensorsim: --check-mc reports its mark and tail diagnostics; --sampled checks the sampled route") {
  adjoint::testing::TempDir dir;
  Generator ga(51), gb(52);
  save_checkpoint(dir.file("a.safetensors"), *make_model(heavy_tailed_lm(), ga), nullptr, 0, 0, {});
  save_checkpoint(dir.file("b.safetensors"), *make_model(heavy_tailed_lm(), gb), nullptr, 0, 0, {});
  const std::string std_text = "2";
  // Batch 6 of the test above, one that misses the exact self terms and is marked.
  const adjoint::testing::CommandOutcome check =
      adjoint::testing::run_adjoint({"tensorsim", dir.file("a.safetensors"), dir.file("b.safetensors"), "--no-baselines",
                                     "--input-std", std_text, "--check-mc", "20000", "--seed", "6", "--out", dir.file("check")});
  REQUIRE_MESSAGE(check.code == 0, check.err);
  CHECK(check.out.find("tail diagnostics: Pareto shape") != std::string::npos);
  CHECK(check.out.find("MARKED unreliable") != std::string::npos);
  const std::string csv = adjoint::testing::read_text(dir.file("check/tensorsim.csv"));
  CHECK(csv.find("\nmonte_carlo_reliable,0,") != std::string::npos);
  const Json checked = parse_json(adjoint::testing::read_text(dir.file("check/tensorsim.json")));
  CHECK_FALSE(checked.find("monte_carlo")->find("reliable")->as_bool());
  CHECK(checked.find("monte_carlo")->find("pareto_shape")->as_number() > 0.7);

  const adjoint::testing::CommandOutcome sampled =
      adjoint::testing::run_adjoint({"tensorsim", dir.file("a.safetensors"), dir.file("b.safetensors"), "--no-baselines",
                                     "--input-std", std_text, "--sampled", "--seed", "1", "--out", dir.file("sampled")});
  REQUIRE_MESSAGE(sampled.code == 0, sampled.err);
  CHECK(sampled.out.find("[monte-carlo: ") != std::string::npos);
  CHECK(sampled.out.find("sampling asked for (--sampled)") != std::string::npos);
  const Json j = parse_json(adjoint::testing::read_text(dir.file("sampled/tensorsim.json")));
  CHECK(j.find("method")->as_string() == "monte-carlo");
  CHECK(j.find("standard_error")->as_number() > 0);
  CHECK(j.find("reliable")->as_bool());
  const std::string sampled_csv = adjoint::testing::read_text(dir.file("sampled/tensorsim.csv"));
  for (const char* row : {"\nstandard_error,", "\ninner_ab_standard_error,", "\ninner_aa_standard_error,", "\ninner_bb_standard_error,",
                          "\nreliable,1,"})
    CHECK_MESSAGE(sampled_csv.find(row) != std::string::npos, row);

  const adjoint::testing::CommandOutcome both = adjoint::testing::run_adjoint(
      {"tensorsim", dir.file("a.safetensors"), dir.file("b.safetensors"), "--no-baselines", "--sampled", "--recursion"});
  CHECK(both.code == 2);
  CHECK(both.err.find("--recursion and --sampled") != std::string::npos);
}
