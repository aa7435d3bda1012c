#include "analysis/common/statistics.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "engine/error.h"

namespace adjoint {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// Continued fraction of the regularised incomplete beta function (modified Lentz), valid
// for x < (a+1)/(a+b+2); the caller uses the symmetry I_x(a,b) = 1 − I_{1−x}(b,a) otherwise.
double beta_continued_fraction(double a, double b, double x) {
  const double tiny = 1e-300;
  double c = 1.0, d = 1.0 - (a + b) * x / (a + 1.0);
  if (std::fabs(d) < tiny) d = tiny;
  d = 1.0 / d;
  double h = d;
  for (int m = 1; m <= 500; ++m) {
    const double m2 = 2.0 * m;
    // Even step.
    double aa = m * (b - m) * x / ((a + m2 - 1.0) * (a + m2));
    d = 1.0 + aa * d, c = 1.0 + aa / c;
    if (std::fabs(d) < tiny) d = tiny;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d, h *= d * c;
    // Odd step.
    aa = -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1.0));
    d = 1.0 + aa * d, c = 1.0 + aa / c;
    if (std::fabs(d) < tiny) d = tiny;
    if (std::fabs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double step = d * c;
    h *= step;
    if (std::fabs(step - 1.0) < 1e-15) break;
  }
  return h;
}

// I_x(a, b).
double incomplete_beta(double a, double b, double x) {
  if (x <= 0) return 0;
  if (x >= 1) return 1;
  const double front =
      std::exp(std::lgamma(a + b) - std::lgamma(a) - std::lgamma(b) + a * std::log(x) + b * std::log1p(-x));
  if (x < (a + 1.0) / (a + b + 2.0)) return front * beta_continued_fraction(a, b, x) / a;
  return 1.0 - front * beta_continued_fraction(b, a, 1.0 - x) / b;
}

// P(T ≤ t) for Student's t with df degrees of freedom.
double student_t_cdf(double t, double df) {
  const double tail = 0.5 * incomplete_beta(0.5 * df, 0.5, df / (df + t * t));
  return t >= 0 ? 1.0 - tail : tail;
}

}  // namespace

double pearson(std::span<const double> a, std::span<const double> b) {
  check(a.size() == b.size(), "pearson: inputs of different lengths ", a.size(), " and ", b.size());
  const size_t n = a.size();
  const auto constant = [](std::span<const double> v) {
    return std::all_of(v.begin(), v.end(), [&](double x) { return x == v[0]; });
  };
  // Tested exactly: a constant input's deviations from its rounded mean need not be 0.
  if (n < 2 || constant(a) || constant(b)) return kNaN;
  const double mean_a = std::accumulate(a.begin(), a.end(), 0.0) / static_cast<double>(n);
  const double mean_b = std::accumulate(b.begin(), b.end(), 0.0) / static_cast<double>(n);
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < n; ++i) {
    const double da = a[i] - mean_a, db = b[i] - mean_b;
    ab += da * db, aa += da * da, bb += db * db;
  }
  // Rounding can push |r| a hair above 1 for (anti)proportional inputs.
  return std::clamp(ab / std::sqrt(aa * bb), -1.0, 1.0);
}

std::vector<double> average_ranks(std::span<const double> values) {
  const size_t n = values.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&](size_t i, size_t j) { return values[i] < values[j]; });
  std::vector<double> ranks(n);
  for (size_t start = 0; start < n;) {
    size_t end = start + 1;
    while (end < n && values[order[end]] == values[order[start]]) ++end;
    // Positions start..end-1 hold equal values: each gets the mean of ranks start+1..end.
    const double rank = 0.5 * static_cast<double>(start + 1 + end);
    for (size_t k = start; k < end; ++k) ranks[order[k]] = rank;
    start = end;
  }
  return ranks;
}

double spearman(std::span<const double> a, std::span<const double> b) {
  check(a.size() == b.size(), "spearman: inputs of different lengths ", a.size(), " and ", b.size());
  const std::vector<double> ra = average_ranks(a), rb = average_ranks(b);
  return pearson(ra, rb);
}

double student_t_quantile(double p, double df) {
  check(p > 0 && p < 1, "student_t_quantile: probability ", p, " is outside (0, 1)");
  check(df > 0, "student_t_quantile: degrees of freedom ", df, " must be positive");
  if (p < 0.5) return -student_t_quantile(1.0 - p, df);
  // The CDF is increasing: bisect on [0, hi] after growing hi past the quantile.
  double lo = 0, hi = 1;
  while (student_t_cdf(hi, df) < p) hi *= 2;
  for (int it = 0; it < 200 && hi - lo > 1e-13 * hi; ++it) {
    const double mid = 0.5 * (lo + hi);
    (student_t_cdf(mid, df) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

Summary summarize(std::span<const double> values, double confidence) {
  check(confidence > 0 && confidence < 1, "summarize: confidence ", confidence, " is outside (0, 1)");
  Summary s;
  s.confidence = confidence;
  double sum = 0;
  for (double v : values) {
    if (std::isnan(v)) {
      ++s.undefined;
    } else {
      ++s.count, sum += v;
    }
  }
  s.mean = s.count > 0 ? sum / static_cast<double>(s.count) : kNaN;
  if (s.count < 2) {
    s.std = s.ci_low = s.ci_high = kNaN;
    return s;
  }
  double squares = 0;
  for (double v : values)
    if (!std::isnan(v)) squares += (v - s.mean) * (v - s.mean);
  const double n = static_cast<double>(s.count);
  s.std = std::sqrt(squares / (n - 1));
  const double half = student_t_quantile(0.5 * (1 + confidence), n - 1) * s.std / std::sqrt(n);
  s.ci_low = s.mean - half, s.ci_high = s.mean + half;
  return s;
}

}  // namespace adjoint
