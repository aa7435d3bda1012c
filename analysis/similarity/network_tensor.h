// The identity metric at any depth (docs/methods.md §3.2, "Deep networks"): the Frobenius inner
// product of two networks' whole polynomial tensors, contracted layer by layer.
//
// Every coordinate of a network's state z̃ = (1, h_1, …, h_T) is a tensor over the padded input
// x̃ = (1, x_1, …, x_T): the input's coordinates are the basis vectors e_i (order 1), a linear
// step keeps the order, a bilinear step doubles it and the bilinear attention multiplies it by
// five. A layer's output coordinate is a sum of *units*, each a product of linear forms ("legs")
// of the state: (l·z̃)(r·z̃) for a bilinear hidden unit, (v·z̃)(k1·z̃)(k2·z̃)(q1·z̃)(q2·z̃) for an
// attention term, (e_i·z̃)(e_0·z̃) for a residual's identity path, e_0·z̃ repeated for the constant.
// The tensor of a unit is the outer product of its legs' tensors, and since
// ⟨p⊗q, p′⊗q′⟩ = ⟨p, p′⟩⟨q, q′⟩, the inner products of the next state's coordinates are sums of
// products of the Gram matrix G = ⟨z̃_a,i | z̃_b,j⟩ of this one, read through the legs: a Gram
// recursion over the layers, G ← C_a·core(L_a G L_bᵀ, …)·C_bᵀ, never building a tensor.
//
// Symmetrised within each layer. A layer's multilinear map acts on copies of one state, so only
// its part symmetric under permuting those copies is seen by the function. Each unit is
// symmetrised over the permutations of its legs the layer is built to be invariant under: the
// bilinear layer over both (½(l⊗r + r⊗l), the one-layer closed form's core), the attention
// over the simultaneous swap (k1↔k2, q1↔q2) that leaves (q1·k1)(q2·k2) unchanged (the paper's
// code names the same symmetry). This makes the number independent of how a layer is written
// (L and R swapped, hidden units permuted or rescaled, score factors swapped) and equal to the
// closed form for one layer. It is not the fully symmetrised tensor: permutations of legs
// across layers (and the attention's v against q and k) are not summed over, since that sum
// has (order)! terms with no layer-by-layer form. The fully symmetrised inner product is the
// one that depends only on the function; the Gaussian metric's E[f_a·f_b] is the function-only
// comparison the other routes compute.
//
// The Gram matrices grow or shrink geometrically with depth (each layer squares or takes the
// fifth power of the scale), so each is divided by its largest entry after every layer and
// the logarithm of that factor is carried: the cosine never sees an under- or overflow.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/matrix64.h"
#include "models/polynomial.h"

namespace adjoint {

// ⟨T_a,k | T_b,k⟩ for every output coordinate k = t·classes + o, as value·exp(log_scale).
struct NetworkTensorInner {
  std::vector<double> value;
  double log_scale = 0;
};

// The two networks must have the same kinds of steps in the same order, the same positions and
// the same input and output sizes (hidden widths may differ); throws naming the step otherwise.
NetworkTensorInner network_tensor_inner(const PolynomialView& a, const PolynomialView& b);

// The full Gram matrix of the state after every step: for tests against explicit tensors.
// Element s is ⟨z̃_a,i | z̃_b,j⟩ after step s (the input's identity first), each as returned,
// unscaled (no log scale: small networks only).
std::vector<Matrix64> network_tensor_grams(const PolynomialView& a, const PolynomialView& b);

}  // namespace adjoint
