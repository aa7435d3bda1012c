// The second-moment recursion's step through the bilinear LM's polynomial attention
// (models/polynomial.h): h_t ← h_t + s·P Σ_{u≤t} (q1_t·k1_u)(q2_t·k2_u)/d_head² · v_u per head.
//
// Each output is a product of five legs, linear in the state z. Given the state's mean and
// covariance (the Gaussian closure of docs/methods.md §3.3), E[y_x y_yᵀ] is a ten-leg moment and
// E[z_x y_yᵀ] a six-leg one. Isserlis' theorem for non-centred Gaussians sums over every
// partial matching of the legs: matched pairs give a covariance, unmatched legs their mean.
// That is 9496 matchings for ten legs and 76 for six.
//
// Every index of the sum (i of q1·k1, j of q2·k2, m of v) joins exactly two legs, so each
// matching's index contraction splits into cycles (traces of products of d_head × d_head
// covariance blocks), paths between two means (scalars), and the paths that reach the
// outputs (a matrix, or two vectors).
#pragma once
#include <cstdint>

#include "engine/matrix64.h"
#include "models/polynomial.h"

namespace adjoint {

// Σ'_xy after an attention step on both sides, from Σ_xy and each side's own Σ_xx, Σ_yy
// (states of 1 + T·dim coordinates, the constant first).
Matrix64 attention_next_moments(const PolynomialStep& x, const PolynomialStep& y, int64_t positions,
                                const Matrix64& sigma_xy, const Matrix64& sigma_xx, const Matrix64& sigma_yy);

// The number of partial matchings of `legs` legs (1, 1, 2, 4, 10, 26, 76, 232, 764, 2620, 9496):
// the terms of the non-centred Isserlis sum, for tests.
int64_t partial_matchings(int64_t legs);

}  // namespace adjoint
