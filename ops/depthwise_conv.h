// Depth-wise convolution on channels-last maps, the layout a transformer's tokens already
// have: (B, H, W, C) is a (B, H·W, C) token tensor read as its map, with no copy. PVT-v2's
// MLP runs one between two per-token linear layers; as conv2d with groups = C on (B, C, H, W)
// it would need the tokens transposed there and back, and each group would be a GEMM of one
// row, slower than the loop below, which runs along the contiguous channels.
//
// The kernel is k×k with k odd, stride 1 and zero padding k/2, so the map keeps its size:
//   y[b][h][w][c] = bias[c] + Σ_{i,j} weight[c][0][i][j] · x[b][h + i − k/2][w + j − k/2][c].
// It is affine in x: one rule serves every transport (the input's cotangent is the same
// convolution of the output's cotangent with the kernel flipped).
#pragma once
#include "engine/tensor.h"
#include "ops/activation.h"

namespace adjoint {

// x (B, H, W, C), weight (C, 1, k, k) as torch's Conv2d(C, C, k, padding=k // 2, groups=C)
// stores it, bias (C) or undefined → (B, H, W, C). Sums run over i, then j, in order: the
// same bits at any thread count.
Tensor depthwise_conv2d_channels_last(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

// activation(depthwise_conv2d_channels_last(x + input_bias, weight, bias), act) as one op,
// as PVT-v2's MLP applies GELU after its convolution; input_bias (C) or undefined is added
// to every value of x as it is read (the bias of the linear layer that made x, which then
// need not write it, nor its backward sum it in a pass of its own: its gradient is summed
// from the input's cotangent rows as they are made). Each position's outputs go through
// the activation while they are in L1; recorded, the pre-activation is written in the same
// pass and kept, or, in a training step (GradientOnly) with GELU or SiLU, the activation's
// derivative, which leaves the backward a product. The same bits as the composed ops,
// forward and under every transport (the input bias's gradient up to the order of its sum).
Tensor depthwise_conv2d_channels_last(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                                      const Tensor& input_bias = {});

}  // namespace adjoint
