// The radial part of a Gaussian expectation done exactly (docs/methods.md §3.5).
//
// An isotropic Gaussian x ~ N(0, σ²·I_m) is x = σ·r·u with u uniform on the unit sphere of R^m
// and r ~ χ_m, independent. For a polynomial g of degree ≤ D and a fixed direction u,
// r ↦ g(σ r u) is a polynomial of degree ≤ D, so E_r[g(σ r u)] is a finite sum: as u and −u are
// equally likely, E_u E_r[g] = E_u[∫ g(σ r u)·w(r) dr] over the whole line, w(r) ∝ |r|^{m−1}
// e^{−r²/2} (half the χ_m density on each side), and the n-point Gauss rule of that weight is
// exact to degree 2n − 1. Only the direction is then sampled: the radial factor r^D, whose
// spread is what makes plain sampling of a high-degree polynomial heavy-tailed, is gone.
//
// The rule is Golub–Welsch's: the weight's monic orthogonal polynomials (generalised Hermite)
// obey p_{k+1} = r·p_k − β_k·p_{k−1} with β_k = k for even k and k + m − 1 for odd k (the
// recurrence of |t|^{2μ} e^{−t²} with 2μ = m − 1, rescaled by r = √2·t); the nodes are the
// eigenvalues of the tridiagonal matrix of zeros and sqrt(β_k), refined by Newton's method on
// p_n, and each weight is the Christoffel number 1/Σ_k p̂_k(r_i)² of the orthonormal p̂_k, which
// keeps the smallest (outermost) weights accurate to rounding relative to themselves.
#pragma once
#include <cstdint>
#include <vector>

#include "models/polynomial.h"

namespace adjoint {

struct RadialRule {
  int64_t dimension = 0;        // m
  std::vector<double> nodes;    // ascending, symmetric about 0
  std::vector<double> weights;  // positive, summing to 1
};
// The n-point rule for χ_m written on the whole line: Σ_i w_i·h(r_i) = E[(h(r) + h(−r))/2],
// r ~ χ_m, for every polynomial h of degree ≤ 2n − 1.
RadialRule radial_rule(int64_t dimension, int points);

// The fewest points that are exact for a polynomial of degree `degree`: degree/2 + 1.
int radial_points_for(int degree);

// The degree of the view's output as a polynomial of its input: a linear step keeps it, a
// bilinear step doubles it, an attention step multiplies it by five (a residual step keeps the
// larger of the two paths, the new one).
int polynomial_degree(const PolynomialView& view);

}  // namespace adjoint
