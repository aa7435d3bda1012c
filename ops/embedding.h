// Embedding lookup: rows of a weight table gathered by index.
#pragma once
#include <vector>

#include "engine/tensor.h"

namespace adjoint {

// weight (V, D); `indices` (row-major, numel(index_shape) of them, each in [0, V)) →
// a tensor of shape index_shape + [D] whose entry at an index position is that row of
// weight. Linear in weight: one transport rule for all three, a scatter-add of the
// cotangent rows into a (V, D) gradient (rows summed in index order, deterministic).
Tensor embedding(const Tensor& weight, const std::vector<int64_t>& indices, Shape index_shape);

}  // namespace adjoint
