// Losses: scalar means over a batch. Their transports are the exact VJP (a loss is where
// a backward pass starts, and it is smooth in its inputs).
#pragma once
#include <vector>

#include "engine/tensor.h"

namespace adjoint {

// Mean over the batch of the cross-entropy between softmax(logits) and the targets:
// logits (N, C), labels N class indices in [0, C). With label smoothing ε the target
// is (1−ε)·onehot(label) + ε/C, exactly PyTorch's formula:
//   loss_i = −(1−ε)·log p_i[label_i] − (ε/C)·Σ_c log p_i[c].
// Fused and stable: one log_softmax, and one node whose VJP is (softmax − target)/N.
Tensor cross_entropy(const Tensor& logits, const std::vector<int64_t>& labels, float label_smoothing = 0.0f);

// mean((a − b)²) over all elements; a and b of the same shape.
Tensor mse_loss(const Tensor& a, const Tensor& b);

}  // namespace adjoint
