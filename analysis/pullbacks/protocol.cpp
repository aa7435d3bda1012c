#include "analysis/pullbacks/protocol.h"

#include "engine/error.h"

namespace adjoint {

namespace {

// The published ImageNet evaluation (docs/methods.md §1.4), at the models' 224 pixels.
EvaluationProtocol published_imagenet() {
  EvaluationProtocol p;
  p.height = p.width = 224;
  p.source = "the published ImageNet protocol";
  p.images = 1000;
  p.shuffle_seed = 314;
  p.batch = 50;
  p.perturbations = 10;  // 5 per patch size
  p.metrics.infidelity_patches = {112, 56};
  p.metrics.infidelity_noise = InputRange{-1.0f, 1.0f};
  p.metrics.faithfulness_patch = 56;
  p.metrics.baseline = 0.0f;
  p.metrics.patch_side = 56;  // 56 × 56 = 3136 features a step
  p.metrics.monotonicity_samples = 10;
  p.metrics.sensitivity_samples = 10;
  p.metrics.sensitivity_radius = 0.02;
  p.metrics.sensitivity_radius_absolute = true;
  p.metrics.random_logit_seed = 42;
  return p;
}

}  // namespace

const std::vector<EvaluationProtocol>& evaluation_protocols() {
  static const std::vector<EvaluationProtocol> table = {published_imagenet()};
  return table;
}

EvaluationProtocol evaluation_protocol(int64_t height, int64_t width) {
  for (const EvaluationProtocol& p : evaluation_protocols())
    if (p.height == height && p.width == width) return p;
  EvaluationProtocol scaled;
  scaled.height = height, scaled.width = width;
  scaled.source = "the defaults scaled to the input size";
  scaled.images = 1000;
  scaled.batch = 32;
  scaled.perturbations = 50;
  return scaled;
}

std::string describe(const MetricSettings& s) {
  std::string patches;
  for (int64_t side : s.infidelity_patches) patches += cat(patches.empty() ? "" : ",", side);
  return cat("infidelity patches ", patches.empty() ? "H/2,H/4" : patches, " noise ",
             s.infidelity_noise ? cat("U(", s.infidelity_noise->lo, ",", s.infidelity_noise->hi, ")") : "range",
             "; faithfulness subsets ", s.faithfulness_subsets, " patch ", s.faithfulness_patch, " baseline ",
             s.baseline, "; patch side ", s.patch_side, "; monotonicity samples ", s.monotonicity_samples,
             "; sensitivity samples ", s.sensitivity_samples, " radius ", s.sensitivity_radius,
             s.sensitivity_radius_absolute ? " absolute" : " of the range", "; random logit seed ",
             s.random_logit_seed ? cat(*s.random_logit_seed) : "the metric seed");
}

}  // namespace adjoint
