// The position-by-position exact inner product of one-block attention LMs
// (analysis/similarity/attention_block_moments.h): the same numbers as the networks written
// out whole (polynomial_moments.h) where both fit, and a Monte Carlo estimate made here at a
// size only the new route reaches, on independent networks.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "analysis/similarity/attention_block_moments.h"
#include "analysis/similarity/exact_moments.h"
#include "analysis/similarity/model_similarity.h"
#include "analysis/similarity/monte_carlo.h"
#include "analysis/similarity/polynomial_moments.h"
#include "analysis/similarity/second_moment.h"
#include "engine/random.h"
#include "ops/elementwise.h"
#include "models/model.h"

using namespace adjoint;

namespace {

ModelConfig lm_config(int64_t vocab, int64_t positions, int64_t dim, int64_t heads) {
  ModelConfig c;
  c.arch = "bilinear_lm", c.attention = "bilinear", c.vocab = vocab, c.seq_len = positions, c.dim = dim, c.depth = 1;
  c.heads = heads;
  return c;
}

// A random LM's view, its position embeddings scaled up from their 0.02 initialisation so that
// the constant terms they bring into every product count.
PolynomialView random_lm(const ModelConfig& c, uint64_t seed, float position_scale = 25.0f) {
  Generator g(seed);
  PolynomialView v = make_model(c, g)->polynomial_view();
  v.steps.front().bias = (v.steps.front().bias * position_scale).contiguous();
  return v;
}

}  // namespace

TEST_CASE("attention block moments: the same numbers as the networks written out whole") {
  struct Case {
    ModelConfig a, b;
    double input_std;
  };
  ModelConfig narrow = lm_config(3, 3, 4, 2), single_head = lm_config(4, 2, 4, 1), wide = lm_config(3, 3, 6, 2);
  single_head.residual_scale = 0.5;
  const ModelConfig issue_width = lm_config(4, 3, 8, 2);  // dim 8, 2 heads: 12 variables, 4·10⁹ multiply-adds written out whole
  const Case cases[] = {{narrow, narrow, 1.0},       {narrow, narrow, 0.7},           {single_head, single_head, 1.0},
                        {narrow, wide, 0.8},         {issue_width, issue_width, 1.0}};
  uint64_t seed = 300;
  for (const Case& c : cases) {
    const PolynomialView a = random_lm(c.a, ++seed), b = random_lm(c.b, ++seed);
    REQUIRE(single_attention_block(a));
    CAPTURE(a.positions);
    CAPTURE(a.input_dim);
    CAPTURE(c.input_std);
    const HermiteExpansion ea = hermite_expansion(a, c.input_std), eb = hermite_expansion(b, c.input_std);
    for (const auto& [x, y, ex, ey] : {std::tuple{&a, &b, &ea, &eb}, std::tuple{&a, &a, &ea, &ea}}) {
      const std::vector<double> whole = hermite_output_inner(*ex, *ey);
      const std::vector<double> by_position = attention_block_output_inner(*x, *y, c.input_std);
      REQUIRE(by_position.size() == whole.size());
      double largest = 0;
      for (double v : whole) largest = std::max(largest, std::abs(v));
      for (size_t k = 0; k < whole.size(); ++k) {
        CAPTURE(k);
        CHECK(by_position[k] == doctest::Approx(whole[k]).epsilon(1e-9).scale(largest));
      }
    }
  }
}

TEST_CASE("attention block moments: read through the embeddings' span, the same numbers") {
  // Ten tokens, embeddings of width 4: each position's input enters through ≤ 8 directions.
  const ModelConfig c = lm_config(10, 2, 4, 2);
  const PolynomialView a = random_lm(c, 401), b = random_lm(c, 402);
  const Matrix64 basis = shared_input_basis({&a, &b});
  REQUIRE(basis.cols == 8);
  const std::vector<double> full = attention_block_output_inner(a, b, 0.9), reduced = attention_block_output_inner(a, b, 0.9, &basis);
  REQUIRE(full.size() == reduced.size());
  for (size_t k = 0; k < full.size(); ++k) CHECK(reduced[k] == doctest::Approx(full[k]).epsilon(1e-10));
}

namespace {

// The exact similarity of two LMs by this route against a Monte Carlo estimate of `samples`
// inputs (within 4 standard errors, total, inner product and every token's slice); returns
// how many standard errors the recursion is off.
double check_against_monte_carlo(const PolynomialView& a, const PolynomialView& b, double input_std, uint64_t seed) {
  const std::vector<double> ab = attention_block_output_inner(a, b, input_std), aa = attention_block_output_inner(a, a, input_std),
                            bb = attention_block_output_inner(b, b, input_std);
  const int64_t classes = a.steps.back().weight.size(0);
  const DeepSimilarity exact = similarity_from_inner(ab, aa, bb, classes);
  const MonteCarloSimilarity mc = monte_carlo_estimate(a, b, 200000, seed, input_std);
  const double recursion_off = std::abs(deep_similarity(a, b, input_std).similarity - mc.similarity) / mc.similarity_se;
  MESSAGE(a.positions, " × ", a.input_dim, " one-block LMs: exact ", exact.similarity, ", Monte Carlo ", mc.similarity,
          " ± ", mc.similarity_se, "; the recursion is ", recursion_off, " standard errors off");
  CHECK(std::abs(exact.similarity - mc.similarity) < 4 * mc.similarity_se);
  CHECK(std::abs(exact.inner_ab - mc.inner_ab) < 4 * mc.inner_ab_se);
  REQUIRE(exact.slices.size() == mc.slices.size());
  for (size_t o = 0; o < mc.slices.size(); ++o) {
    CAPTURE(o);
    CHECK(std::abs(exact.slices[o] - mc.slices[o]) < 4 * mc.slice_se[o]);
  }
  return recursion_off;
}

}  // namespace

TEST_CASE("attention block moments: independent LMs of 4 positions × 7 tokens against Monte Carlo") {
  // The size issue 27 measured (dim 8, 2 heads): 28 input variables, beyond the whole-network route.
  ModelConfig c = lm_config(7, 4, 8, 2);
  SUBCASE("independent") {
    const PolynomialView a = random_lm(c, 501, 1.0f), b = random_lm(c, 502, 1.0f);
    CHECK(polynomial_cost(a).multiply_adds > 1e12);
    CHECK(check_against_monte_carlo(a, b, 1.0, 503) > 8);  // a pair the recursion gets wrong
  }
  SUBCASE("independent blocks between a shared embedding and unembedding, residual scale 0.5") {
    c.residual_scale = 0.5;
    const PolynomialView a = random_lm(c, 511);
    PolynomialView b = random_lm(c, 512);
    b.steps.front() = a.steps.front(), b.steps.back() = a.steps.back();
    check_against_monte_carlo(a, b, 0.8, 513);
  }
}
