// The settings of an evaluation (`adjoint explain --evaluate`): which images, in what
// batches, and every constant of the metrics, as a table keyed by the input's size.
//
// At 224 × 224 the row is the published ImageNet protocol (docs/methods.md §1.4): 1000
// images shuffled with seed 314 in 20 batches of 50; infidelity on 112- and 56-pixel
// patches of U(−1, 1) noise, 5 of each; faithfulness correlation on 56-pixel patches set
// to 0; faithfulness estimate and monotonicity on steps of 3136 features (56 × 56 pixels);
// monotonicity and max-sensitivity with 10 samples, the latter of radius 0.02; random
// logit over the model's classes with seed 42. Any other size gets the defaults scaled to
// it (patches of H/2 and H/4, an 8 × 8 grid, subsets of 10% of the features), which is how
// the small images of the project's own models are evaluated.
//
// The size is asked of the data (the images' shape), never of a model's or a data set's
// name, so any model at 224 pixels is evaluated the published way.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "analysis/common/attribution.h"

namespace adjoint {

// The metrics' constants a report uses (analysis/pullbacks/report.h); the defaults are
// the scaled ones.
struct MetricSettings {
  std::vector<int64_t> infidelity_patches;  // sides; empty: {H/2, H/4}
  std::optional<InputRange> infidelity_noise;  // unset: the input range
  int64_t faithfulness_subsets = 50;
  int64_t faithfulness_patch = 0;  // > 0: each subset a random square patch of this side; 0: 10% of the features
  float baseline = 0.0f;           // what faithfulness correlation and estimate set removed features to
  int64_t patch_side = 0;          // faithfulness estimate and monotonicity; 0: ⌈H/8⌉
  int64_t monotonicity_samples = 10;
  int64_t sensitivity_samples = 10;
  double sensitivity_radius = 0.02;
  bool sensitivity_radius_absolute = false;  // in input units; false: a fraction of the range's width
  std::optional<uint64_t> random_logit_seed;  // unset: the report's metric seed
};

// One row of the table.
struct EvaluationProtocol {
  int64_t height = 0, width = 0;  // the input size it is for
  std::string source;             // where its numbers come from
  int64_t images = 0;             // how many images
  std::optional<uint64_t> shuffle_seed;  // the images are the first of the set shuffled with it; unset: in order
  int64_t batch = 0;              // images per batch
  int64_t perturbations = 0;      // infidelity perturbations per image, shared over the patch sizes
  MetricSettings metrics;
};

// Every row, by input size.
const std::vector<EvaluationProtocol>& evaluation_protocols();

// The row for images of height × width; for a size without one, the scaled defaults
// (1000 images in order, batches of 32, 50 infidelity perturbations, MetricSettings{}).
EvaluationProtocol evaluation_protocol(int64_t height, int64_t width);

// One line per setting, for a report's context and its cells' record.
std::string describe(const MetricSettings& settings);

}  // namespace adjoint
