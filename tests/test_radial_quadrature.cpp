// The radial rule of the spherical–radial Monte Carlo (analysis/similarity/radial_quadrature.h):
// it integrates χ_m's moments exactly up to degree 2n − 1 and not beyond, and along a direction
// it gives the same mean of a network's product with n points as with more, for a network of
// known degree.
#include <doctest/doctest.h>

#include <cmath>

#include "analysis/similarity/radial_quadrature.h"
#include "engine/random.h"
#include "models/paper_lm.h"

using namespace adjoint;

namespace {

// E[r^k], r ~ χ_m, written on the whole line (odd powers average with their mirror to zero):
// m·(m + 2)·…·(m + k − 2) for even k.
double chi_moment(int64_t m, int k) {
  if (k % 2 == 1) return 0.0;
  double v = 1;
  for (int i = 0; i < k / 2; ++i) v *= double(m + 2 * i);
  return v;
}

double rule_moment(const RadialRule& rule, int k) {
  double v = 0;
  for (size_t i = 0; i < rule.nodes.size(); ++i) v += rule.weights[i] * std::pow(rule.nodes[i], k);
  return v;
}

}  // namespace

TEST_CASE("radial rule: χ_m's moments exactly to degree 2n − 1, and not at 2n") {
  for (int64_t m : {1, 2, 7, 44, 300})
    for (int n : {1, 2, 5, 13, 26}) {
      const RadialRule rule = radial_rule(m, n);
      REQUIRE(rule.nodes.size() == size_t(n));
      for (double w : rule.weights) CHECK(w > 0);
      for (int k = 0; k <= 2 * n - 1; ++k) {
        const double exact = chi_moment(m, k), got = rule_moment(rule, k);
        // Odd moments vanish by symmetry; even ones to rounding relative to themselves.
        if (k % 2 == 1) CHECK(std::abs(got) <= 1e-12 * std::sqrt(chi_moment(m, k - 1) * chi_moment(m, k + 1)));
        else CHECK(got == doctest::Approx(exact).epsilon(1e-11));
      }
      // Degree 2n is beyond the rule: it puts the monic p_n² to zero at its nodes, missing its
      // mean ‖p_n‖² = β_1·…·β_n (β_k = k for even k, k + m − 1 for odd k), and nothing else.
      double norm = 1;
      for (int k = 1; k <= n; ++k) norm *= double(k % 2 == 0 ? k : k + m - 1);
      const double missed = chi_moment(m, 2 * n) - rule_moment(rule, 2 * n);
      CHECK(std::abs(missed - norm) <= 1e-10 * chi_moment(m, 2 * n));
    }
}

TEST_CASE("radial rule: one and two points by hand") {
  const RadialRule one = radial_rule(9, 1), two = radial_rule(9, 2);
  CHECK(one.nodes[0] == 0.0);
  CHECK(one.weights[0] == doctest::Approx(1.0));
  // Two points ±sqrt(m), half each: E[r²] = m.
  CHECK(two.nodes[0] == doctest::Approx(-3.0));
  CHECK(two.nodes[1] == doctest::Approx(3.0));
  CHECK(two.weights[0] == doctest::Approx(0.5));
}

TEST_CASE("radial rule: along a direction, a degree-25 attention LM's product is integrated exactly") {
  PaperLmShape shape;
  shape.heads = 2, shape.vocab = 3, shape.dim = 4, shape.layers = 2;
  Generator ga(3), gb(4), gu(5);
  const PolynomialView a = paper_lm_view(paper_lm_random_state(shape, ga), shape, 3, "a"),
                       b = paper_lm_view(paper_lm_random_state(shape, gb), shape, 3, "b");
  REQUIRE(polynomial_degree(a) == 25);
  const int degree = polynomial_degree(a) + polynomial_degree(b);
  const int64_t m = a.positions * a.input_dim;
  std::vector<float> u = normal({m}, 0.0f, 1.0f, gu).to_vector();
  // E_r[f_a(r u)·f_b(r u)] by a rule of n points.
  auto along = [&](int n) {
    const RadialRule rule = radial_rule(m, n);
    std::vector<double> x;
    for (double r : rule.nodes)
      for (float v : u) x.push_back(0.6 * r * double(v));
    const std::vector<double> fa = evaluate_polynomial(a, x, n), fb = evaluate_polynomial(b, x, n);
    const size_t per = fa.size() / size_t(n);
    double mean = 0;
    for (size_t i = 0; i < size_t(n); ++i)
      for (size_t k = i * per; k < (i + 1) * per; ++k) mean += rule.weights[i] * fa[k] * fb[k];
    return mean;
  };
  const int n = radial_points_for(degree);
  MESSAGE("degree ", degree, ": ", n, " points ", along(n), ", ", n + 7, " points ", along(n + 7), ", ", n / 2, " points ",
          along(n / 2));
  CHECK(along(n) == doctest::Approx(along(n + 7)).epsilon(1e-12));
  CHECK(along(n) == doctest::Approx(along(n + 1)).epsilon(1e-12));
  // A rule exact only to degree 25 leaves out the top half of the degrees: a visible error.
  CHECK(std::abs(along(n / 2) - along(n)) > 1e-6 * std::abs(along(n)));
}
