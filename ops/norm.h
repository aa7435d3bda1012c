// Normalisation layers and their transports (docs/methods.md §1.2).
//
// Both compute y = γ·(x − μ)/σ + β with σ = sqrt(var + eps). The transports differ in
// whether the statistics μ, σ are differentiated:
//   Gradient      exact: μ and σ depend on x (the centring/decorrelation terms).
//   Pullback      μ and σ held fixed: dx = (γ/σ)·u, no centring term.
//   SoftPullback  the same as the pullback (there is no hard gate to soften).
// BatchNorm in eval mode uses fixed running statistics, so it is affine and all three
// coincide. The gradients of γ and β are the same under every transport.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace adjoint {

// What follows a BatchNorm in a convolutional network, applied as the BatchNorm writes its
// output: + residual (a residual block's shortcut, of the input's shape) when defined, then
// a ReLU when `relu`. relu(batch_norm(x) + residual) as one op gives the separate ops' bits
// (the same float operations in the same order) with fewer passes over memory: forward, a
// pass for the statistics and one that writes; backward, the ReLU's rule of the transport
// applied inside BatchNorm's two reductions and its input gradient, and the residual's
// cotangent handed on as it is written, without a copy. Every transport as the separate ops.
struct BatchNormTail {
  Tensor residual;
  bool relu = false;
};

// x (N, C, ...) normalised per channel C. weight and bias are (C) or undefined (no affine).
// training: batch statistics over N and the trailing dims (biased variance normalises),
//   and running_mean/running_var (C), when defined, are updated in place, unrecorded:
//   r ← (1 − momentum)·r + momentum·batch statistic (unbiased variance), as PyTorch.
// eval: running_mean/running_var (required) normalise.
// The work is split over channels, each channel's sums taken in one fixed order: the same
// bits at any thread count.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor running_mean,
                  Tensor running_var, bool training, float momentum = 0.1f, float eps = 1e-5f,
                  const BatchNormTail& tail = {});

// Eval-mode BatchNorm as the per-channel affine map it is, y = x·scale[c] + shift[c] with
// scale = γ/sqrt(running_var + eps) and shift = β − running_mean·scale, computed exactly as
// batch_norm computes them: an op that applies it while writing its own output (the fused
// conv2d_batch_norm_eval of ops/conv.h) produces batch_norm's bits. For C channels.
struct ChannelAffine {
  std::vector<float> scale, shift;
};
ChannelAffine eval_batch_norm_affine(int64_t C, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                     const Tensor& running_var, float eps = 1e-5f);

// A convolution's weight (O, ...) and bias (O, or undefined) with an eval-mode BatchNorm of
// its O output channels folded in: weight·scale[o] per output channel and bias·scale + shift
// (eval_batch_norm_affine's scale and shift), so that conv2d with them is batch_norm of the
// convolution, up to rounding (the products are scaled before they are summed). Recorded
// when the convolution's or the BatchNorm's parameters take part in a graph (an eval-mode
// model whose parameters still require grad), so that their gradients come back through the
// fold: the map is linear in the weight and affine in the bias, γ and β, so its rule is the
// same under every transport, as BatchNorm's own in eval mode. The folded weight is kept
// with the convolution's weight (PreparedForms, engine/tensor.h) until it, γ or the running
// variance is written.
struct FoldedConvolution {
  Tensor weight, bias;
};
FoldedConvolution fold_eval_batch_norm(const Tensor& conv_weight, const Tensor& conv_bias, const Tensor& weight,
                                       const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                                       float eps = 1e-5f);

// x (..., D1..Dk) normalised over its last k = normalized_dims dims (usually 1), per row.
// weight and bias have shape (D1..Dk) or are undefined.
Tensor layer_norm(const Tensor& x, int64_t normalized_dims, const Tensor& weight, const Tensor& bias,
                  float eps = 1e-5f);

}  // namespace adjoint
