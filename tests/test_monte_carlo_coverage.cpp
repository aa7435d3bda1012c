// The sized Monte Carlo estimate's intervals on 2-block attention-only LMs of the
// tensor-similarity paper's family (degree 25 each), against the exact inner products of the
// networks written out as polynomials: importance-sampled directions (the default) and uniform
// ones cover the cosine and each of the three inner products apart, and where the uniform
// directions' draws grow heavy-tailed the importance-sampled ones stay trusted; plain sampling,
// whose heavy tails make the sample variance understate the error, does not cover, and the tail
// diagnostic says so. A marked uniform run is rechecked by a second before any proposal, and no
// draw that chose the law is one of the estimate's.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "analysis/similarity/monte_carlo.h"
#include "analysis/similarity/polynomial_moments.h"
#include "analysis/similarity/radial_quadrature.h"
#include "models/model.h"
#include "models/paper_lm.h"

using namespace adjoint;

namespace {

// Two tokens, width 4, 2 heads, 2 positions: 4 input variables, small enough to write out at
// degree 25. Plain attention (no QK bias, no rotary positions), which the exact route takes.
// B is A with its weights moved by 0.3 of their scale: a cosine near 0.98.
struct Pair {
  PolynomialView a, b;
};
Pair attention_pair() {
  PaperLmShape shape;
  shape.heads = 2, shape.qk_bias = false, shape.rotary = false, shape.vocab = 2, shape.dim = 4, shape.layers = 2;
  Generator gen(1000);
  const std::map<std::string, Tensor> first = paper_lm_random_state(shape, gen, 0.5),
                                      second = paper_lm_random_state(shape, gen, 0.15, 0, &first);
  return {paper_lm_view(first, shape, 2, "a"), paper_lm_view(second, shape, 2, "b")};
}

// Two independently drawn depth-2 residual bilinear MLPs (4 inputs, hidden 8, 3 classes): degree 4.
Pair residual_mlp_pair() {
  ModelConfig c;
  c.arch = "bilinear_mlp";
  c.in_features = 4, c.hidden = 8, c.num_classes = 3, c.depth = 2;
  Generator first(5), second(6);
  return {make_model(c, first)->polynomial_view(), make_model(c, second)->polynomial_view()};
}

bool covers(double estimate, double se, double exact) { return std::abs(estimate - exact) <= 1.96 * se; }

struct Coverage {
  int cosine = 0, ab = 0, aa = 0, bb = 0, unreliable = 0, importance = 0, chosen_on_pilots = 0, tempered = 0;
  int rechecked = 0, cleared = 0;  // first uniform runs marked, then rechecked; of those, rechecks unmarked
};
// The default (importance-sampled directions where uniform ones are heavy-tailed, uniform ones
// otherwise), importance-sampled directions always, a proposal fitted always and then chosen
// against uniform directions on pilots, uniform directions, plain sampling.
enum class Sampler { Default, ImportanceDirections, ChosenOnPilots, UniformDirections, Plain, Tempered };
Coverage coverage(const Pair& p, const ExactInnerProducts& exact, double input_std, Sampler sampler, int runs) {
  Coverage c;
  for (int run = 1; run <= runs; ++run) {
    MonteCarloPlan plan;
    plan.tolerance = 0.002, plan.input_std = input_std, plan.seed = uint64_t(run) * 7919 + 13;
    plan.radial = sampler != Sampler::Plain, plan.importance = sampler != Sampler::UniformDirections;
    plan.always_adapt = sampler == Sampler::ImportanceDirections || sampler == Sampler::ChosenOnPilots;
    plan.choose_by_pilot = sampler != Sampler::ImportanceDirections;
    plan.always_temper = sampler == Sampler::Tempered;
    // The laws below are tested as they are: tempering, where their estimate ends marked, would replace it.
    plan.tempering = sampler == Sampler::Default || sampler == Sampler::Tempered;
    if (plan.always_temper)  // replicate runs cost more than draws
      plan.tolerance = 0.005, plan.tempering_plan.particles = 128, plan.tempering_plan.moves = 2;
    const MonteCarloSimilarity mc = monte_carlo_sized(p.a, p.b, plan);
    CHECK(mc.similarity_se <= plan.tolerance);
    c.cosine += covers(mc.similarity, mc.similarity_se, exact.cosine());
    c.ab += covers(mc.inner_ab, mc.inner_ab_se, exact.ab);
    c.aa += covers(mc.inner_aa, mc.inner_aa_se, exact.aa);
    c.bb += covers(mc.inner_bb, mc.inner_bb_se, exact.bb);
    c.unreliable += !mc.reliable, c.importance += mc.importance, c.tempered += mc.tempered;
    c.rechecked += mc.uniform_rechecked, c.cleared += mc.recheck_cleared;
    c.chosen_on_pilots += !std::isnan(mc.uniform_pilot_shape) && !std::isnan(mc.proposal_pilot_shape) &&
                          mc.importance != mc.proposal_declined;
  }
  return c;
}

// Each of the four intervals (the cosine and the three inner products) covered the exact
// value in at least `at_least` of `runs` runs; the counts are printed first.
void check_each_covers(const Coverage& c, const ExactInnerProducts& exact, int runs, int at_least) {
  MESSAGE("exact cosine ", exact.cosine(), "; covered of ", runs, ": cosine ", c.cosine, ", <A|B> ", c.ab, ", <A|A> ", c.aa,
          ", <B|B> ", c.bb, "; importance-sampled ", c.importance, ", marked unreliable ", c.unreliable);
  CHECK(c.cosine >= at_least);
  CHECK(c.ab >= at_least);
  CHECK(c.aa >= at_least);
  CHECK(c.bb >= at_least);
}

// Tempering forced on 20 runs: each interval covers in at least 17, and no run is marked.
void check_tempered_covers(const Pair& p, double input_std) {
  const ExactInnerProducts exact = exact_inner_products(p.a, p.b, input_std);
  const int runs = 20;
  const Coverage c = coverage(p, exact, input_std, Sampler::Tempered, runs);
  check_each_covers(c, exact, runs, 17);
  CHECK(c.tempered == runs);
  CHECK(c.unreliable == 0);
}

}  // namespace

TEST_CASE("Monte Carlo coverage: the default estimate covers a 2-block attention LM's exact inner products, unmarked") {
  const Pair p = attention_pair();
  REQUIRE(polynomial_degree(p.a) == 25);
  const int runs = 20;
  // At σ = 0.4 the largest draw carries up to a third of the sample variance (the earlier
  // diagnostic marked every run), yet the draws' Pareto tail shape is light and the intervals cover.
  for (double input_std : {0.35, 0.4}) {
    const ExactInnerProducts exact = exact_inner_products(p.a, p.b, input_std);
    const Coverage c = coverage(p, exact, input_std, Sampler::Default, runs);
    MESSAGE("σ ", input_std);
    // Binomial(20, 0.95): 17 or more with probability 0.98 each; an interval half as wide covers
    // about 13 of 20 (a normal error within ±0.98 s.e.), 17 or more with probability 0.02.
    check_each_covers(c, exact, runs, 17);
    CHECK(c.unreliable == 0);
  }
}

TEST_CASE("Monte Carlo coverage: importance-sampled directions are unbiased, with intervals that cover") {
  // The proposal adapted on every run (the default adapts only where uniform directions' draws
  // are heavy-tailed), then fresh draws weighted by uniform/proposal: a weight without the
  // mixture's exact density biases every inner product.
  const Pair p = attention_pair();
  const double input_std = 0.4;
  const ExactInnerProducts exact = exact_inner_products(p.a, p.b, input_std);
  const int runs = 20;
  const Coverage c = coverage(p, exact, input_std, Sampler::ImportanceDirections, runs);
  check_each_covers(c, exact, runs, 17);
  CHECK(c.importance >= 17);
  CHECK(c.unreliable <= 3);
}

TEST_CASE("Monte Carlo coverage: a law of directions chosen on pilots, then fresh draws, covers") {
  // A proposal fitted on every run, then compared with the uniform run on a pilot of as many of its
  // own draws (prefer_proposal); the estimate is a third, fresh run from the law chosen.
  const Pair p = attention_pair();
  const double input_std = 0.4;
  const ExactInnerProducts exact = exact_inner_products(p.a, p.b, input_std);
  const int runs = 20;
  const Coverage c = coverage(p, exact, input_std, Sampler::ChosenOnPilots, runs);
  check_each_covers(c, exact, runs, 17);
  MESSAGE("chosen on pilots ", c.chosen_on_pilots, " of ", runs, ", the proposal in ", c.importance);
  CHECK(c.chosen_on_pilots >= 17);  // a proposal was fitted and a choice made (not where no peak stood out)
  CHECK(c.unreliable <= 3);
}

TEST_CASE("Monte Carlo: the law of directions is chosen on pilots by their tails, then by their spread") {
  const int64_t n = 2048;  // the tail shape's limit: min(1 − 1/log10 2048, 0.7) = 0.698
  const PilotSummary light{n, 0.2, 1.0}, light_narrower{n, 0.3, 0.5}, heavy{n, 1.2, 0.1}, heavier{n, 2.0, 0.05};
  CHECK(prefer_proposal(heavy, light));         // uniform directions marked, the proposal not
  CHECK_FALSE(prefer_proposal(light, heavy));   // the reverse, although the proposal's spread is smaller
  CHECK(prefer_proposal(heavier, heavy));       // both marked: the lighter tail
  CHECK_FALSE(prefer_proposal(heavy, heavier));
  CHECK(prefer_proposal(light, light_narrower));  // neither marked: the smaller variance a draw
  CHECK_FALSE(prefer_proposal(light_narrower, light));
  CHECK_FALSE(prefer_proposal(light, light));  // a tie: uniform directions
  const PilotSummary flat{n, -INFINITY, 1.0}, undefined{n, NAN, 0.1};  // no tail at all; a shape that could not be read
  CHECK(prefer_proposal(undefined, flat));
  CHECK_FALSE(prefer_proposal(flat, undefined));
}

TEST_CASE("Monte Carlo coverage: uniform directions cover where their tails are light") {
  const Pair p = attention_pair();
  const double input_std = 0.35;
  const ExactInnerProducts exact = exact_inner_products(p.a, p.b, input_std);
  const int runs = 20;
  const Coverage radial = coverage(p, exact, input_std, Sampler::UniformDirections, runs);
  check_each_covers(radial, exact, runs, 17);
  CHECK(radial.unreliable == 0);
}

TEST_CASE("Monte Carlo coverage: plain sampling of the same LM under-covers, and its tail shape says so") {
  const Pair p = attention_pair();
  const double input_std = 0.4;
  const ExactInnerProducts exact = exact_inner_products(p.a, p.b, input_std);
  const int runs = 20;
  const Coverage plain = coverage(p, exact, input_std, Sampler::Plain, runs);
  MESSAGE("exact cosine ", exact.cosine(), "; cosine covered of ", runs, ": plain ", plain.cosine, "; plain marked unreliable ",
          plain.unreliable);
  CHECK(plain.cosine <= 10);
  CHECK(plain.unreliable >= 17);
}

TEST_CASE("Monte Carlo coverage: tempered directions' replicate runs cover a 2-block attention LM's exact inner products") {
  // Tempering over directions on every run (the default tempers only where the estimate would
  // end marked): a pilot sets the ladder, then independent runs along it, the interval from their
  // spread. A run whose incremental weights or final weights lose the exact 1/h, or whose moves do
  // not leave each tempered law invariant, biases every inner product.
  check_tempered_covers(attention_pair(), 0.4);
}

TEST_CASE("Monte Carlo coverage: tempered directions cover a depth-2 residual MLP pair's exact inner products") {
  // A smooth target far from the case tempering is for: it must not bias what it does not help.
  check_tempered_covers(residual_mlp_pair(), 1.0);
}

namespace {

// The rows (directions) of `a` that also occur in `b`, both of `m` entries each.
int64_t shared_rows(const std::vector<double>& a, const std::vector<double>& b, int64_t m) {
  int64_t shared = 0;
  for (size_t i = 0; i < a.size(); i += size_t(m))
    for (size_t j = 0; j < b.size(); j += size_t(m))
      shared += std::equal(a.begin() + long(i), a.begin() + long(i) + m, b.begin() + long(j));
  return shared;
}

}  // namespace

TEST_CASE("Monte Carlo: a marked uniform run is rechecked before adapting, and the estimate draws fresh directions") {
  // At σ = 0.41 the first 1024 uniform directions are marked in most runs, by their largest draws,
  // and a second run of as many is not marked in about a third (at 0.40 none is marked, at 0.413
  // every recheck is: the law's tail grows heavy between them). A
  // second uniform run of as many draws decides: unmarked, the law stays uniform and the estimate
  // is a third run; the draws that chose the law (both uniform pilots, a proposal's pilot) must
  // not be the estimate's, or the choice, read on draws that missed their tail, would bias it.
  const Pair p = attention_pair();
  const double input_std = 0.41;
  const ExactInnerProducts exact = exact_inner_products(p.a, p.b, input_std);
  const int runs = 20;
  int cleared = 0, rechecked = 0, covered = 0;
  for (int run = 1; run <= runs; ++run) {
    std::map<std::string, std::vector<double>> heard;
    MonteCarloPlan plan;
    plan.tolerance = 0.002, plan.input_std = input_std, plan.seed = uint64_t(run) * 104729 + 7;
    plan.run_heard = [&heard](const std::string& role, const std::vector<double>& directions) {
      CHECK(heard.count(role) == 0);  // each role once
      heard[role] = directions;
    };
    const MonteCarloSimilarity mc = monte_carlo_sized(p.a, p.b, plan);
    REQUIRE(heard.count("estimate") + mc.tempered == 1);
    rechecked += mc.uniform_rechecked, cleared += mc.recheck_cleared;
    covered += covers(mc.similarity, mc.similarity_se, exact.cosine());
    if (mc.tempered) continue;
    const int64_t m = int64_t(heard["estimate"].size()) / mc.samples;
    REQUIRE(m * mc.samples == int64_t(heard["estimate"].size()));
    CHECK(m == 4);  // two positions of two tokens: directions in R^4
    for (const auto& [role, directions] : heard)
      if (role != "estimate") CHECK_MESSAGE(shared_rows(directions, heard["estimate"], m) == 0, role, "'s draws reused by the estimate");
    CHECK(mc.uniform_rechecked == (heard.count("uniform recheck") == 1));
    if (mc.recheck_cleared) {
      // Both uniform pilots set aside, as many draws each, and no proposal paid for.
      CHECK(heard["uniform pilot"].size() == heard["uniform recheck"].size());
      CHECK(heard.count("proposal pilot") == 0);
      CHECK(mc.proposal_peaks == 0);
      CHECK_FALSE(mc.importance);
      CHECK(mc.reliable);
    }
  }
  MESSAGE("σ ", input_std, ": first uniform runs marked in ", rechecked, " of ", runs, ", cleared by the recheck in ", cleared,
          "; the cosine covered in ", covered);
  CHECK(rechecked >= 10);
  CHECK(cleared >= 2);
  CHECK(covered >= 17);
}
