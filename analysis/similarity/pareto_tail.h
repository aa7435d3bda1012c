// How heavy the tail of a Monte Carlo sample is: the shape k of a generalised Pareto
// distribution fitted to its largest draws (Pareto-smoothed importance sampling's diagnostic,
// Vehtari, Simpson, Gelman, Yao and Gabry). A sample whose tail has shape k has finite moments
// of order below 1/k only: at k ≥ 1/2 the variance is infinite and a standard error from the
// sample variance means nothing, and in practice the mean's error is too large to trust
// beyond k ≈ 0.7; the bar tightens for small samples, min(1 − 1/log10 N, 0.7).
#pragma once
#include <cstdint>
#include <vector>

namespace adjoint {

// The fitted shape of the upper tail of `draws`: a generalised Pareto fitted to the excesses of
// the M = ceil(min(N/5, 3·sqrt(N))) largest over the next largest, by Zhang and Stephens'
// posterior-mean estimate with the weakly informative prior toward k = 1/2 that the diagnostic
// uses. −∞ when the tail is flat (fewer than 5 distinct excesses).
double pareto_tail_shape(std::vector<double> draws);

// The larger of the two tails' shapes (draws and their negatives): what the mean's error hears.
double pareto_shape_both_tails(const std::vector<double>& draws);

// The largest shape at which N draws' mean is trusted: min(1 − 1/log10 N, 0.7).
double pareto_shape_limit(int64_t n);

}  // namespace adjoint
