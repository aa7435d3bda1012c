// 2-D pooling over (N, C, H, W) inputs, with PyTorch's conventions (floor output size,
// padding at most half the kernel, average pooling counting the padding).
//
// Transports (docs/methods.md §1.2): average pooling is linear, one rule for all three. Max
// pooling routes the cotangent to the arg-max under Gradient and Pullback (ties: the first
// maximal position in row-major window order; padding counts as −inf), and under
// SoftPullback spreads it over the window with weights softmax(window/τ), τ =
// transport.tau.max_pool, held fixed; padding positions take no share.
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace adjoint {

Tensor max_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding = 0);
Tensor max_pool2d(const Tensor& x, int64_t kernel_h, int64_t kernel_w, int64_t stride_h, int64_t stride_w,
                  int64_t pad_h, int64_t pad_w);

// count_include_pad = true: every window divides by kernel_h·kernel_w.
Tensor avg_pool2d(const Tensor& x, int64_t kernel, int64_t stride, int64_t padding = 0);
Tensor avg_pool2d(const Tensor& x, int64_t kernel_h, int64_t kernel_w, int64_t stride_h, int64_t stride_w,
                  int64_t pad_h, int64_t pad_w);

// Output (N, C, out_h, out_w); window i spans [floor(i·H/out_h), ceil((i+1)·H/out_h)).
Tensor adaptive_avg_pool2d(const Tensor& x, int64_t out_h, int64_t out_w);

}  // namespace adjoint
