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
// `evaluations` network evaluations each, against the exact values; with the control variate,
// how many of them kept it in each inner product (its residuals passing the tail diagnostic).
struct Batches {
  PooledEstimates ab, aa, bb;
  int controlled_ab = 0, controlled_aa = 0, controlled_bb = 0;
};
Batches run_batches(const PolynomialView& a, const PolynomialView& b, const TensorSimScore& exact, double input_std, int64_t evaluations,
                    int batches, bool control_variate) {
  Batches p;
  for (int seed = 1; seed <= batches; ++seed) {
    MonteCarloPlan plan = fixed_budget_plan(a, b, evaluations, uint64_t(seed), input_std);
    plan.control_variate = control_variate;
    const MonteCarloSimilarity mc = monte_carlo_sized(a, b, plan);
    if (!control_variate) REQUIRE_FALSE(mc.control_variate);
    REQUIRE(mc.reliable);
    p.controlled_ab += mc.controlled_ab, p.controlled_aa += mc.controlled_aa, p.controlled_bb += mc.controlled_bb;
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
    const Batches all = run_batches(a, b, pair.exact, pair.input_std, 20000, batches, control_variate);
    if (control_variate) {
      MESSAGE("kept the control variate: <A|B> ", all.controlled_ab, ", <A|A> ", all.controlled_aa, ", <B|B> ", all.controlled_bb, " of ", batches);
      // Where its residuals are light-tailed (here ⟨A|B⟩ and ⟨A|A⟩) the control variate stays.
      CHECK(all.controlled_ab >= 90);
      CHECK(all.controlled_aa >= 70);
    }
    for (const auto& [name, p] : named(all)) {
      CAPTURE(name);
      MESSAGE(name, std::string(control_variate ? " with" : " without"), " the control variate: mean − exact ", p.z(),
              " s.e., rms of error / claimed ", p.standardised_spread(), ", covered ", p.covered, " of ", p.n, ", mean claimed s.e. ",
              p.claimed / p.n);
      CHECK(std::abs(p.z()) < 3.5);
      // Each error over its own claim (batches that kept the control variate claim smaller
      // errors than those that fell back): a root mean square of 100 near-normal ones is about 1 ± 0.07.
      CHECK(p.standardised_spread() > 0.8);
      CHECK(p.standardised_spread() < 1.25);
      // Binomial(100, 0.95): 88 or more with probability 0.998.
      CHECK(p.covered >= 88);
    }
  }
}

// At a small budget the control variate's residuals of ⟨B|B⟩ (the branches left once the direct
// paths are subtracted) are heavier-tailed for their variance than the raw draws, and their sample
// variance understates the spread; the tail diagnostic marks them and ⟨B|B⟩ falls back to its raw
// draws (docs/methods.md §3.3, "The control variate over many batches"): every inner product
// stays unbiased and its intervals cover at the rate they claim.
TEST_CASE("Monte Carlo batches: at a few hundred directions the estimates stay unbiased and cover") {
  const Pair pair = one_block_pair();
  const PolynomialView a = pair.a->polynomial_view(), b = pair.b->polynomial_view();
  const int batches = 200;
  // 4000 evaluations: 363 directions.
  const Batches all = run_batches(a, b, pair.exact, pair.input_std, 4000, batches, true);
  MESSAGE("kept the control variate: <A|B> ", all.controlled_ab, ", <A|A> ", all.controlled_aa, ", <B|B> ", all.controlled_bb, " of ", batches);
  for (const auto& [name, p] : named(all)) {
    CAPTURE(name);
    MESSAGE(name, ": mean − exact ", p.z(), " s.e., rms of error / claimed ", p.standardised_spread(), ", covered ", p.covered, " of ", p.n,
            ", mean claimed s.e. ", p.claimed / p.n);
    CHECK(std::abs(p.z()) < 3.5);
    CHECK(p.standardised_spread() < 1.4);
    // Binomial(200, 0.95): 182 or more with probability 0.998 (with the diagnostic on the raw
    // draws, ⟨B|B⟩ covered 176).
    CHECK(p.covered >= 182);
  }
}

// The default sized route (tolerance 0.005, at least 1024 directions) on the same pair stops
// after about a thousand directions, where the control variate's residuals of ⟨B|B⟩ are
// heavy-tailed for their variance and their sample variance understates the spread. The tail
// diagnostic reads each inner product's residuals (monte_carlo.h, "The control variate"), and
// where it marks them that inner product falls back to its raw draws: its intervals then cover
// at the rate they claim, while the inner products whose residuals pass keep the control variate.
TEST_CASE("Monte Carlo batches: the default sized route covers ⟨B|B⟩ where the control variate's residuals are heavy-tailed") {
  const Pair pair = one_block_pair();
  const PolynomialView a = pair.a->polynomial_view(), b = pair.b->polynomial_view();
  const int batches = 300;
  Batches p;
  int controlled[3] = {0, 0, 0};
  int64_t directions = 0;
  for (int seed = 1; seed <= batches; ++seed) {
    MonteCarloPlan plan;
    plan.seed = uint64_t(seed), plan.input_std = pair.input_std;
    const MonteCarloSimilarity mc = monte_carlo_sized(a, b, plan);
    REQUIRE(mc.reliable);
    REQUIRE_FALSE(mc.importance);
    controlled[0] += mc.controlled_ab, controlled[1] += mc.controlled_aa, controlled[2] += mc.controlled_bb;
    directions += mc.samples;
    p.ab.add(mc.inner_ab, mc.inner_ab_se, pair.exact.inner_ab);
    p.aa.add(mc.inner_aa, mc.inner_aa_se, pair.exact.inner_aa);
    p.bb.add(mc.inner_bb, mc.inner_bb_se, pair.exact.inner_bb);
  }
  MESSAGE("mean directions ", double(directions) / batches, "; kept the control variate: <A|B> ", controlled[0], ", <A|A> ", controlled[1],
          ", <B|B> ", controlled[2], " of ", batches);
  for (const auto& [name, q] : named(p)) {
    CAPTURE(name);
    MESSAGE(name, ": mean − exact ", q.z(), " s.e., rms of error / claimed ", q.standardised_spread(), ", covered ", q.covered, " of ",
            q.n, ", mean claimed s.e. ", q.claimed / q.n);
    CHECK(std::abs(q.z()) < 3.5);
    // Some batches keep the control variate and some do not, so their claimed errors differ:
    // each error is read against its own claim. Near-normal: about 1 ± 0.04 over 300.
    CHECK(q.standardised_spread() < 1.15);
  }
  // ⟨A|B⟩'s residuals are light-tailed here: it keeps the control variate nearly always.
  CHECK(controlled[0] >= 270);
  CHECK(controlled[1] >= 200);
  // Binomial(300, 0.95): 274 or more with probability 0.99 (before the diagnostic read the
  // residuals, ⟨B|B⟩ covered about 270).
  CHECK(p.bb.covered >= 274);
}
