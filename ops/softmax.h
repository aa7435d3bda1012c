// softmax and log_softmax along one axis, numerically stable (the maximum is subtracted
// before exponentiating; sums accumulate in double).
//
// Smooth maps: all three transports use the exact VJP. (Attention holds its softmax
// pattern fixed under Pullback; that rule belongs to ops/attention, not to this op.)
#pragma once
#include "engine/tensor.h"

namespace adjoint {

// exp(x − max) / Σ exp(x − max) along `axis` (negative counts from the end).
Tensor softmax(const Tensor& x, int64_t axis);
// (x − max) − log Σ exp(x − max) along `axis`.
Tensor log_softmax(const Tensor& x, int64_t axis);

}  // namespace adjoint
