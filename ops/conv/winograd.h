// Winograd F(2×2, 3×3): 3×3 kernels at stride 1, without dilation or groups.
//
// A 2×2 tile of outputs is Aᵀ[(G w Gᵀ) ⊙ (Bᵀ d B)]A for its 4×4 input patch d (Lavin &
// Gray, "Fast Algorithms for Convolutional Neural Networks", 2016): per tile and pair of
// channels, 16 multiplications instead of 36. Summed over input channels, the 16
// transform-domain positions ξ are 16 GEMMs, M[ξ] (O × tiles) = U[ξ] (O × C) · V[ξ] (C × tiles).
// The backward pass runs the adjoints of the same linear maps: dM = A dY Aᵀ per tile, then
// dU[ξ] = dM[ξ]·V[ξ]ᵀ and dW = Gᵀ dU G for the weight, dV[ξ] = U[ξ]ᵀ·dM[ξ] and dx += B dV Bᵀ
// (patches overlap, so added in a fixed order) for the input. All of it is exact algebra;
// in float the results differ from im2col's by rounding only (about 1e-6 relative).
// On AVX-512 the transforms run 16 tiles at a time (ops/conv/winograd_avx512.h).
#pragma once
#include "ops/conv/geometry.h"
#include "ops/conv/prepared_weights.h"

namespace adjoint::conv {

// Whether Winograd runs this convolution: 3×3, stride 1, no dilation, no groups, enough
// channels, and enough tiles for large weights (the rules beside the constants in winograd.cpp).
bool winograd_applies(const ConvGeometry& g);

// y = epilogue(conv(x, w)). The weights' transforms are kept by `kept` where it keeps forms
// (ops/conv/prepared_weights.h), here and below.
void winograd_forward(const ConvGeometry& g, const float* x, const float* w, const Epilogue& epilogue, float* y,
                      const PreparedWeights& kept = {});

// As conv_backward (ops/conv/im2col.h), through the transform domain, except that dx is
// overwritten (it need not arrive zeroed).
void winograd_backward(const ConvGeometry& g, const float* x, const float* w, const float* dy, float* dx, float* dw,
                       float* db, const PreparedWeights& kept = {});

}  // namespace adjoint::conv
