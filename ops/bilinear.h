// Bilinear layer (docs/methods.md §3.1): y = (L x̃) ⊙ (R x̃) with x̃ = (1, x), so column 0 of L
// and of R is the bias.
//
// Each output is a quadratic form in x̃, so y = ½·J(x̃)·x̃ with J = diag(Rx̃)L + diag(Lx̃)R
// the Jacobian with respect to x̃: half the Jacobian is the exact dynamic-linear map.
//   Gradient      dx̃ = Lᵀ(u ⊙ Rx̃) + Rᵀ(u ⊙ Lx̃), restricted to the x coordinates.
//   Pullback      ½ of the gradient's input cotangent (the adjoint of x̃ ↦ ½J(x̃)x̃).
//   SoftPullback  the same as the pullback (no gate to soften).
// The gradients of L and R are the same under every transport.
#pragma once
#include "engine/tensor.h"

namespace adjoint {

// x (..., d), L (h, d+1), R (h, d+1) → (..., h).
Tensor bilinear(const Tensor& x, const Tensor& L, const Tensor& R);

}  // namespace adjoint
