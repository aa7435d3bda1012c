// The Gaussian-metric inner products of two polynomial networks estimated by sampling: N
// inputs x ~ N(0, input_std²·I) through both networks' polynomials (models/polynomial.h,
// the forward's own arithmetic in double precision), with standard errors. What
// `adjoint tensorsim --check-mc N` prints beside the closed form, and the tests' reference.
#pragma once
#include <cstdint>
#include <vector>

#include "models/polynomial.h"

namespace adjoint {

struct MonteCarloSimilarity {
  int64_t samples = 0;
  double similarity = 0, similarity_se = 0;
  double inner_ab = 0, inner_ab_se = 0, inner_aa = 0, inner_bb = 0;
  // Per output feature (class, token), summed over positions, like the closed forms' slices.
  std::vector<double> slices, slice_se;
};

// `reference`, when given, is subtracted from a (the difference tensor of --diff).
// The standard error of each cosine is the delta method's, from the samples' covariance of
// (f_a·f_b, |f_a|², |f_b|²).
MonteCarloSimilarity monte_carlo_estimate(const PolynomialView& a, const PolynomialView& b, int64_t samples,
                                          uint64_t seed, double input_std = 1.0,
                                          const PolynomialView* reference = nullptr);

}  // namespace adjoint
