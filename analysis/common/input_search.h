// The input-space optimiser: moves a batch of inputs, each example on its own, to lower
// per-example losses. One loop serves every analysis that searches input space:
//
//   IRIs             minimise ‖A_i(x′) − A_i(x)‖/‖A_i(x)‖ (analysis/stitching/iri.h)
//   pullback ascent  minimise −(target logit) under a soft pullback (analysis/pullbacks/explain.h)
//   PGD              minimise −CE(x′, y) inside an ε-set around x (analysis/common/robustness.h)
//
// Maximising is minimising the negated loss. The step rules (a table in the .cpp):
//
//   l2    x ← x − α·g/‖g‖₂ per example (a normalised L2 step of fixed length α); an
//         example whose gradient is zero stays where it is
//   sign  x ← x − α·sign(g) per pixel (the steepest step under L∞: PGD-L∞)
//   adam  Adam on every pixel (learning rate α, β = 0.9, 0.999, ε = 1e-8)
//
// After every step: the caller's projection (PGD's ε-ball or box around the clean input),
// then the clamp into the input range. The result is the best iterate of every example
// (IRIs) or simply the last (ascent, PGD).
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "analysis/common/attribution.h"
#include "engine/tensor.h"
#include "engine/transport.h"

namespace adjoint {

struct InputSearchOptions {
  std::string rule = "l2";  // l2 | sign | adam
  int64_t steps = 1000;
  float step = 0.5f;        // α: the L2 step length per example, the sign step per pixel, or Adam's rate
  InputRange range{0.0f, 1.0f};
  bool clamp = true;        // keep every iterate (the start included) inside `range`
  bool keep_best = true;    // return the best iterate (costs one more forward pass); false: the last
  // How the loss's cotangent reaches x: the gradient, or a soft pullback (IRIs may use any
  // transport; pullback ascent uses the soft one).
  Transport transport = Transport::gradient();
  // Applied to x after every step, before the clamp: moves each example back into a
  // feasible set (PGD's ε-ball around the clean input). Empty: no constraint.
  std::function<void(Tensor& x)> project;
};

struct InputSearchResult {
  Tensor best;                     // per example, the iterate with the lowest loss seen (keep_best), else the last
  std::vector<double> best_loss;   // its loss (keep_best only)
  std::vector<double> start_loss;  // the loss at the start
};

// Minimises per-example losses from x0: `losses(x)` returns N values (recorded, so that
// their cotangent reaches x). With keep_best every iterate is evaluated, the last included,
// so `steps` steps cost steps + 1 forward passes and `steps` backward passes; without it
// the last iterate is not evaluated (`steps` of each).
InputSearchResult minimise_per_example(const std::function<Tensor(const Tensor&)>& losses, const Tensor& x0,
                                       const InputSearchOptions& options);

}  // namespace adjoint
