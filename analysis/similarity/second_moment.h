// Tensor similarity of deep polynomial networks (docs/methods.md §3.3): the second-moment
// recursion. For two networks a and b on a shared input x ~ N(0, I), it carries the joint
// second moments of their states z = (1, h_1, ..., h_T) through the layers in lockstep,
//   Σ_aa = E[z_a z_aᵀ],  Σ_ab = E[z_a z_bᵀ],  Σ_bb = E[z_b z_bᵀ]
// starting from the identity, and scores the outputs f by
//   E[f_a·f_b] / sqrt(E[f_a·f_a] E[f_b·f_b]) = tr Σ_ab / sqrt(tr Σ_aa tr Σ_bb)
// over the non-constant coordinates. A linear layer maps Σ_xy ↦ W̃_x Σ_xy W̃_yᵀ exactly. A
// bilinear layer's moments come from Isserlis' theorem over the pairings of its legs,
// treating the state as Gaussian with the carried mean (Σ's constant column) and second
// moment: exact for one layer on the input, a Gaussian-closure approximation after that.
// Residual layers add the cross terms E[z·y] (three legs) and E[y·y] (four legs). The bilinear
// LM's attention, a product of five legs, has its own step (attention_moments.h).
#pragma once
#include <string>
#include <vector>

#include "engine/matrix64.h"
#include "models/polynomial.h"

namespace adjoint {

struct DeepSimilarity {
  double similarity = 0;
  double inner_ab = 0, inner_aa = 0, inner_bb = 0;  // E[f_a·f_b], E[|f_a|²], E[|f_b|²]
  // Per output feature o (a class, a token), summed over positions:
  // E[f_a,o f_b,o] / sqrt(E[f_a,o²] E[f_b,o²]). Filled by the recursion.
  std::vector<double> slices;
};

// One network's own second moments Σ_xx before each layer and after the last: the half of
// the recursion that does not depend on the other network, computed once per network when
// many pairs are compared (a run's checkpoints).
struct MomentTrace {
  std::string arch;
  double input_std = 1.0;
  std::vector<Matrix64> sigma;  // layers + 1 matrices
};
MomentTrace self_moments(const PolynomialView& v, double input_std = 1.0);

// Both views must have the same kinds of layers in the same order and the same input and
// output sizes (their hidden widths may differ). Throws naming the layer otherwise.
// The input is x ~ N(0, input_std²·I): docs/methods.md's identity is 1; a token model's one-hot inputs
// have the norm of 1/sqrt(vocab).
DeepSimilarity deep_similarity(const PolynomialView& a, const PolynomialView& b, double input_std = 1.0);
DeepSimilarity deep_similarity(const PolynomialView& a, const PolynomialView& b, const MomentTrace& ta,
                               const MomentTrace& tb);

// The same three inner products estimated from `samples` Gaussian inputs (seeded), by
// evaluating both networks: the recursion's reference.
DeepSimilarity monte_carlo_similarity(const PolynomialView& a, const PolynomialView& b, int64_t samples, uint64_t seed,
                                      double input_std = 1.0);

}  // namespace adjoint
