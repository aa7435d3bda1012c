// Layout ops: change how values are arranged, never what they are.
//
// reshape (of a contiguous tensor), squeeze, unsqueeze, permute, transpose, slice and
// broadcast_to are views: they share the input's storage. Each is still a recorded op
// whose transport maps the cotangent back to the input's layout (permute back, pad a
// slice with zeros, sum a broadcast). All are linear, so the three transports coincide.
// Axes may be negative (counted from the end).
#pragma once
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace adjoint {

// Same values in another shape; one extent may be -1 (inferred). A view when `x` is
// contiguous, otherwise a copy first.
Tensor reshape(const Tensor& x, Shape shape);
// Merges axes start_axis..end into one: [N, C, H, W] -> [N, C·H·W] for start_axis = 1.
Tensor flatten(const Tensor& x, int64_t start_axis = 1);
// Output axis i is input axis axes[i]. A strided view.
Tensor permute(const Tensor& x, std::vector<int64_t> axes);
Tensor transpose(const Tensor& x, int64_t a, int64_t b);
// Elements start, start+step, ... < end along `axis` (Python slicing: negative bounds
// count from the end and bounds are clipped to the extent; step >= 1). A view.
Tensor slice(const Tensor& x, int64_t axis, int64_t start, int64_t end, int64_t step = 1);
// Joins tensors along `axis`; all other extents must agree.
Tensor concat(const std::vector<Tensor>& tensors, int64_t axis);
// Pads every axis with (before, after) copies of `value`: one pair per axis, all >= 0.
Tensor pad(const Tensor& x, const std::vector<std::pair<int64_t, int64_t>>& before_after_per_axis,
           float value = 0.0f);
// Broadcasts to `shape` by NumPy rules (trailing axes aligned; an extent of 1, or a
// missing leading axis, repeats). A view with stride 0 on the repeated axes.
Tensor broadcast_to(const Tensor& x, const Shape& shape);
// The adjoint of broadcast_to: sums x over the axes that broadcasting `shape` to
// x.shape() would repeat, giving a tensor of `shape`.
Tensor sum_to(const Tensor& x, const Shape& shape);
// Inserts an axis of extent 1 before position `axis` (axis in [-rank-1, rank]). A view.
Tensor unsqueeze(const Tensor& x, int64_t axis);
// Removes `axis`, which must have extent 1. A view.
Tensor squeeze(const Tensor& x, int64_t axis);

}  // namespace adjoint
