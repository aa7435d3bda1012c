#include "analysis/similarity/pareto_tail.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace adjoint {

namespace {

// Zhang and Stephens (2009): the generalised Pareto's profile likelihood over θ = −k/σ,
// averaged over a grid of θ with weights ∝ likelihood; k = mean(log(1 − θ·x)) at the average θ
// (θ < 0 and k > 0: a heavy tail). `x` holds the excesses, ascending, all positive.
double zhang_stephens_shape(const std::vector<double>& x) {
  const size_t n = x.size();
  const int grid = 30 + int(std::sqrt(double(n)));
  const double prior = 3, quartile = x[size_t(std::floor(double(n) / 4 + 0.5)) - 1];
  std::vector<double> theta(static_cast<size_t>(grid)), log_likelihood(static_cast<size_t>(grid));
  for (int j = 0; j < grid; ++j) {
    theta[size_t(j)] = 1 / x.back() + (1 - std::sqrt(double(grid) / (j + 0.5))) / (prior * quartile);
    double k = 0;
    for (double v : x) k += std::log1p(-theta[size_t(j)] * v);
    k /= double(n);
    log_likelihood[size_t(j)] = double(n) * (std::log(-theta[size_t(j)] / k) - k - 1);
  }
  const double top = *std::max_element(log_likelihood.begin(), log_likelihood.end());
  double total = 0, mean_theta = 0;
  for (int j = 0; j < grid; ++j) {
    const double w = std::exp(log_likelihood[size_t(j)] - top);
    total += w, mean_theta += w * theta[size_t(j)];
  }
  mean_theta /= total;
  double k = 0;
  for (double v : x) k += std::log1p(-mean_theta * v);
  k /= double(n);
  // The weakly informative prior: k pulled toward 1/2 as if by 10 more observations.
  return (double(n) * k + 10 * 0.5) / (double(n) + 10);
}

}  // namespace

double pareto_tail_shape(std::vector<double> draws) {
  const size_t n = draws.size();
  const size_t tail = size_t(std::ceil(std::min(0.2 * double(n), 3 * std::sqrt(double(n)))));
  if (tail < 5 || tail >= n) return -std::numeric_limits<double>::infinity();
  std::nth_element(draws.begin(), draws.end() - std::ptrdiff_t(tail + 1), draws.end());
  const double threshold = *(draws.end() - std::ptrdiff_t(tail + 1));
  std::vector<double> excess;
  for (auto it = draws.end() - std::ptrdiff_t(tail); it != draws.end(); ++it)
    if (*it > threshold) excess.push_back(*it - threshold);
  std::sort(excess.begin(), excess.end());
  if (excess.size() < 5 || excess.back() <= excess.front() * (1 + 1e-12)) return -std::numeric_limits<double>::infinity();
  return zhang_stephens_shape(excess);
}

double pareto_shape_both_tails(const std::vector<double>& draws) {
  std::vector<double> negated(draws.size());
  std::transform(draws.begin(), draws.end(), negated.begin(), [](double v) { return -v; });
  return std::max(pareto_tail_shape(draws), pareto_tail_shape(std::move(negated)));
}

double pareto_shape_limit(int64_t n) { return n > 10 ? std::min(1 - 1 / std::log10(double(n)), 0.7) : 0.0; }

}  // namespace adjoint
