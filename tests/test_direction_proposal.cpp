// Importance sampling over directions (analysis/similarity/direction_proposal.h) and the Pareto
// tail diagnostic (pareto_tail.h): the mixture's density is the density its sampler draws from
// (so uniform/proposal weights are unbiased), the adapted proposal finds a peak that uniform
// directions rarely hit, and the fitted tail shape recovers known shapes.
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

// Two components in R^5, one concentrated on ±e_1, one loosely on ±(e_4 + e_5)/√2, and a uniform
// share of 0.2.
DirectionProposal two_component_proposal() {
  const int64_t m = 5;
  DirectionProposal p = DirectionProposal::uniform(m);
  p.uniform_share = 0.2, p.shares = {0.7, 0.3};
  p.components = {{{1, 0, 0, 0, 0}, 6.0}, {{0, 0, 0, std::sqrt(0.5), std::sqrt(0.5)}, 1.5}};
  return p;
}

}  // namespace

TEST_CASE("direction proposal: the mixture's density is the law its sampler draws from") {
  const DirectionProposal p = two_component_proposal();
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
  auto target = [&](const std::vector<double>& u, int64_t n) {
    std::vector<double> h(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) h[size_t(i)] = h_of(u.data() + i * m);
    return h;
  };
  Generator gen(11);
  const int64_t explored = 1024;
  const std::vector<double> u0 = DirectionProposal::uniform(m).sample(explored, gen), h0 = target(u0, explored);
  const ProposalFit fit = adapt_direction_proposal(m, target, u0, h0, explored, ProposalPlan{}, gen);
  MESSAGE("peaks ", fit.peaks, ", directions spent ", fit.draws, ", uniform draws' Pareto shape ", pareto_tail_shape(h0));
  CHECK(fit.peaks == 1);  // ±e is one peak
  REQUIRE_FALSE(fit.proposal.components.empty());
  const int64_t n = 20000;
  const std::vector<double> u = fit.proposal.sample(n, gen), q = fit.proposal.density(u, n);
  const std::vector<double> v = DirectionProposal::uniform(m).sample(n, gen);
  std::vector<double> weighted(static_cast<size_t>(n)), plain(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) weighted[size_t(i)] = h_of(u.data() + i * m) / q[size_t(i)], plain[size_t(i)] = h_of(v.data() + i * m);
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
