// The vocabulary the analysis modules share: a classifier is a function from a batch to
// logits, an explainer maps a batch and one target class per example to attributions of
// the input's shape. Explanation methods (analysis/pullbacks/explain.h) make explainers; quality
// metrics (analysis/pullbacks/metrics.h) score them.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/tensor.h"

namespace adjoint {

// Logits (N, classes) of a batch (N, ...). Runs in eval mode; must not require grad.
using Classifier = std::function<Tensor(const Tensor& x)>;

// Attributions with the shape of x for the given target class of each example.
using Explainer = std::function<Tensor(const Tensor& x, const std::vector<int64_t>& targets)>;

// The range the inputs live in (after normalisation): perturbations and step sizes are
// stated relative to it (docs/methods.md §1.3–1.4).
struct InputRange {
  float lo = -1.0f, hi = 1.0f;
  float width() const { return hi - lo; }
};

}  // namespace adjoint
