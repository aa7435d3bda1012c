// Independent batches of the fixed-budget check (`tensorsim --check-mc N`) on a one-block LM
// whose inner products the exact route gives: over many seeds, each inner product's batches
// must centre on the exact value (their mean within a few of the mean's standard error, taken
// from the errors the batches claim), scatter as much as they claim (their spread over their
// mean claimed standard error near 1), and cover it at about the 95% their intervals promise.
// With the control variate, whose coefficient is fitted on a pilot the estimate sets aside, and
// without it. A bias from the control variate (its coefficient fitted on the draws it corrects,
// or a wrong exact mean of the direct paths) moves the mean; a standard error that ignored the
// control variate, or the correlation of a direction's radial points, moves the spread's ratio.
#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "analysis/similarity/model_similarity.h"
#include "analysis/similarity/monte_carlo.h"
#include "engine/random.h"
#include "models/model.h"

using namespace adjoint;

namespace {

// The three inner products of `batches` independent fixed-budget checks (seeds 1 … batches) of
// `evaluations` network evaluations each, against the exact values.
struct Batches {
  PooledEstimates ab, aa, bb;
};
Batches run_batches(const PolynomialView& a, const PolynomialView& b, const TensorSimScore& exact, double input_std, int64_t evaluations,
                    int batches, bool control_variate) {
  Batches p;
  for (int seed = 1; seed <= batches; ++seed) {
    MonteCarloPlan plan = fixed_budget_plan(a, b, evaluations, uint64_t(seed), input_std);
    plan.control_variate = control_variate;
    const MonteCarloSimilarity mc = monte_carlo_sized(a, b, plan);
    REQUIRE(mc.control_variate == control_variate);
    REQUIRE(mc.reliable);
    p.ab.add(mc.inner_ab, mc.inner_ab_se, exact.inner_ab);
    p.aa.add(mc.inner_aa, mc.inner_aa_se, exact.inner_aa);
    p.bb.add(mc.inner_bb, mc.inner_bb_se, exact.inner_bb);
  }
  return p;
}

std::vector<std::pair<std::string, PooledEstimates>> named(const Batches& p) { return {{"<A|B>", p.ab}, {"<A|A>", p.aa}, {"<B|B>", p.bb}}; }

ModelConfig one_block_lm() {
  ModelConfig c;
  c.arch = "bilinear_lm", c.attention = "bilinear", c.vocab = 5, c.seq_len = 2, c.dim = 4, c.depth = 1, c.heads = 2;
  c.mlp_ratio = 1, c.residual_scale = 0.5;
  return c;
}

// The pair: two one-block LMs at the one-hot tokens' norm, where the draws are light-tailed (as
// the trained LMs' at input std 1/16) and the direct paths carry most of each inner product, so
// that the control variate lowers the standard errors several-fold.
struct Pair {
  std::shared_ptr<Model> a, b;
  TensorSimScore exact;
  double input_std = 1 / std::sqrt(5.0);
};
Pair one_block_pair() {
  Generator ga(61), gb(62);
  Pair p{make_model(one_block_lm(), ga), make_model(one_block_lm(), gb), {}};
  TensorSimOptions o;
  o.input_std = p.input_std;
  p.exact = tensor_similarity(*p.a, *p.b, o);
  REQUIRE(p.exact.kind == "exact");
  return p;
}

}  // namespace

TEST_CASE("Monte Carlo batches: --check-mc's fixed budget centres on the exact inner products and scatters as it claims") {
  const Pair pair = one_block_pair();
  const PolynomialView a = pair.a->polynomial_view(), b = pair.b->polynomial_view();
  // 20 000 evaluations, lm_exact_check's budget: 1818 directions of 11 radial points.
  const int batches = 100;
  for (const bool control_variate : {true, false}) {
    CAPTURE(control_variate);
    for (const auto& [name, p] : named(run_batches(a, b, pair.exact, pair.input_std, 20000, batches, control_variate))) {
      CAPTURE(name);
      MESSAGE(name, std::string(control_variate ? " with" : " without"), " the control variate: mean − exact ", p.z(), " s.e., spread / claimed ",
              p.spread_ratio(), ", covered ", p.covered, " of ", p.n, ", mean claimed s.e. ", p.claimed / p.n);
      CHECK(std::abs(p.z()) < 3.5);
      // A standard deviation of 100 near-normal draws over its truth: about 1 ± 0.07.
      CHECK(p.spread_ratio() > 0.8);
      CHECK(p.spread_ratio() < 1.25);
      // Binomial(100, 0.95): 88 or more with probability 0.998.
      CHECK(p.covered >= 88);
    }
  }
}

// At a small budget the control variate's draws (the branches left once the direct paths are
// subtracted) are heavier-tailed for their variance than the raw draws, and their sample
// variance understates the spread: the estimate stays unbiased, its intervals cover less than
// 95% (docs/methods.md §3.3, "The control variate over many batches").
TEST_CASE("Monte Carlo batches: at a few hundred directions the control variate stays unbiased") {
  const Pair pair = one_block_pair();
  const PolynomialView a = pair.a->polynomial_view(), b = pair.b->polynomial_view();
  const int batches = 200;
  // 4000 evaluations: 363 directions.
  for (const auto& [name, p] : named(run_batches(a, b, pair.exact, pair.input_std, 4000, batches, true))) {
    CAPTURE(name);
    MESSAGE(name, ": mean − exact ", p.z(), " s.e., spread / claimed ", p.spread_ratio(), ", covered ", p.covered, " of ", p.n);
    CHECK(std::abs(p.z()) < 3.5);
    CHECK(p.spread_ratio() < 1.4);
    // Binomial(200, 0.95) would give 182 or more with probability 0.998; here about 88%.
    CHECK(p.covered >= 160);
  }
}
