// The sized Monte Carlo estimate (analysis/similarity/monte_carlo.h): its intervals cover the
// exact values, seed after seed, for the cosine and for each of the three inner products apart;
// and the control variate lowers the standard error at the same samples.
#include <doctest/doctest.h>

#include <cmath>

#include "analysis/similarity/exact_moments.h"
#include "analysis/similarity/model_similarity.h"
#include "analysis/similarity/monte_carlo.h"
#include "engine/random.h"
#include "models/model.h"

using namespace adjoint;

namespace {

PolynomialView residual_mlp(uint64_t seed) {
  ModelConfig c;
  c.arch = "bilinear_mlp", c.in_features = 5, c.hidden = 4, c.num_classes = 3, c.depth = 2, c.dim = 4;
  Generator g(seed);
  return make_model(c, g)->polynomial_view();
}

bool covers(double estimate, double se, double exact) { return std::abs(estimate - exact) <= 1.96 * se; }

}  // namespace

TEST_CASE("sized Monte Carlo: the 95% intervals cover the exact values over independent seeds") {
  const PolynomialView a = residual_mlp(1), b = residual_mlp(2);
  const DeepSimilarity exact = exact_similarity(expand_output(a), expand_output(b));
  int cosine = 0, ab = 0, aa = 0, bb = 0;
  const int runs = 20;
  for (int seed = 1; seed <= runs; ++seed) {
    MonteCarloPlan plan;
    plan.tolerance = 0.0015, plan.seed = uint64_t(seed) * 7919;
    const MonteCarloSimilarity mc = monte_carlo_sized(a, b, plan);
    CHECK(mc.control_variate);
    CHECK(mc.similarity_se <= 0.0015);
    cosine += covers(mc.similarity, mc.similarity_se, exact.similarity);
    ab += covers(mc.inner_ab, mc.inner_ab_se, exact.inner_ab);
    aa += covers(mc.inner_aa, mc.inner_aa_se, exact.inner_aa);
    bb += covers(mc.inner_bb, mc.inner_bb_se, exact.inner_bb);
  }
  MESSAGE("covered of ", runs, ": cosine ", cosine, ", <A|B> ", ab, ", <A|A> ", aa, ", <B|B> ", bb, " (exact ", exact.similarity, ")");
  // Binomial(20, 0.95): 17 or more with probability 0.98; a biased estimate or an interval too
  // narrow by half covers far fewer.
  CHECK(cosine >= 17);
  CHECK(ab >= 17);
  CHECK(aa >= 17);
  CHECK(bb >= 17);
}

TEST_CASE("sized Monte Carlo: the control variate lowers the standard error at the same samples") {
  const PolynomialView a = residual_mlp(3), b = residual_mlp(4);
  MonteCarloPlan plan;
  plan.tolerance = 1e-9, plan.max_samples = 16384, plan.seed = 5;
  const MonteCarloSimilarity with = monte_carlo_sized(a, b, plan);
  plan.control_variate = false;
  const MonteCarloSimilarity without = monte_carlo_sized(a, b, plan);
  CHECK(with.samples == without.samples);
  CHECK(with.control_variate);
  CHECK_FALSE(without.control_variate);
  MESSAGE("standard error with the control variate ", with.similarity_se, ", without ", without.similarity_se);
  CHECK(with.similarity_se < 0.8 * without.similarity_se);
  CHECK(with.similarity == doctest::Approx(without.similarity).epsilon(4 * without.similarity_se));
}

// Plain sampling: the outputs have the same distribution either way. (The radial split is
// taken in the span, where x is isotropic in every direction the networks read; over the whole
// input the share of a direction inside the span, |P u|^degree, would be a heavy angular factor.)
TEST_CASE("sized Monte Carlo: sampling in the embeddings' span, the same estimate") {
  ModelConfig c;
  c.arch = "bilinear_lm", c.attention = "bilinear", c.vocab = 24, c.seq_len = 3, c.dim = 4, c.depth = 2, c.heads = 2;
  c.mlp_ratio = 1, c.residual_scale = 0.1;
  Generator ga(41), gb(42);
  const PolynomialView a = make_model(c, ga)->polynomial_view(), b = make_model(c, gb)->polynomial_view();
  MonteCarloPlan plan;
  plan.tolerance = 1e-9, plan.max_samples = 32768, plan.input_std = 1 / std::sqrt(24.0), plan.radial = false;
  for (bool cv : {false, true}) {
    plan.control_variate = cv;
    plan.embedding_span = true;
    const MonteCarloSimilarity span = monte_carlo_sized(a, b, plan);
    plan.embedding_span = false, plan.seed = 2;
    const MonteCarloSimilarity whole = monte_carlo_sized(a, b, plan);
    MESSAGE("control variate ", cv, ": in the span ", span.similarity, " ± ", span.similarity_se, ", over all inputs ",
            whole.similarity, " ± ", whole.similarity_se);
    CHECK(std::abs(span.similarity - whole.similarity) <= 3 * std::hypot(span.similarity_se, whole.similarity_se));
    CHECK(span.similarity_se == doctest::Approx(whole.similarity_se).epsilon(0.2));
  }
}

TEST_CASE("sized Monte Carlo: a one-block LM's cross term and both self terms, each against the exact route") {
  ModelConfig c;
  c.arch = "bilinear_lm", c.attention = "bilinear", c.vocab = 5, c.seq_len = 2, c.dim = 4, c.depth = 1, c.heads = 2;
  c.mlp_ratio = 1, c.residual_scale = 0.5;
  Generator ga(51), gb(52);
  const auto ma = make_model(c, ga), mb = make_model(c, gb);
  TensorSimOptions o;
  o.input_std = 1 / std::sqrt(5.0);
  const TensorSimScore exact = tensor_similarity(*ma, *mb, o);
  REQUIRE(exact.kind == "exact");
  int ab = 0, aa = 0, bb = 0, cosine = 0;
  const int runs = 10;
  for (int seed = 1; seed <= runs; ++seed) {
    MonteCarloPlan plan;
    plan.tolerance = 0.01, plan.seed = uint64_t(seed) * 104729, plan.input_std = o.input_std;
    const MonteCarloSimilarity mc = monte_carlo_sized(ma->polynomial_view(), mb->polynomial_view(), plan);
    cosine += covers(mc.similarity, mc.similarity_se, exact.total);
    ab += covers(mc.inner_ab, mc.inner_ab_se, exact.inner_ab);
    aa += covers(mc.inner_aa, mc.inner_aa_se, exact.inner_aa);
    bb += covers(mc.inner_bb, mc.inner_bb_se, exact.inner_bb);
  }
  MESSAGE("covered of ", runs, ": cosine ", cosine, ", <A|B> ", ab, ", <A|A> ", aa, ", <B|B> ", bb);
  // Binomial(10, 0.95): 8 or more with probability 0.99.
  CHECK(cosine >= 8);
  CHECK(ab >= 8);
  CHECK(aa >= 8);
  CHECK(bb >= 8);
}
