#include "analysis/similarity/radial_quadrature.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"
#include "engine/matrix64.h"

namespace adjoint {

namespace {

// β_k of the monic recurrence, k ≥ 1.
double beta(int64_t k, int64_t m) { return k % 2 == 0 ? double(k) : double(k + m - 1); }

// The orthonormal polynomials p̂_0 … p̂_{n} at r (p̂_0 = 1: the weight is a probability):
// sqrt(β_{k+1})·p̂_{k+1} = r·p̂_k − sqrt(β_k)·p̂_{k−1}.
std::vector<double> orthonormal_values(double r, int n, int64_t m) {
  std::vector<double> p(size_t(n + 1));
  p[0] = 1;
  if (n >= 1) p[1] = r / std::sqrt(beta(1, m));
  for (int k = 1; k < n; ++k) p[size_t(k + 1)] = (r * p[size_t(k)] - std::sqrt(beta(k, m)) * p[size_t(k - 1)]) / std::sqrt(beta(k + 1, m));
  return p;
}

// p̂_n(r) and its derivative, for Newton's method.
std::pair<double, double> last_and_derivative(double r, int n, int64_t m) {
  double p_prev = 0, p = 1, d_prev = 0, d = 0;
  for (int k = 0; k < n; ++k) {
    const double b_next = std::sqrt(beta(k + 1, m)), b = k > 0 ? std::sqrt(beta(k, m)) : 0.0;
    const double p_next = (r * p - b * p_prev) / b_next, d_next = (p + r * d - b * d_prev) / b_next;
    p_prev = p, p = p_next, d_prev = d, d = d_next;
  }
  return {p, d};
}

}  // namespace

RadialRule radial_rule(int64_t m, int n) {
  check(m >= 1, "radial rule: the dimension must be at least 1, got ", m);
  check(n >= 1 && n <= 200, "radial rule: between 1 and 200 points, got ", n);
  Matrix64 jacobi(n, n);
  for (int k = 0; k + 1 < n; ++k) jacobi(k, k + 1) = jacobi(k + 1, k) = std::sqrt(beta(k + 1, m));
  RadialRule rule;
  rule.dimension = m;
  rule.nodes = symmetric_eigen(jacobi).values;
  std::sort(rule.nodes.begin(), rule.nodes.end());
  for (double& r : rule.nodes)
    for (int step = 0; step < 3; ++step) {
      const auto [p, d] = last_and_derivative(r, n, m);
      if (d != 0) r -= p / d;
    }
  // Exactly symmetric: the rule then integrates every odd power to zero.
  for (int i = 0; i < n / 2; ++i) {
    const double r = 0.5 * (rule.nodes[size_t(n - 1 - i)] - rule.nodes[size_t(i)]);
    rule.nodes[size_t(i)] = -r, rule.nodes[size_t(n - 1 - i)] = r;
  }
  if (n % 2 == 1) rule.nodes[size_t(n / 2)] = 0;
  double total = 0;
  for (double r : rule.nodes) {
    double christoffel = 0;
    const std::vector<double> p = orthonormal_values(r, n - 1, m);
    for (double v : p) christoffel += v * v;
    rule.weights.push_back(1 / christoffel);
    total += rule.weights.back();
  }
  for (double& w : rule.weights) w /= total;  // Σ w = 1 to rounding already: removes the last ulp's drift
  return rule;
}

int radial_points_for(int degree) { return std::max(degree, 0) / 2 + 1; }

int polynomial_degree(const PolynomialView& view) {
  int degree = 1;
  for (const PolynomialStep& s : view.steps) {
    if (s.kind == PolynomialStep::Kind::Bilinear) degree *= 2;
    else if (s.kind == PolynomialStep::Kind::Attention) degree *= 5;
  }
  return degree;
}

}  // namespace adjoint
