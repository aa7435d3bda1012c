// The input-space optimiser: moves a batch of inputs, each example on its own, along
// directions the caller computes, with the two step rules the analyses use:
//
//   l2    x ← x ± α·d/‖d‖₂ per example (a normalised L2 step of fixed length α); the step
//         pullback and gradient ascent take (analysis/explain.h) and the IRI search's
//         default (METHODS.md §2.3)
//   adam  Adam on every pixel (learning rate α, β = 0.9, 0.999, ε = 1e-8), the IRI search's
//         option
//
// After every step the inputs may be clamped into their range. minimise_per_example adds
// the search loop: per-example losses, the best iterate of every example kept.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "analysis/attribution.h"
#include "engine/tensor.h"
#include "engine/transport.h"

namespace adjoint {

// x ← x + step·d/‖d‖₂ for every example (row of the batch) of x, then clamped into
// *clamp_to when given. An example whose direction is zero stays where it is. x must be
// contiguous and own its storage; the update is in place.
void normalised_step(Tensor& x, const Tensor& direction, float step, const InputRange* clamp_to);

struct InputSearchOptions {
  std::string rule = "l2";  // l2 | adam
  int64_t steps = 1000;
  float step = 0.5f;        // α: the L2 step length per example, or Adam's learning rate
  InputRange range{0.0f, 1.0f};
  bool clamp = true;        // keep every iterate inside `range`
  // How the loss's cotangent reaches x: the gradient, or a soft pullback (IRIs may use any
  // transport; which reaches lower distances for the same cost is an open question).
  Transport transport = Transport::gradient();
};

// The rules' names, for --help and errors.
std::vector<std::string> input_step_rules();

struct InputSearchResult {
  Tensor best;                     // per example, the iterate with the lowest loss seen
  std::vector<double> best_loss;   // its loss
  std::vector<double> start_loss;  // the loss at the start
};

// Minimises per-example losses from x0: `losses(x)` returns N values (recorded, so that
// their gradient reaches x). Every iterate is evaluated, the start and the last included,
// so `steps` steps cost steps + 1 forward passes and `steps` backward passes.
InputSearchResult minimise_per_example(const std::function<Tensor(const Tensor&)>& losses, const Tensor& x0,
                                       const InputSearchOptions& options);

}  // namespace adjoint
