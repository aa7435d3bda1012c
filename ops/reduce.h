// Reductions over a set of axes.
//
// `axes` lists the axes to reduce (negative counts from the end); empty means all axes.
// With keepdim the reduced axes stay as extent 1, otherwise they are dropped.
//
// Results are deterministic: each output sums its inputs in a fixed order and blocking
// that depend on the shape only, never on the thread count, and accumulate in double.
// sum, mean and var are smooth: one rule for all transports. max routes (see below).
#pragma once
#include <vector>

#include "engine/tensor.h"

namespace adjoint {

Tensor sum(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);
Tensor mean(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);
// The maximum over `axes`. Gradient and Pullback send u to the first maximal element,
// "first" in row-major order over the reduced axes (PyTorch's rule for max over a dim;
// a NaN counts as the maximum). SoftPullback softens that routing as max-pool does
// (docs/methods.md §1.2): u spread over the reduced elements with fixed weights
// softmax(x/τ), τ = transport.tau.max_pool.
Tensor max(const Tensor& x, std::vector<int64_t> axes = {}, bool keepdim = false);
// Variance over `axes`: Σ(x−mean)² / (n − 1) when unbiased, / n otherwise.
Tensor var(const Tensor& x, std::vector<int64_t> axes = {}, bool unbiased = true, bool keepdim = false);

}  // namespace adjoint
