// Convolution whose kernel equals its stride (non-overlapping r×r patches, no padding) on a
// channels-last map, as PVT-v2's spatial-reduction attention shrinks its keys' map:
//
//   y[b][i][j][o] = bias[o] + Σ_{di,dj,c} weight[o][c][di][dj] · x[b][i·r + di][j·r + dj][c].
//
// Each output position reads its own patch and nothing else, so on channels-last values the
// patches are the map's values regrouped (one copy, no im2col) and the convolution is one
// product with the kernel laid out (O, r·r·C): a linear layer over patches. Rows and
// columns beyond the last whole patch are ignored, as the convolution ignores them. Built
// from recorded ops (permute, reshape, linear), so every transport is theirs.
#pragma once
#include "engine/tensor.h"

namespace adjoint {

// x (B, H, W, C), weight (O, C, r, r) as torch's Conv2d(C, O, r, stride=r) stores it, bias
// (O) or undefined → (B, H/r, W/r, O), channels last (H/r and W/r rounded down).
Tensor patch_conv2d_channels_last(const Tensor& x, const Tensor& weight, const Tensor& bias = {});

}  // namespace adjoint
