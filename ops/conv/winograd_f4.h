// Winograd F(4×4, 3×3): 3×3 kernels at stride 1 on maps large enough for 4×4 tiles.
//
// A 4×4 tile of outputs is Aᵀ[(G w Gᵀ) ⊙ (Bᵀ d B)]A for its 6×6 input patch d (Lavin &
// Gray, "Fast Algorithms for Convolutional Neural Networks", 2016; here with the
// interpolation points 0, ±1, ½, −2 and ∞, winograd_f4.cpp says why): per tile and pair of
// channels 36 multiplications for 16 outputs, 2.25 an output against F(2×2, 3×3)'s 4 and
// the plain sum's 9. Summed over input channels, the 36 transform-domain positions ξ are 36
// GEMMs, M[ξ] (O × tiles) = U[ξ] (O × C) · V[ξ] (C × tiles), as in ops/conv/winograd.h.
//
// The price is rounding: the transforms' entries reach 8 (Aᵀ) and 5 (Bᵀ), and G holds
// sixths and fifteenths, so the sums over input channels add transformed values several
// times the outputs' size; float32 then leaves an error that scales with the outputs' root
// mean square rather than with each output, about ten times F(2×2)'s (1e-5 of the RMS on
// ResNet-50's layers: docs/benchmarks.md; tests/test_conv_pool.cpp holds it to 2e-4).
//
// The input gradient of such a convolution is itself one: dx = dY convolved with the
// weights transposed (C × O) and flipped, with padding 2 − p. It runs through the same
// forward pass. The weight gradient runs in the same transform domain
// (ops/conv/winograd_f4_weight_grad.h).
//
// The transforms run along a row of tiles, 16 tiles at a time, one a lane: on AVX-512 a patch
// row's six columns of 16 tiles come from five loads by permutes, and an output row of 16
// tiles is stored as 64 consecutive values; elsewhere the same operations run a tile at a
// time and give the same bits.
#pragma once
#include "ops/conv/geometry.h"
#include "ops/conv/prepared_weights.h"

namespace adjoint::conv {

// Whether F(4×4) runs this convolution: where F(2×2) would (winograd_applies), on maps of
// at least kWinogradF4MinMap rows and columns (smaller maps waste a larger share of a
// tile's outputs past the edge), and with offsets that fit 32-bit lanes.
bool winograd_f4_applies(const ConvGeometry& g);

// The geometry of a convolution's input gradient as a convolution: dY (N, O, OH, OW)
// convolved with the transposed, flipped weights (C, O, 3, 3), padding 2 − p, gives dx.
ConvGeometry winograd_f4_input_gradient_geometry(const ConvGeometry& g);

// y = epilogue(conv(x, w)); no residual (as winograd_forward). The weights' transforms are
// kept by `kept` where it keeps forms (ops/conv/prepared_weights.h), here and below.
void winograd_f4_forward(const ConvGeometry& g, const float* x, const float* w, const Epilogue& epilogue, float* y,
                         const PreparedWeights& kept = {});

// dx = the input gradient of conv(x, w) for dY = dy, every entry written. Runs where
// winograd_f4_applies(winograd_f4_input_gradient_geometry(g)).
void winograd_f4_input_gradient(const ConvGeometry& g, const float* w, const float* dy, float* dx,
                                const PreparedWeights& kept = {});

}  // namespace adjoint::conv
