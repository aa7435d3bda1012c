#include "analysis/similarity/direction_proposal.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/error.h"

namespace adjoint {

namespace {

double dot(const double* x, const double* y, int64_t m) {
  double s = 0;
  for (int64_t f = 0; f < m; ++f) s += x[f] * y[f];
  return s;
}

// log J_k(a), J_k(a) = ∫_0^∞ r^k e^{−(r−a)²/2} dr, by the recurrence J_k = a·J_{k−1} + (k − 1)·J_{k−2}
// (integration by parts) from J_0 = sqrt(π/2)·erfc(−a/√2) and J_1 = a·J_0 + e^{−a²/2}, rescaled as
// it grows. For a far below 0 the recurrence cancels; −∞ is returned where it breaks down, which
// happens only where the term is negligible beside its mirror image (monte_carlo's mixture holds
// both signs).
double log_radial_moment(int64_t k, double a) {
  double previous = std::sqrt(M_PI / 2) * std::erfc(-a / std::sqrt(2.0)), current = a * previous + std::exp(-a * a / 2);
  if (k == 0) return std::log(previous);
  double log_scale = 0;
  for (int64_t i = 2; i <= k; ++i) {
    const double next = a * current + double(i - 1) * previous;
    previous = current, current = next;
    if (std::abs(current) > 1e150) previous *= 1e-150, current *= 1e-150, log_scale += 150 * std::log(10.0);
  }
  return current > 0 ? std::log(current) + log_scale : -std::numeric_limits<double>::infinity();
}

// log of the projected normal's density relative to the uniform law, for one sign of its mean:
// with a = s·μ·u, log[area(S^{m−1})·(2π)^{−m/2}] − (s² − a²)/2 + log J_{m−1}(a).
double log_density_one_side(const ProjectedNormal& c, double cosine, int64_t m) {
  const double a = c.distance * cosine;
  const double constant = std::log(2.0) - std::lgamma(double(m) / 2) - double(m) / 2 * std::log(2.0);
  return constant - (c.distance * c.distance - a * a) / 2 + log_radial_moment(m - 1, a);
}

double log_sum_exp(const std::vector<double>& v) {
  const double top = *std::max_element(v.begin(), v.end());
  if (!std::isfinite(top)) return top;
  double sum = 0;
  for (double x : v) sum += std::exp(x - top);
  return top + std::log(sum);
}

}  // namespace

double log_density(const ProjectedNormal& c, const double* u, int64_t m) {
  const double cosine = dot(c.mean.data(), u, m);
  const std::vector<double> sides = {log_density_one_side(c, cosine, m), log_density_one_side(c, -cosine, m)};
  return log_sum_exp(sides) - std::log(2.0);
}

DirectionProposal DirectionProposal::uniform(int64_t dimension) {
  DirectionProposal p;
  p.dimension = dimension;
  return p;
}

std::vector<double> DirectionProposal::sample(int64_t n, Generator& gen) const {
  const int64_t m = dimension;
  const std::vector<float> z = normal({n, m}, 0.0f, 1.0f, gen).to_vector(), pick = adjoint::uniform({n}, 0.0f, 1.0f, gen).to_vector(),
                           sign = adjoint::uniform({n}, 0.0f, 1.0f, gen).to_vector();
  std::vector<double> u(size_t(n * m));
  for (int64_t i = 0; i < n; ++i) {
    double* row = u.data() + i * m;
    for (int64_t j = 0; j < m; ++j) row[j] = double(z[size_t(i * m + j)]);
    // Which part of the mixture draws row i: the uniform law, or component k (its mean ±s·μ).
    if (!components.empty() && double(pick[size_t(i)]) >= uniform_share) {
      double c = (double(pick[size_t(i)]) - uniform_share) / (1 - uniform_share);
      size_t k = 0;
      while (k + 1 < shares.size() && c >= shares[k]) c -= shares[k], ++k;
      const double shift = (sign[size_t(i)] < 0.5f ? 1.0 : -1.0) * components[k].distance;
      for (int64_t j = 0; j < m; ++j) row[j] += shift * components[k].mean[size_t(j)];
    }
    const double norm = std::sqrt(dot(row, row, m));
    for (int64_t j = 0; j < m; ++j) row[j] /= norm;
  }
  return u;
}

std::vector<double> DirectionProposal::density(const std::vector<double>& u, int64_t n) const {
  std::vector<double> q(size_t(n), 1.0);
  if (components.empty()) return q;
  std::vector<double> terms(components.size() + 1);
  for (int64_t i = 0; i < n; ++i) {
    terms[0] = std::log(uniform_share);
    for (size_t k = 0; k < components.size(); ++k)
      terms[k + 1] = std::log((1 - uniform_share) * shares[k]) + log_density(components[k], u.data() + i * dimension, dimension);
    q[size_t(i)] = std::exp(log_sum_exp(terms));
  }
  return q;
}

namespace {

using Target = std::function<std::vector<double>(const std::vector<double>&, int64_t)>;

// The unit vectors (centre + step·z_i)/|…| for the rows z_i of `steps`.
std::vector<double> around(const std::vector<double>& centre, const std::vector<double>& steps, int64_t n, double step) {
  const int64_t m = int64_t(centre.size());
  std::vector<double> u(size_t(n * m));
  for (int64_t i = 0; i < n; ++i) {
    double norm = 0;
    for (int64_t f = 0; f < m; ++f) {
      const double x = centre[size_t(f)] + step * steps[size_t(i * m + f)];
      u[size_t(i * m + f)] = x, norm += x * x;
    }
    norm = std::sqrt(norm);
    for (int64_t f = 0; f < m; ++f) u[size_t(i * m + f)] /= norm;
  }
  return u;
}

// A local maximum of the target near `start` by a (1 + λ) evolution strategy: λ random steps of
// length `step` around the best direction so far; the best candidate replaces it when higher,
// and the step grows by 1.2 on success and halves on failure.
std::vector<double> climb(std::vector<double> best, double value, const Target& target, const ProposalPlan& plan, Generator& gen,
                          int64_t& spent) {
  const int64_t m = int64_t(best.size()), n = plan.climb_candidates;
  double step = 0.3;
  for (int iteration = 0; iteration < plan.climb_steps && step > 1e-4; ++iteration) {
    const std::vector<double> u = around(best, DirectionProposal::uniform(m).sample(n, gen), n, step);
    const std::vector<double> h = target(u, n);
    spent += n;
    const int64_t top = std::max_element(h.begin(), h.end()) - h.begin();
    if (h[size_t(top)] > value) {
      value = h[size_t(top)], best.assign(u.begin() + top * m, u.begin() + (top + 1) * m), step *= 1.2;
    } else {
      step *= 0.5;
    }
  }
  return best;
}

// The target's curvature at a peak μ in its flattest direction: along random unit tangent
// vectors v, the drop of log h from μ to μ ± t·v (the mean of both sides, which cancels a
// residual slope) is about κ_v·t²/2; κ = the smallest κ_v seen, at the largest t whose drop
// stays within 3 (inside the peak's quadratic part). A proposal component as wide as the flattest
// direction is nowhere narrower than the peak, which keeps the weights' variance finite.
double flattest_curvature(const std::vector<double>& peak, const Target& target, const ProposalPlan& plan, Generator& gen,
                          int64_t& spent) {
  const int64_t m = int64_t(peak.size()), k = plan.curvature_directions;
  const double steps[] = {0.3, 0.1, 0.03, 0.01, 0.003};
  std::vector<double> v = DirectionProposal::uniform(m).sample(k, gen);
  for (int64_t i = 0; i < k; ++i) {  // tangent at μ
    double* row = v.data() + i * m;
    const double along = dot(row, peak.data(), m);
    double norm = 0;
    for (int64_t f = 0; f < m; ++f) row[f] -= along * peak[size_t(f)], norm += row[f] * row[f];
    for (int64_t f = 0; f < m; ++f) row[f] /= std::sqrt(norm);
  }
  std::vector<double> both(size_t(2 * k * m));
  for (int64_t i = 0; i < k * m; ++i) both[size_t(i)] = v[size_t(i)], both[size_t(k * m + i)] = -v[size_t(i)];
  const double centre = std::log(target(peak, 1)[0]);
  spent += 1;
  std::vector<double> curvature(size_t(k), INFINITY);
  std::vector<bool> settled(size_t(k), false);
  for (double t : steps) {
    const std::vector<double> h = target(around(peak, both, 2 * k, t), 2 * k);
    spent += 2 * k;
    for (int64_t i = 0; i < k; ++i) {
      if (settled[size_t(i)]) continue;
      const double drop = centre - 0.5 * (std::log(h[size_t(i)]) + std::log(h[size_t(k + i)]));
      if (drop > 0 && drop <= 3) curvature[size_t(i)] = 2 * drop / (t * t), settled[size_t(i)] = true;
    }
  }
  const double flattest = *std::min_element(curvature.begin(), curvature.end());
  return std::isfinite(flattest) ? flattest : double(m);
}

}  // namespace

ProposalFit adapt_direction_proposal(int64_t m, const Target& target, const std::vector<double>& u0, const std::vector<double>& h0,
                                     int64_t explored, const ProposalPlan& plan, Generator& gen) {
  check(plan.share_draws >= 16, "direction proposal: needs at least 16 draws to set the shares");
  check(int64_t(u0.size()) == explored * m && int64_t(h0.size()) == explored, "direction proposal: ", explored,
        " explored directions need their rows and target values");
  ProposalFit fit;
  fit.proposal = DirectionProposal::uniform(m);
  for (double h : h0) check(h >= 0 && std::isfinite(h), "direction proposal: the target must be finite and non-negative");
  if (m < 2) return fit;
  // Peaks: climbs from the highest draws, each start away from those before (|cos| < 0.9).
  std::vector<int64_t> order(static_cast<size_t>(explored));
  for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
  std::sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return h0[size_t(i)] > h0[size_t(j)]; });
  std::vector<std::vector<double>> peaks;
  std::vector<int64_t> starts;
  for (int64_t i : order) {
    if (int(starts.size()) == plan.peaks || !(h0[size_t(i)] > 0)) break;
    bool apart = true;
    for (int64_t j : starts) apart = apart && std::abs(dot(&u0[size_t(i * m)], &u0[size_t(j * m)], m)) < 0.9;
    if (!apart) continue;
    starts.push_back(i);
    std::vector<double> peak = climb(std::vector<double>(u0.begin() + i * m, u0.begin() + (i + 1) * m), h0[size_t(i)], target,
                                     plan, gen, fit.draws);
    bool known = false;
    for (const auto& p : peaks) known = known || std::abs(dot(p.data(), peak.data(), m)) > 0.99;
    if (!known) peaks.push_back(std::move(peak));
  }
  // A component at each peak, as concentrated as the peak's flattest direction allows: near ±μ
  // the projected normal's log density falls as −κ_s·θ²/2 in the angle θ from μ, with
  // κ_s = s·E[r] for r of density ∝ r^{m−1}e^{−(r−s)²/2} (the derivative of log J_{m−1}), which
  // rises from 0 at s = 0 (the uniform law) to about s² + m − 1; it is matched to κ/1.5 (wider than
  // the peak, so that the weights' variance stays finite).
  DirectionProposal q = DirectionProposal::uniform(m);
  for (auto& peak : peaks) {
    const double wanted = flattest_curvature(peak, target, plan, gen, fit.draws) / 1.5;
    auto precision = [m](double s) { return s * std::exp(log_radial_moment(m, s) - log_radial_moment(m - 1, s)); };
    double low = 0, high = std::sqrt(wanted) + 1;
    for (int step = 0; step < 60; ++step) {
      const double mid = 0.5 * (low + high);
      (precision(mid) < wanted ? low : high) = mid;
    }
    if (low > 0.05) q.components.push_back({std::move(peak), low});
  }
  const size_t K = q.components.size();
  fit.peaks = int(K);
  if (K == 0) return fit;
  // The shares: half uniform and the rest equal at first, then, for `share_rounds` rounds, each
  // part's share of the target's mass over draws from the current mixture (each draw's weight
  // h/q split among the parts by their responsibility for it: population Monte Carlo's update),
  // the uniform share kept at least at its floor.
  q.uniform_share = 0.5;
  q.shares.assign(K, 1.0 / double(K));
  const int64_t n = plan.share_draws;
  for (int round = 0; round < plan.share_rounds; ++round) {
    const std::vector<double> u1 = q.sample(n, gen), h1 = target(u1, n), q1 = q.density(u1, n);
    fit.draws += n;
    std::vector<double> mass(K + 1, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const double w = h1[size_t(i)] / q1[size_t(i)], qi = q1[size_t(i)];
      mass[0] += w * q.uniform_share / qi;
      for (size_t k = 0; k < K; ++k)
        mass[k + 1] += w * (1 - q.uniform_share) * q.shares[k] * std::exp(log_density(q.components[k], &u1[size_t(i * m)], m)) / qi;
    }
    double total = 0;
    for (double x : mass) total += x;
    if (!(total - mass[0] > 0)) return fit;  // the peaks hold none of the mass: uniform directions
    q.uniform_share = std::max(mass[0] / total, plan.uniform_floor);
    for (size_t k = 0; k < K; ++k) q.shares[k] = mass[k + 1] / (total - mass[0]);
  }
  fit.proposal = q;
  return fit;
}

}  // namespace adjoint
