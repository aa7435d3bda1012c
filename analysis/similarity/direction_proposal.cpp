#include "analysis/similarity/direction_proposal.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "analysis/similarity/pareto_tail.h"
#include "engine/error.h"
#include "engine/matrix64.h"

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
// with A = uᵀPu, b = ±s·μ·u and a = b/√A,
// log[area(S^{m−1})·(2π)^{−m/2}] + ½·log|P| − (m/2)·log A − (s² − a²)/2 + log J_{m−1}(a).
double log_density_one_side(const ProjectedNormal& c, double b, double quadratic, double log_det, int64_t m) {
  const double a = b / std::sqrt(quadratic);
  const double constant = std::log(2.0) - std::lgamma(double(m) / 2) - double(m) / 2 * std::log(2.0);
  return constant + 0.5 * log_det - double(m) / 2 * std::log(quadratic) - (c.distance * c.distance - a * a) / 2 +
         log_radial_moment(m - 1, a);
}

}  // namespace

double log_sum_exp(const std::vector<double>& v) {
  const double top = *std::max_element(v.begin(), v.end());
  if (!std::isfinite(top)) return top;
  double sum = 0;
  for (double x : v) sum += std::exp(x - top);
  return top + std::log(sum);
}

double log_density(const ProjectedNormal& c, const double* u, int64_t m) {
  const double b = c.distance * dot(c.mean.data(), u, m);
  double quadratic = dot(u, u, m), log_det = 0;
  for (size_t j = 0; j < c.precisions.size(); ++j) {
    const double along = dot(c.axes.data() + j * size_t(m), u, m);
    quadratic += (c.precisions[j] - 1) * along * along, log_det += std::log(c.precisions[j]);
  }
  const std::vector<double> sides = {log_density_one_side(c, b, quadratic, log_det, m),
                                     log_density_one_side(c, -b, quadratic, log_det, m)};
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
      const ProjectedNormal& component = components[k];
      // z = ±s·μ + P^{−1/2}ε, P^{−1/2} = I + Σ_j (λ_j^{−1/2} − 1)·e_j e_jᵀ.
      const std::vector<double>& axes = component.axes;
      std::vector<double> stretch(component.precisions.size());
      for (size_t a = 0; a < stretch.size(); ++a)
        stretch[a] = (1 / std::sqrt(component.precisions[a]) - 1) * dot(axes.data() + a * size_t(m), row, m);
      for (size_t a = 0; a < stretch.size(); ++a)
        for (int64_t j = 0; j < m; ++j) row[j] += stretch[a] * axes[a * size_t(m) + size_t(j)];
      const double shift = (sign[size_t(i)] < 0.5f ? 1.0 : -1.0) * component.distance;
      for (int64_t j = 0; j < m; ++j) row[j] += shift * component.mean[size_t(j)];
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

// The target at `n` rows, in batches of at most 256 directions (each direction is a radial rule's
// points through two networks: a whole Hessian's directions at once would fill memory).
std::vector<double> evaluate_in_batches(const Target& target, const std::vector<double>& u, int64_t n, int64_t m, int64_t& spent) {
  std::vector<double> h;
  h.reserve(size_t(n));
  for (int64_t first = 0; first < n; first += 256) {
    const int64_t k = std::min<int64_t>(256, n - first);
    const std::vector<double> part = target(std::vector<double>(u.begin() + first * m, u.begin() + (first + k) * m), k);
    h.insert(h.end(), part.begin(), part.end());
  }
  spent += n;
  return h;
}

// Coordinates on the sphere around a centre μ: θ ∈ R^{m−1} ↦ (μ + Σ_j θ_j·t_j)/|…|, the t_j an
// orthonormal basis of μ's tangent space: columns 2…m of a Householder reflection H that maps e_1
// to ±μ (v = e_1 ∓ μ, whichever is longer, so that H is accurate), applied in O(m), never formed.
// At θ = 0 the Hessian of a function of the direction in these coordinates is its Hessian on the
// sphere, whatever its gradient (the chart bends only along μ, where such a function is flat).
struct Chart {
  std::vector<double> centre, reflector;
  double reflector_norm2 = 0;
  explicit Chart(std::vector<double> mu) : centre(std::move(mu)), reflector(centre) {
    const double sign = centre[0] > 0 ? 1.0 : -1.0;
    for (double& x : reflector) x *= sign;
    reflector[0] += 1;
    reflector_norm2 = dot(reflector.data(), reflector.data(), int64_t(reflector.size()));
  }
  int64_t dimension() const { return int64_t(centre.size()); }
  // Σ_j θ_j·t_j = H·(0, θ), into `out` (m entries).
  void tangent(const double* theta, double* out) const {
    const int64_t m = dimension();
    const double along = dot(reflector.data() + 1, theta, m - 1), f = 2 * along / reflector_norm2;
    out[0] = -f * reflector[0];
    for (int64_t j = 1; j < m; ++j) out[j] = theta[j - 1] - f * reflector[size_t(j)];
  }
  // The unit vectors at the `n` rows θ (m − 1 entries each).
  std::vector<double> points(const std::vector<double>& theta, int64_t n) const {
    const int64_t m = dimension();
    std::vector<double> u(size_t(n * m));
    for (int64_t i = 0; i < n; ++i) {
      double* row = u.data() + i * m;
      tangent(theta.data() + i * (m - 1), row);
      for (int64_t j = 0; j < m; ++j) row[j] += centre[size_t(j)];
      const double norm = std::sqrt(dot(row, row, m));
      for (int64_t j = 0; j < m; ++j) row[j] /= norm;
    }
    return u;
  }
};

// −log h at the chart's points θ (rows of m − 1), +∞ where h is 0.
std::vector<double> negative_log_target(const Chart& chart, const Target& target, const std::vector<double>& theta, int64_t n,
                                        int64_t& spent) {
  std::vector<double> f = evaluate_in_batches(target, chart.points(theta, n), n, chart.dimension(), spent);
  for (double& x : f) x = x > 0 ? -std::log(x) : INFINITY;
  return f;
}

// The gradient of −log h in the chart at θ, by central differences (step 10⁻⁵: −log h is a
// logarithm of a polynomial, smooth far beyond it, and its rounding is far below it).
std::vector<double> gradient_at(const Chart& chart, const Target& target, const std::vector<double>& theta, int64_t& spent) {
  const int64_t n = chart.dimension() - 1;
  const double step = 1e-5;
  std::vector<double> probes(size_t(2 * n * n));
  for (int64_t i = 0; i < n; ++i)
    for (int64_t side = 0; side < 2; ++side) {
      double* row = probes.data() + (2 * i + side) * n;
      std::copy(theta.begin(), theta.end(), row);
      row[i] += side == 0 ? step : -step;
    }
  const std::vector<double> f = negative_log_target(chart, target, probes, 2 * n, spent);
  std::vector<double> g(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) g[size_t(i)] = (f[size_t(2 * i)] - f[size_t(2 * i + 1)]) / (2 * step);
  return g;
}

// A peak of h near `start`: BFGS on −log h in the chart centred at `start`, each step's length
// chosen by backtracking (Armijo's condition; sixteen lengths, each half the last, tried in one
// batch; the step at most half a radian), until the height left to gain (`converged`) is within
// the plan's tolerance. Whether it got there is returned beside the peak.
std::pair<std::vector<double>, bool> ascend(const std::vector<double>& start, const Target& target, const ProposalPlan& plan,
                                            int64_t& spent) {
  const Chart chart(start);
  const int64_t n = chart.dimension() - 1;
  std::vector<double> theta(static_cast<size_t>(n), 0.0);
  double f = negative_log_target(chart, target, theta, 1, spent)[0];
  std::vector<double> g = gradient_at(chart, target, theta, spent);
  Matrix64 inverse = Matrix64::identity(n);  // the inverse Hessian's estimate
  bool scaled = false;
  // The height left to gain, by the quadratic model (½·gᵀH⁻¹g, `decrement` = gᵀH⁻¹g) and along the
  // gradient at a curvature of 1 (½·|g|²: as flat as the sphere's own scale, flatter than any peak
  // a component would take; the model's H⁻¹ can be far too small in directions its steps never
  // explored, a ridge's saddle among them), both within the tolerance.
  auto converged = [&](const std::vector<double>& gradient, double decrement) {
    return decrement / 2 <= plan.ascent_tolerance && dot(gradient.data(), gradient.data(), n) / 2 <= plan.ascent_tolerance;
  };
  for (int iteration = 0; iteration < plan.ascent_steps && std::isfinite(f); ++iteration) {
    std::vector<double> p(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) p[size_t(i)] -= inverse(i, j) * g[size_t(j)];
    double slope = dot(g.data(), p.data(), n);  // gᵀp = −gᵀH⁻¹g
    if (converged(g, -slope)) return {chart.points(theta, 1), true};
    const double length = std::sqrt(dot(p.data(), p.data(), n)), first = std::min(1.0, 0.5 / length);
    const int tries = 16;
    std::vector<double> probes(size_t(tries * n));
    for (int k = 0; k < tries; ++k)
      for (int64_t i = 0; i < n; ++i) probes[size_t(k * n + i)] = theta[size_t(i)] + first * std::ldexp(1.0, -k) * p[size_t(i)];
    const std::vector<double> trial = negative_log_target(chart, target, probes, tries, spent);
    int accepted = -1;
    for (int k = 0; k < tries && accepted < 0; ++k)
      if (trial[size_t(k)] <= f + 1e-4 * first * std::ldexp(1.0, -k) * slope) accepted = k;
    if (accepted < 0) {
      if (!scaled) break;  // no descent even along the gradient: as far as rounding lets it go
      inverse = Matrix64::identity(n), scaled = false;  // a stale curvature estimate: restart from the gradient
      continue;
    }
    std::vector<double> s(static_cast<size_t>(n)), y(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) s[size_t(i)] = probes[size_t(accepted * n + i)] - theta[size_t(i)];
    theta.assign(probes.begin() + accepted * n, probes.begin() + (accepted + 1) * n);
    f = trial[size_t(accepted)];
    const std::vector<double> g_new = gradient_at(chart, target, theta, spent);
    for (int64_t i = 0; i < n; ++i) y[size_t(i)] = g_new[size_t(i)] - g[size_t(i)];
    g = g_new;
    const double sy = dot(s.data(), y.data(), n);
    if (!(sy > 1e-12 * std::sqrt(dot(s.data(), s.data(), n) * dot(y.data(), y.data(), n)))) continue;
    if (!scaled) {  // the first curvature seen sets the scale of H⁻¹
      const double scale = sy / dot(y.data(), y.data(), n);
      for (double& x : inverse.data) x *= scale;
      scaled = true;
    }
    // H⁻¹ ← H⁻¹ + (sᵀy + yᵀH⁻¹y)·ssᵀ/(sᵀy)² − (H⁻¹y·sᵀ + s·(H⁻¹y)ᵀ)/sᵀy.
    std::vector<double> hy(static_cast<size_t>(n), 0.0);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j) hy[size_t(i)] += inverse(i, j) * y[size_t(j)];
    const double yhy = dot(y.data(), hy.data(), n), outer = (sy + yhy) / (sy * sy);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        inverse(i, j) += outer * s[size_t(i)] * s[size_t(j)] - (hy[size_t(i)] * s[size_t(j)] + s[size_t(i)] * hy[size_t(j)]) / sy;
  }
  // Stopped by the step count or by rounding.
  double decrement = 0;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < n; ++j) decrement += g[size_t(i)] * inverse(i, j) * g[size_t(j)];
  return {chart.points(theta, 1), converged(g, decrement)};
}

// The Hessian of −log h on the sphere at the chart's centre, by finite differences of step 10⁻³:
// H_ii from f(±δe_i) and f(0), H_ij from f(δe_i + δe_j), f(δe_i), f(δe_j) and f(0):
// 1 + 2(m − 1) + (m − 1)(m − 2)/2 directions.
Matrix64 tangent_hessian(const Chart& chart, const Target& target, int64_t& spent) {
  const int64_t n = chart.dimension() - 1, count = 1 + 2 * n + n * (n - 1) / 2;
  const double step = 1e-3;
  std::vector<double> probes(size_t(count * n), 0.0);
  int64_t row = 1;
  for (int64_t i = 0; i < n; ++i) probes[size_t(row++ * n + i)] = step, probes[size_t(row++ * n + i)] = -step;
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j) probes[size_t(row * n + i)] = step, probes[size_t(row++ * n + j)] = step;
  const std::vector<double> f = negative_log_target(chart, target, probes, count, spent);
  Matrix64 hessian(n, n);
  row = 1 + 2 * n;
  for (int64_t i = 0; i < n; ++i) hessian(i, i) = (f[size_t(1 + 2 * i)] - 2 * f[0] + f[size_t(2 + 2 * i)]) / (step * step);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i + 1; j < n; ++j)
      hessian(i, j) = hessian(j, i) = (f[size_t(row++)] - f[size_t(1 + 2 * i)] - f[size_t(1 + 2 * j)] + f[0]) / (step * step);
  return hessian;
}

// s·E[r] for r of density ∝ r^{m−1}e^{−(r−s)²/2}: the curvature −κ_s of the isotropic PN(μ, s)'s
// log density in the angle from μ (the derivative of log J_{m−1}), from 0 at s = 0 to about
// s² + m − 1 for large s.
double isotropic_precision(double s, int64_t m) { return s * std::exp(log_radial_moment(m, s) - log_radial_moment(m - 1, s)); }

// The projected normal with the peak's curvature (a Laplace fit, widened). With z's precision P
// = I along μ and Λ on the tangent space, the log density near μ falls as −½·θᵀ[(m + s·E[r])·Λ −
// m·I]θ in the tangent offset θ (from the closed form: A = uᵀPu, a = s·μ·u/√A and log J_{m−1}(a),
// each to second order in θ). For wanted curvatures κ_j (the Hessian's eigenvalues over the
// widening; none below 0) along its eigenvectors, λ_j = (κ_j + m)/(s·E[r] + m) gives them for any s;
// s is chosen in the Gaussian regime, s·E[r] ≥ 16m (or the flattest κ_j where that is larger, so
// that λ_j ≥ 1): z's unit spread along μ is then small beside s, the angle is z's tangent part over
// s, and the component's mass lies where the peak's does, in every direction. With s small the
// same curvature would come from the A^{−m/2} term, an angular central Gaussian's, whose mass in
// many dimensions lies far from its mode.
ProjectedNormal laplace_component(const Chart& chart, const Matrix64& hessian, double widening) {
  const int64_t m = chart.dimension(), n = m - 1;
  const SymmetricEigen eigen = symmetric_eigen(hessian);
  std::vector<double> wanted(static_cast<size_t>(n));
  double flattest = INFINITY;
  for (int64_t j = 0; j < n; ++j) {
    wanted[size_t(j)] = std::max(eigen.values[size_t(j)], 0.0) / widening;
    if (wanted[size_t(j)] > 0) flattest = std::min(flattest, wanted[size_t(j)]);
  }
  ProjectedNormal c;
  c.mean = chart.centre;
  const double radial = std::max(std::isfinite(flattest) ? flattest : 0.0, 16.0 * double(m));
  double low = 0, high = std::sqrt(radial) + 1;
  for (int step = 0; step < 60; ++step) {
    const double mid = 0.5 * (low + high);
    (isotropic_precision(mid, m) < radial ? low : high) = mid;
  }
  c.distance = low;
  const double base = isotropic_precision(c.distance, m) + double(m);
  std::vector<double> column(static_cast<size_t>(n)), axis(static_cast<size_t>(m));
  for (int64_t j = 0; j < n; ++j) {
    const double lambda = (wanted[size_t(j)] + double(m)) / base;
    if (std::abs(lambda - 1) < 1e-9) continue;
    for (int64_t i = 0; i < n; ++i) column[size_t(i)] = eigen.vectors(i, j);
    chart.tangent(column.data(), axis.data());
    c.axes.insert(c.axes.end(), axis.begin(), axis.end());
    c.precisions.push_back(lambda);
  }
  return c;
}

}  // namespace

namespace {

// The shares of a mixture's parts: half uniform and the rest equal at first, then, for
// `share_rounds` rounds, each part's share of the target's mass over draws from the current
// mixture (each draw's weight h/q split among the parts by their responsibility for it: population
// Monte Carlo's update), the uniform share kept at least at its floor. False where the peaks hold
// none of the mass.
bool fit_shares(DirectionProposal& q, const Target& target, const ProposalPlan& plan, Generator& gen, int64_t& spent) {
  const size_t K = q.components.size();
  const int64_t m = q.dimension, n = plan.share_draws;
  q.uniform_share = 0.5;
  q.shares.assign(K, 1.0 / double(K));
  for (int round = 0; round < plan.share_rounds; ++round) {
    const std::vector<double> u1 = q.sample(n, gen), h1 = evaluate_in_batches(target, u1, n, m, spent), q1 = q.density(u1, n);
    std::vector<double> mass(K + 1, 0.0);
    for (int64_t i = 0; i < n; ++i) {
      const double w = h1[size_t(i)] / q1[size_t(i)], qi = q1[size_t(i)];
      mass[0] += w * q.uniform_share / qi;
      for (size_t k = 0; k < K; ++k)
        mass[k + 1] += w * (1 - q.uniform_share) * q.shares[k] * std::exp(log_density(q.components[k], &u1[size_t(i * m)], m)) / qi;
    }
    double total = 0;
    for (double x : mass) total += x;
    if (!(total - mass[0] > 0)) return false;
    q.uniform_share = std::max(mass[0] / total, plan.uniform_floor);
    for (size_t k = 0; k < K; ++k) q.shares[k] = mass[k + 1] / (total - mass[0]);
  }
  return true;
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
  DirectionProposal q = DirectionProposal::uniform(m);
  std::vector<std::vector<double>> peaks;
  // Each component's peak Hessian and widening (component k of q is fitted[k]'s), for refits.
  struct Fitted {
    Matrix64 hessian;
    double widening = 1;
  };
  std::vector<Fitted> fitted;
  // The directions the adaptation may spend, beyond those explored: no climb or round starts
  // past it (one under way finishes).
  auto over_budget = [&] { return plan.budget > 0 && double(fit.draws) >= plan.budget * double(explored); };
  auto known = [&](const double* u) {
    for (const auto& p : peaks)
      if (std::abs(dot(p.data(), u, m)) > 0.99) return true;
    return false;
  };
  // Climbs from up to `plan.peaks` of the directions `u` (rows), highest `value` first, each start
  // away from those before (|cos| < 0.9) and from the peaks known, each brought near a peak by the
  // evolution strategy and then to it by the ascent; a new peak gets its Laplace component
  // (laplace_component), unless that is the uniform law. Returns how many were added.
  auto climb_from = [&](const std::vector<double>& u, const std::vector<double>& value) {
    std::vector<int64_t> order(value.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = int64_t(i);
    std::sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return value[size_t(i)] > value[size_t(j)]; });
    std::vector<int64_t> starts;
    int added = 0;
    for (int64_t i : order) {
      if (int(starts.size()) == plan.peaks || int(peaks.size()) == plan.max_peaks || !(value[size_t(i)] > 0) || over_budget()) break;
      const double* start = &u[size_t(i * m)];
      bool apart = !known(start);
      for (int64_t j : starts) apart = apart && std::abs(dot(start, &u[size_t(j * m)], m)) < 0.9;
      if (!apart) continue;
      starts.push_back(i);
      const std::vector<double> near = climb(std::vector<double>(start, start + m), value[size_t(i)], target, plan, gen, fit.draws);
      if (known(near.data())) continue;  // the climb joined a peak already found: no ascent needed
      auto [peak, converged] = ascend(near, target, plan, fit.draws);
      if (known(peak.data())) continue;
      fit.unconverged += !converged;
      peaks.push_back(peak);
      const Chart chart(std::move(peak));
      Fitted f{tangent_hessian(chart, target, fit.draws), plan.widening};
      // A Hessian that met a zero of h (or an overflow) beside the peak has no Laplace fit.
      if (!std::all_of(f.hessian.data.begin(), f.hessian.data.end(), [](double x) { return std::isfinite(x); })) continue;
      ProjectedNormal c = laplace_component(chart, f.hessian, f.widening);
      double narrowest = 1;
      for (double lambda : c.precisions) narrowest = std::max(narrowest, lambda);
      if (c.distance > 0.05 || narrowest > 1.05) q.components.push_back(std::move(c)), fitted.push_back(std::move(f)), ++added;
    }
    return added;
  };
  // The first peaks: climbs from the highest uniform draws.
  climb_from(u0, h0);
  if (q.components.empty() || !fit_shares(q, target, plan, gen, fit.draws)) return fit;
  // Then the mass the mixture misses. Its highest weights h/q lie where the target is high and
  // the mixture low: beside a peak none of its components holds, which climbs from them add, or on
  // the shoulders of a component narrower than its peak there. Each round climbs from the highest
  // weights of `refine_draws` fresh draws; where no new peak is found, it stops if the weights'
  // tail shape is below `refine_shape` (1/2: finite variance), and otherwise refits the component
  // nearest each of the 8 highest weights twice as wide. At most `refine_rounds` rounds.
  for (int round = 0; round < plan.refine_rounds && !over_budget(); ++round) {
    const int64_t n = plan.refine_draws;
    const std::vector<double> u1 = q.sample(n, gen), h1 = evaluate_in_batches(target, u1, n, m, fit.draws), q1 = q.density(u1, n);
    std::vector<double> weighted(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) weighted[size_t(i)] = h1[size_t(i)] / q1[size_t(i)];
    const bool added = int(peaks.size()) < plan.max_peaks && climb_from(u1, weighted) > 0;
    if (!added && pareto_tail_shape(weighted) < plan.refine_shape) {
      fit.settled = true;
      break;
    }
    if (!added) {
      std::vector<int64_t> order(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) order[size_t(i)] = i;
      std::partial_sort(order.begin(), order.begin() + 8, order.end(),
                        [&](int64_t i, int64_t j) { return weighted[size_t(i)] > weighted[size_t(j)]; });
      std::vector<bool> widen(q.components.size(), false);
      for (int t = 0; t < 8; ++t) {
        size_t nearest = 0;
        double best = -1;
        for (size_t k = 0; k < q.components.size(); ++k) {
          const double c = std::abs(dot(q.components[k].mean.data(), &u1[size_t(order[size_t(t)] * m)], m));
          if (c > best) best = c, nearest = k;
        }
        widen[nearest] = true;
      }
      for (size_t k = 0; k < q.components.size(); ++k)
        if (widen[k]) {
          fitted[k].widening *= 2;
          q.components[k] = laplace_component(Chart(q.components[k].mean), fitted[k].hessian, fitted[k].widening);
        }
    }
    if (!fit_shares(q, target, plan, gen, fit.draws)) return fit;
  }
  fit.peaks = int(q.components.size());
  fit.proposal = q;
  return fit;
}

}  // namespace adjoint
