// Importance sampling over directions (analysis/similarity/direction_proposal.h) and the Pareto
// tail diagnostic (pareto_tail.h): the mixture's density is the density its sampler draws from
// (so uniform/proposal weights are unbiased, shaped components included), the adapted proposal
// finds a peak that uniform directions rarely hit and takes its curvature in every direction,
// and the fitted tail shape recovers known shapes.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "analysis/similarity/direction_proposal.h"
#include "analysis/similarity/pareto_tail.h"
#include "engine/random.h"

using namespace adjoint;

namespace {

// E[u_1^{2p}] for u uniform on the unit sphere of R^m: Π_{i<p} (2i + 1)/(m + 2i).
double sphere_moment(int64_t m, int p) {
  double v = 1;
  for (int i = 0; i < p; ++i) v *= double(2 * i + 1) / double(m + 2 * i);
  return v;
}

struct MeanAndError {
  double mean = 0, se = 0;
};
MeanAndError mean_of(const std::vector<double>& v) {
  double sum = 0, squares = 0;
  for (double x : v) sum += x, squares += x * x;
  const double n = double(v.size()), mean = sum / n;
  return {mean, std::sqrt((squares / n - mean * mean) / (n - 1))};
}

// Three components in R^5, one concentrated on ±e_1, one loosely on ±(e_4 + e_5)/√2, one on ±e_2
// shaped (z's precision 9 along e_3, 0.25 along (e_4 − e_5)/√2, 1 elsewhere), and a uniform
// share of 0.2.
DirectionProposal three_component_proposal() {
  const int64_t m = 5;
  DirectionProposal p = DirectionProposal::uniform(m);
  p.uniform_share = 0.2, p.shares = {0.7, 0.15, 0.15};
  const double h = std::sqrt(0.5);
  p.components = {{{1, 0, 0, 0, 0}, 6.0, {}, {}},
                  {{0, 0, 0, h, h}, 1.5, {}, {}},
                  {{0, 1, 0, 0, 0}, 3.0, {0, 0, 1, 0, 0, 0, 0, 0, h, -h}, {9.0, 0.25}}};
  return p;
}

// E[h(u)] for u uniform on the sphere of R^m and h(u) = exp(−½·Σ_j κ_j·(u_j/u_1)²) (j ≥ 2; 0 at
// u_1 = 0): with u = z/|z|, z ~ N(0, I), it is E_{z_1}[Π_j (1 + κ_j/z_1²)^{−1/2}], a smooth integral
// over z_1 ~ N(0, 1) done by the trapezoid rule on [0, 12] (twice, by symmetry).
double gnomonic_gaussian_mean(const std::vector<double>& kappa) {
  const int points = 200000;
  const double top = 12, step = top / points;
  double sum = 0;
  for (int i = 1; i <= points; ++i) {
    const double z = i * step;
    double log_value = -z * z / 2;
    for (double k : kappa) log_value -= 0.5 * std::log1p(k / (z * z));
    sum += (i == points ? 0.5 : 1.0) * std::exp(log_value);
  }
  return 2 * sum * step / std::sqrt(2 * M_PI);
}

// The second difference of f at t = 0, (f(t) − 2f(0) + f(−t))/t².
template <typename F>
double curvature_along(F f, double t) { return (f(t) - 2 * f(0.0) + f(-t)) / (t * t); }

// The target adapt_direction_proposal reads: h at each of n directions of R^m laid end to end.
template <class H>
auto at_each_direction(H h_of, int64_t m) {
  return [h_of, m](const std::vector<double>& u, int64_t n) {
    std::vector<double> h(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) h[size_t(i)] = h_of(u.data() + i * m);
    return h;
  };
}

// n draws of h weighted by 1/q from the proposal, and n plain draws from uniform directions.
struct Draws {
  std::vector<double> weighted, plain;
};
template <class H>
Draws weighted_and_uniform_draws(H h_of, int64_t m, const DirectionProposal& proposal, int64_t n, Generator& gen) {
  const std::vector<double> u = proposal.sample(n, gen), q = proposal.density(u, n);
  const std::vector<double> v = DirectionProposal::uniform(m).sample(n, gen);
  Draws d{std::vector<double>(size_t(n)), std::vector<double>(size_t(n))};
  for (int64_t i = 0; i < n; ++i) d.weighted[size_t(i)] = h_of(u.data() + i * m) / q[size_t(i)], d.plain[size_t(i)] = h_of(v.data() + i * m);
  return d;
}

}  // namespace

TEST_CASE("direction proposal: the mixture's density is the law its sampler draws from") {
  const DirectionProposal p = three_component_proposal();
  const int64_t m = p.dimension, n = 200000;
  Generator gen(5);
  // Under the uniform law the density relative to it averages 1 …
  const std::vector<double> uniform_draws = DirectionProposal::uniform(m).sample(n, gen);
  const MeanAndError q_mean = mean_of(p.density(uniform_draws, n));
  // … and under the proposal, uniform/proposal weights give uniform expectations: E[1] and E[u_1⁴].
  const std::vector<double> u = p.sample(n, gen), q = p.density(u, n);
  std::vector<double> weight(static_cast<size_t>(n)), fourth(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) CHECK_UNARY(std::abs(u[size_t(i * m + j)]) <= 1);
    weight[size_t(i)] = 1 / q[size_t(i)], fourth[size_t(i)] = std::pow(u[size_t(i * m)], 4) / q[size_t(i)];
    CHECK_UNARY(weight[size_t(i)] <= 1 / p.uniform_share + 1e-12);
  }
  const MeanAndError w_mean = mean_of(weight), f_mean = mean_of(fourth);
  MESSAGE("E_uniform[q] = ", q_mean.mean, " ± ", q_mean.se, "; E_q[1/q] = ", w_mean.mean, " ± ", w_mean.se, "; E_q[u1^4/q] = ",
          f_mean.mean, " ± ", f_mean.se, " against ", sphere_moment(m, 2));
  CHECK(std::abs(q_mean.mean - 1) <= 4 * q_mean.se);
  CHECK(std::abs(w_mean.mean - 1) <= 4 * w_mean.se);
  CHECK(std::abs(f_mean.mean - sphere_moment(m, 2)) <= 4 * f_mean.se);
  // The proposal concentrates: the first component puts most of its mass near ±e_1.
  CHECK(f_mean.se > 0);
  double near_axis = 0;
  for (int64_t i = 0; i < n; ++i) near_axis += std::abs(u[size_t(i * m)]) > 0.9;
  CHECK(near_axis / double(n) > 0.4);  // the first component alone puts 0.56 · P(|u_1| > 0.9) there
}

TEST_CASE("direction proposal: adapted toward a sharp peak, it estimates the peak's mean with far less variance") {
  // h(u) = (u·e)^{40} on the sphere of R^12, e along (1, 1, 0, …)/√2: uniform directions near ±e
  // are rare (E_uniform[h] ≈ 1.2·10⁻⁹ while h(e) = 1).
  const int64_t m = 12;
  const int p = 20;
  auto h_of = [&](const double* u) { return std::pow((u[0] + u[1]) / std::sqrt(2.0), 2 * p); };
  const auto target = at_each_direction(h_of, m);
  Generator gen(11);
  const int64_t explored = 1024;
  const std::vector<double> u0 = DirectionProposal::uniform(m).sample(explored, gen), h0 = target(u0, explored);
  const ProposalFit fit = adapt_direction_proposal(m, target, u0, h0, explored, ProposalPlan{}, gen);
  MESSAGE("peaks ", fit.peaks, ", directions spent ", fit.draws, ", uniform draws' Pareto shape ", pareto_tail_shape(h0));
  CHECK(fit.peaks == 1);  // ±e is one peak
  REQUIRE_FALSE(fit.proposal.components.empty());
  const int64_t n = 20000;
  const auto [weighted, plain] = weighted_and_uniform_draws(h_of, m, fit.proposal, n, gen);
  const MeanAndError is = mean_of(weighted), uniform = mean_of(plain);
  const double exact = sphere_moment(m, p);
  MESSAGE("exact ", exact, "; importance sampled ", is.mean, " ± ", is.se, "; uniform ", uniform.mean, " ± ", uniform.se,
          "; Pareto shape ", pareto_shape_both_tails(weighted), " against ", pareto_shape_both_tails(plain));
  CHECK(std::abs(is.mean - exact) <= 4 * is.se);
  CHECK(is.se * 10 < exact);
  CHECK(is.se * 10 < uniform.se);
  CHECK(pareto_shape_both_tails(weighted) < pareto_shape_limit(n));
  CHECK(pareto_shape_both_tails(plain) > pareto_shape_limit(n));
}

TEST_CASE("direction proposal: each component takes its peak's curvature in every tangent direction") {
  // h(u) = exp(−½·Σ_j κ_j·(u_j/u_1)²) on the sphere of R^40: one peak at ±e_1, log h exactly
  // quadratic in the gnomonic coordinates u_j/u_1 (lighter than a Gaussian in the angle), flat along
  // e_2…e_11 (κ = 4) and steep along the rest (κ = 100). A random tangent mixes the two kinds, so
  // the flattest of a few random tangents reads far steeper than 4.
  const int64_t m = 40;
  std::vector<double> kappa(static_cast<size_t>(m - 1), 100.0);
  for (size_t j = 0; j < 10; ++j) kappa[j] = 4;
  auto h_of = [&](const double* u) {
    if (u[0] == 0) return 0.0;
    double q = 0;
    for (int64_t j = 1; j < m; ++j) q += kappa[size_t(j - 1)] * (u[j] / u[0]) * (u[j] / u[0]);
    return std::exp(-q / 2);
  };
  const auto target = at_each_direction(h_of, m);
  Generator gen(17);
  const int64_t explored = 1024;
  const std::vector<double> u0 = DirectionProposal::uniform(m).sample(explored, gen), h0 = target(u0, explored);
  const ProposalPlan plan;
  const ProposalFit fit = adapt_direction_proposal(m, target, u0, h0, explored, plan, gen);
  MESSAGE("peaks ", fit.peaks, " (unconverged ", fit.unconverged, "), directions spent ", fit.draws);
  CHECK(fit.peaks == 1);
  CHECK(fit.unconverged == 0);
  REQUIRE(fit.proposal.components.size() == 1);
  const ProjectedNormal& c = fit.proposal.components[0];
  CHECK(std::abs(c.mean[0]) > 0.999);
  // The component's log density from its centre μ toward e_2 (flat) and e_20 (steep) curves as
  // the peak's, over the widening.
  auto along = [&](int64_t axis) {
    std::vector<double> v(static_cast<size_t>(m), 0.0);
    v[size_t(axis)] = 1;
    double norm = 0;
    for (int64_t j = 0; j < m; ++j) v[size_t(j)] -= c.mean[size_t(axis)] * c.mean[size_t(j)], norm += v[size_t(j)] * v[size_t(j)];
    for (double& x : v) x /= std::sqrt(norm);
    return [&, v](double t) {
      std::vector<double> u(static_cast<size_t>(m));
      for (int64_t j = 0; j < m; ++j) u[size_t(j)] = c.mean[size_t(j)] * std::cos(t) + v[size_t(j)] * std::sin(t);
      return log_density(c, u.data(), m);
    };
  };
  const double flat = -curvature_along(along(1), 1e-3), steep = -curvature_along(along(19), 1e-3);
  MESSAGE("component's curvature along a flat axis ", flat, " (peak 4), along a steep one ", steep, " (peak 100); widening ",
          plan.widening);
  CHECK(flat == doctest::Approx(4 / plan.widening).epsilon(0.05));
  CHECK(steep == doctest::Approx(100 / plan.widening).epsilon(0.05));
  // And the estimate from it is unbiased, with a light tail, where uniform directions' is heavy.
  const int64_t n = 20000;
  const auto [weighted, plain] = weighted_and_uniform_draws(h_of, m, fit.proposal, n, gen);
  const MeanAndError is = mean_of(weighted), uniform = mean_of(plain);
  const double exact = gnomonic_gaussian_mean(kappa);
  MESSAGE("exact ", exact, "; importance sampled ", is.mean, " ± ", is.se, "; uniform ", uniform.mean, " ± ", uniform.se,
          "; Pareto shape ", pareto_shape_both_tails(weighted), " against ", pareto_shape_both_tails(plain));
  CHECK(std::abs(is.mean - exact) <= 4 * is.se);
  CHECK(is.se * 20 < exact);
  CHECK(pareto_shape_both_tails(weighted) < pareto_shape_limit(n));
  CHECK(pareto_shape_both_tails(plain) > pareto_shape_limit(n));
}

TEST_CASE("Pareto tail shape: recovers the shape of Pareto draws and finds none in a Gaussian's tail") {
  Generator gen(3);
  const int64_t n = 20000;
  const std::vector<float> uniforms = uniform({n}, 0.0f, 1.0f, gen).to_vector();
  const std::vector<float> gaussian = normal({n}, 0.0f, 1.0f, gen).to_vector();
  for (double k : {0.3, 0.6, 1.0}) {
    // U^{−k} has a generalised Pareto tail of shape k.
    std::vector<double> draws(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) draws[size_t(i)] = std::pow(1 - double(uniforms[size_t(i)]), -k);
    const double fitted = pareto_tail_shape(draws);
    MESSAGE("shape ", k, ": fitted ", fitted);
    CHECK(std::abs(fitted - k) < 0.12);
    for (double& d : draws) d = -d;
    CHECK(pareto_shape_both_tails(draws) == doctest::Approx(fitted));
  }
  const double normal_shape = pareto_tail_shape(std::vector<double>(gaussian.begin(), gaussian.end()));
  MESSAGE("Gaussian: fitted ", normal_shape);
  CHECK(normal_shape < 0.2);
  CHECK(pareto_tail_shape(std::vector<double>(100, 2.0)) < 0);  // no tail at all
  CHECK(pareto_shape_limit(1024) == doctest::Approx(1 - 1 / std::log10(1024.0)));
  CHECK(pareto_shape_limit(100000) == 0.7);
}
