// Training a stitch between two frozen models (docs/methods.md §2.1–2.3) and scoring it.
//
// Only the stitch's weight and bias change: A runs without autograd, B's targets too, and
// the gradient is asked for the stitch's parameters alone, so neither model's parameters,
// gradients nor BatchNorm statistics (eval mode) are touched. Training is the shared
// training loop's core (run_steps, models/training.h) with the stitch step as its step
// function: AdamW at a constant rate over shuffled mini-batches of raw images; the front
// model sees `front_inputs`, the end model's targets come from `end_inputs` (the same
// images under the standard protocol, the IRIs under the invariance-aware one) and HLM
// reads `labels`.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "analysis/stitching/objectives.h"
#include "analysis/stitching/pair.h"

namespace adjoint {

struct StitchTrainingSet {
  Tensor front_inputs;  // raw images (N, C, H, W) the front model sees
  Tensor end_inputs;    // raw images the end model's targets are computed on
  std::vector<int64_t> labels;
};

struct StitchTrainOptions {
  std::string objective = "slm";
  ObjectiveOptions objective_options;
  // Optimizer steps, the same number under every protocol whatever its set's size, so that
  // protocols compare at one budget; 0: the initialisation alone (the least-squares stitch).
  int64_t steps = 200;
  // At least 0: `epochs` passes over the training set instead (steps = epochs × batches per
  // epoch, so a smaller set gets fewer steps); −1: `steps` decides.
  int64_t epochs = -1;
  int64_t batch = 128;
  double lr = 1e-3;
  double weight_decay = 0.0;
  uint64_t seed = 0;  // the order of the examples (the Loader's shuffle)
  // With more steps than one epoch holds, A's features and B's targets of the whole set are kept after
  // one pass when they fit in this many bytes (they are the same in every epoch); else
  // (and always in a single epoch) they are computed per batch.
  int64_t cache_bytes = int64_t(1) << 30;
};

struct StitchTrainResult {
  int64_t steps = 0;
  double final_loss = NAN;  // mean loss over the last epoch's worth of steps (NaN: no steps)
};

// The optimizer steps of a stitch trained on `examples` examples (options.steps, or
// options.epochs passes when given).
int64_t stitch_steps(const StitchTrainOptions& options, int64_t examples);

// `progress(step, total_steps, loss)` after every step.
StitchTrainResult train_stitch(Stitch& stitch, const StitchPair& pair, const StitchTrainingSet& data,
                               const StitchTrainOptions& options,
                               const std::function<void(int64_t, int64_t, double)>& progress = {});

}  // namespace adjoint
