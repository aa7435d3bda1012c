// The statistics the quality metrics are made of: correlations between two maps, and the
// summary a report prints for a metric's per-example values (mean ± std and a confidence
// interval).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

namespace adjoint {

// Pearson correlation in double precision. NaN when either input is constant (the
// correlation is undefined there, as in scipy.stats.pearsonr) or has fewer than 2 values.
double pearson(std::span<const double> a, std::span<const double> b);

// Ranks 1..n with ties given the average of the ranks they span (scipy's "average").
std::vector<double> average_ranks(std::span<const double> values);

// Spearman correlation: Pearson correlation of the average ranks, so ties are handled as
// scipy.stats.spearmanr does. NaN when either input is constant.
double spearman(std::span<const double> a, std::span<const double> b);

// The 100·p-th percentile of Student's t distribution with `df` degrees of freedom.
double student_t_quantile(double p, double df);

// Mean, sample standard deviation and a two-sided confidence interval of the mean.
// NaN values (metrics that are undefined on an example, e.g. a correlation with a constant
// map) are left out and counted in `undefined`. The interval is mean ± t·std/√n with t the
// (1+confidence)/2 quantile of Student's t with n−1 degrees of freedom: exact for normal
// values, and it tends to the normal interval (t → 1.96 at 95%) as n grows. std and the
// interval are NaN when fewer than two values are defined.
struct Summary {
  int64_t count = 0;      // defined values
  int64_t undefined = 0;  // NaN values left out
  double mean = 0, std = 0, ci_low = 0, ci_high = 0;
  double confidence = 0.95;
};
Summary summarize(std::span<const double> values, double confidence = 0.95);

}  // namespace adjoint
