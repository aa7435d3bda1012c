// The weight gradient of a convolution that Winograd F(4×4, 3×3) runs (ops/conv/winograd_f4.h),
// in F(4×4)'s transform domain.
//
// The forward pass is y = Aᵀ[(G w Gᵀ) ⊙ (Bᵀ d B)]A per tile, so its adjoint in w runs the
// same linear maps backwards: dM = A dY Aᵀ for each 4 × 4 tile of dY (6 × 6), then, summed
// over the tiles, dU[ξ] (O × C) = dM[ξ] (O × tiles) · V[ξ]ᵀ (tiles × C) for each of the 36
// positions ξ, V the input patches' transform as in the forward pass; finally dW = Gᵀ dU G
// per pair of channels. 36 products of depth `tiles` where F(2×2) runs 16 of depth
// 2.25·`tiles`: 2.25 multiplications an output position against 4.
//
// The price is F(4×4)'s rounding (ops/conv/winograd_f4.h): the error scales with the
// gradient's root mean square rather than with each entry (tests/test_conv_pool.cpp holds
// it to kWinogradF4Tolerance of the RMS).
#pragma once
#include "ops/conv/geometry.h"

namespace adjoint::conv {

// Whether the weight gradient runs here: where F(4×4) runs the layer (winograd_f4_applies)
// and the batch holds at least kF4WeightGradMinBatchTiles tiles. With fewer, the products are
// too shallow for the 36·O·C sum they write (2.25 times F(2×2)'s): ResNet-50's 256-channel
// layers at 14 × 14, 128 tiles a batch of 8, ran no faster, and F(2×2) keeps them.
bool winograd_f4_weight_gradient_applies(const ConvGeometry& g);

// dw (O, C, 3, 3) = the weight gradient of conv(x, w) for dY = dy, every entry written.
// Runs where winograd_f4_weight_gradient_applies(g). The blocks and their partial sums depend on the shape
// only, so the result is the same bits at any thread count.
void winograd_f4_weight_gradient(const ConvGeometry& g, const float* x, const float* dy, float* dw);

}  // namespace adjoint::conv
