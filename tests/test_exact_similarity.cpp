// The exact Gaussian inner product of deep polynomial networks (analysis/similarity/exact_moments.h)
// against a hand computation, the one-layer recursion, the expansion's own evaluation and a
// Monte Carlo estimate made here (analysis/similarity/monte_carlo.h), on independent networks.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "analysis/similarity/exact_moments.h"
#include "analysis/similarity/monte_carlo.h"
#include "analysis/similarity/second_moment.h"
#include "engine/error.h"
#include "engine/random.h"
#include "models/model.h"
#include "tests/support.h"

using namespace adjoint;

namespace {

Tensor matrix(int64_t rows, int64_t cols, std::vector<float> values) { return Tensor::from_vector({rows, cols}, std::move(values)); }

// One residual block h ← h + (L h̃) ⊙ (R h̃) on a scalar h, L = (l0, l1), R = (r0, r1).
PolynomialStep scalar_block(float l0, float l1, float r0, float r1) {
  PolynomialStep s;
  s.kind = PolynomialStep::Kind::Bilinear;
  s.name = "block";
  s.left = matrix(1, 2, {l0, l1}), s.right = matrix(1, 2, {r0, r1}), s.down = matrix(1, 1, {1});
  s.residual = true;
  return s;
}

ModelConfig mlp_config(int64_t depth, int64_t inputs, int64_t hidden, int64_t classes) {
  ModelConfig c;
  c.arch = "bilinear_mlp";
  c.in_features = inputs, c.hidden = hidden, c.num_classes = classes, c.depth = depth;
  return c;
}

PolynomialView random_view(const ModelConfig& c, uint64_t seed) {
  Generator g(seed);
  return make_model(c, g)->polynomial_view();
}

}  // namespace

TEST_CASE("exact moments: a scalar network by hand") {
  // h1 = x + x², h2 = h1 + h1² = x + 2x² + 2x³ + x⁴. With E[x^k] = (k−1)!! σ^k:
  // E[h2²] = 1 + 12 + 12 + 60 + 60 + 105 = 250 at σ = 1, E[h2·x] = 1 + 2·3 = 7.
  PolynomialView deep{"scalar", 1, 1, {scalar_block(0, 1, 0, 1), scalar_block(0, 1, 0, 1)}};
  PolynomialView identity{"identity", 1, 1, {}};
  const OutputExpansion f = expand_output(deep), x = expand_output(identity);
  CHECK(exact_output_inner(f, f)[0] == doctest::Approx(250).epsilon(1e-12));
  CHECK(exact_output_inner(f, x)[0] == doctest::Approx(7).epsilon(1e-12));
  // σ = 0.5: Σ c_i c_j m_{i+j} σ^{i+j} term by term.
  const double s = 0.5;
  const double want = std::pow(s, 2) + (12 + 12) * std::pow(s, 4) + (60 + 60) * std::pow(s, 6) + 105 * std::pow(s, 8);
  CHECK(exact_output_inner(f, f, s)[0] == doctest::Approx(want).epsilon(1e-12));
  // A bias in the blocks: h1 = x + (1 + x)·x = 2x + x², a constant term through the second block.
  PolynomialView biased{"biased", 1, 1, {scalar_block(1, 1, 0, 1)}};
  // E[(2x + x²)²] = 4 + 3 = 7, E[(2x + x²)·x] = 2.
  const OutputExpansion g = expand_output(biased);
  CHECK(exact_output_inner(g, g)[0] == doctest::Approx(7).epsilon(1e-12));
  CHECK(exact_output_inner(g, x)[0] == doctest::Approx(2).epsilon(1e-12));
  CHECK(telephone_number(8) == 764);
}

TEST_CASE("exact moments: the expansion evaluates to the network") {
  for (int64_t depth : {0, 1, 2}) {
    CAPTURE(depth);
    ModelConfig c = mlp_config(depth, 6, 4, 3);
    if (depth == 2) c.dim = 5;  // with an embedding
    const PolynomialView v = random_view(c, 3 + uint64_t(depth));
    const OutputExpansion e = expand_output(v);
    const std::vector<double> x = {0.3, -1.2, 0.7, 0.1, 2.0, -0.4};
    const std::vector<double> want = evaluate_polynomial(v, x, 1), got = evaluate_expansion(e, x);
    REQUIRE(got.size() == want.size());
    for (size_t k = 0; k < want.size(); ++k) CHECK(got[k] == doctest::Approx(want[k]).epsilon(1e-12));
  }
}

TEST_CASE("exact moments: one residual block equals the recursion, exact there") {
  const ModelConfig c = mlp_config(1, 5, 4, 3);
  const PolynomialView a = random_view(c, 1), b = random_view(c, 2);
  for (double s : {1.0, 0.6}) {
    const DeepSimilarity exact = exact_similarity(expand_output(a), expand_output(b), s), recursion = deep_similarity(a, b, s);
    CHECK(exact.inner_ab == doctest::Approx(recursion.inner_ab).epsilon(1e-12));
    CHECK(exact.inner_aa == doctest::Approx(recursion.inner_aa).epsilon(1e-12));
    CHECK(exact.similarity == doctest::Approx(recursion.similarity).epsilon(1e-12));
    REQUIRE(exact.slices.size() == recursion.slices.size());
    for (size_t o = 0; o < exact.slices.size(); ++o) CHECK(exact.slices[o] == doctest::Approx(recursion.slices[o]).epsilon(1e-12));
  }
}

TEST_CASE("exact moments: independent depth-2 MLPs against Monte Carlo") {
  ModelConfig c = mlp_config(2, 6, 4, 3);
  const PolynomialView a = random_view(c, 11), b = random_view(c, 12);
  const double input_std = 0.7;
  const DeepSimilarity exact = exact_similarity(expand_output(a), expand_output(b), input_std);
  const DeepSimilarity recursion = deep_similarity(a, b, input_std);
  const MonteCarloSimilarity mc = monte_carlo_estimate(a, b, 400000, 21, input_std);
  MESSAGE("depth 2, independent: exact ", exact.similarity, ", Monte Carlo ", mc.similarity, " ± ", mc.similarity_se,
          ", recursion ", recursion.similarity);
  CHECK(std::abs(exact.similarity - mc.similarity) < 4 * mc.similarity_se);
  CHECK(std::abs(exact.inner_ab - mc.inner_ab) < 4 * mc.inner_ab_se);
  REQUIRE(exact.slices.size() == mc.slices.size());
  for (size_t o = 0; o < mc.slices.size(); ++o) {
    CAPTURE(o);
    CHECK(std::abs(exact.slices[o] - mc.slices[o]) < 4 * mc.slice_se[o]);
  }
}
