// Quality metrics for explanations (docs/methods.md §1.4).
//
// Every metric returns one value per example (MetricResult::values), so a report can give
// mean ± std and a confidence interval (MetricResult::summary), and every result carries
// its MetricInfo: the name, the direction (higher or lower is better) and what it measures.
//
// Metrics that query the model with perturbed inputs are split in two steps. A *probe*
// runs the model on the perturbations once and keeps its responses; scoring a probe
// against an attribution map needs no model call. Perturbations are drawn from a
// counter-based Generator keyed by (seed, metric, example index, sample index) and never
// depend on the attribution, so one probe scores every explanation method on exactly the
// same perturbations, and splitting a data set into batches changes nothing as long as
// `first_example` gives the index of the batch's first example in the whole set.
//
// Conventions:
// - x is a batch (N, ...) and `targets` holds one class per example; an attribution map
//   has x's shape. The patch metrics need images (N, C, H, W); a patch covers every
//   channel of a square of pixels.
// - Maps are scored as given, without Quantus's normalisation by the maximum: every
//   score here is invariant to a positive rescaling of a map (Infidelity through its
//   optimal scale β), so that normalisation would change nothing (Sparseness applies it
//   anyway, since Quantus adds its 1e-7 after it).
// - A value that is undefined on an example (a correlation with a constant map, the
//   entropy of an all-zero map) is NaN; summaries leave NaNs out and count them.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <vector>

#include "analysis/common/attribution.h"
#include "analysis/common/statistics.h"
#include "engine/random.h"

namespace adjoint {

// What a metric measures and which way is better; reports print it beside every score.
struct MetricInfo {
  std::string name;  // e.g. "infidelity"
  bool higher_is_better = false;
  std::string description;
  // Where a value is undefined (NaN, left out of the mean and counted as undefined), said
  // where a table has no defined value to show; empty: always defined.
  std::string undefined_when{};
  std::string direction() const { return higher_is_better ? "higher is better" : "lower is better"; }
};

// Every metric of this module (analysis/pullbacks/metrics.h, randomisation.h, focus.h), in the order
// of docs/methods.md §1.4.
const std::vector<MetricInfo>& metric_catalogue();
// The catalogue entry of `name`; throws an Error listing the known names.
const MetricInfo& metric_info(const std::string& name);

struct MetricResult {
  MetricInfo info;
  std::vector<double> values;  // one per example; NaN where undefined
  Summary summary(double confidence = 0.95) const { return summarize(values, confidence); }
};

// The random streams of the metrics: one per metric, so that two metrics with the same
// seed never share draws.
enum class RandomStream : uint64_t {
  infidelity = 1,
  max_sensitivity,
  random_logit,
  faithfulness_correlation,
  monotonicity,
  focus,
};

// A generator that is a pure function of (seed, stream, path): path is e.g. {example,
// sample}. Philox hashes the parts one after the other into the generator's key.
Generator keyed_generator(uint64_t seed, RandomStream stream, std::initializer_list<uint64_t> path);

// Options shared by the metrics that draw random perturbations.
struct SamplingOptions {
  uint64_t seed = 0;
  int64_t first_example = 0;  // index of x[0] in the evaluated set: keys the draws of each example
  int64_t batch_size = 64;    // model inputs per classifier call
};

// ---------------------------------------------------------------------------------------
// Infidelity (lower is better; Yeh et al. 2019, with the optimal scale as in Captum).
// Perturbation k of an example replaces one square patch (all channels) at a uniformly
// random position by U(lo, hi) noise over the input range: I = x − x_pert is non-zero on the
// patch only. With a_k = ⟨attr, I_k⟩ and b_k = f_c(x) − f_c(x_pert,k), β = Σ a b / Σ a² and
// the score is mean_k (β a_k − b_k)². When Σ a² = 0 (the map is zero on every patch) β is
// taken as 0, so the score is mean_k b_k²: the error of explaining nothing.
struct InfidelityOptions : SamplingOptions {
  std::vector<int64_t> patch_sizes;  // side lengths; empty: {H/2, H/4} (at least 1)
  int64_t samples_per_size = 5;      // perturbations per patch size (docs/methods.md default 5)
  // The noise's interval; unset: the input range. Quantus's "uniform" baseline, which the
  // published ImageNet protocol used, is U(−1, 1) whatever the range.
  std::optional<InputRange> noise;
};

// The model's response to every perturbation of every example, for scoring any number of
// attribution maps of the same x.
struct InfidelityProbe {
  Tensor x;  // (N, C, H, W), contiguous
  InputRange range;
  InfidelityOptions options;           // patch_sizes resolved
  std::vector<double> output_drops;    // [example · samples + k]: f_c(x) − f_c(x_pert,k)
  int64_t samples() const;             // perturbations per example
};

InfidelityProbe probe_infidelity(const Classifier& model, const Tensor& x, const std::vector<int64_t>& targets,
                                 InputRange range, InfidelityOptions options = {});
MetricResult infidelity(const InfidelityProbe& probe, const Tensor& attr);
MetricResult infidelity(const Classifier& model, const Tensor& x, const std::vector<int64_t>& targets,
                        const Tensor& attr, InputRange range, const InfidelityOptions& options = {});

// ---------------------------------------------------------------------------------------
// Max-Sensitivity (lower is better; Yeh et al. 2019): max over `samples` draws of
// ‖a(x) − a(x+δ)‖_F / ‖a(x)‖_F with δ uniform in the L∞ ball of radius
// radius·(hi − lo). x+δ is not clipped to the range. NaN where a(x) = 0.
struct MaxSensitivityOptions : SamplingOptions {
  int64_t samples = 10;
  double radius = 0.02;  // fraction of the input range's width
};
// `attr` is a(x) when the caller has it already; undefined: computed with the explainer.
MetricResult max_sensitivity(const Explainer& explainer, const Tensor& x, const std::vector<int64_t>& targets,
                             InputRange range, const MaxSensitivityOptions& options = {}, const Tensor& attr = {});

// ---------------------------------------------------------------------------------------
// Random Logit (lower is better; Sixt et al. 2020): Pearson correlation between the map
// for the target class and the map for another class drawn uniformly from the other
// num_classes − 1 classes (keyed by seed and example index).
struct RandomLogitOptions {
  uint64_t seed = 0;
  int64_t first_example = 0;
};
MetricResult random_logit(const Explainer& explainer, const Tensor& x, const std::vector<int64_t>& targets,
                          int64_t num_classes, const RandomLogitOptions& options = {}, const Tensor& attr = {});
// The class random_logit compares example `example` (index in the evaluated set) against.
int64_t random_other_class(int64_t target, int64_t num_classes, uint64_t seed, int64_t example);

// ---------------------------------------------------------------------------------------
// Faithfulness Correlation (higher is better; Bhatt et al. 2020): over `subsets` random
// subsets S of fixed size of an example's features (its elements, channels separately),
// Pearson correlation between Σ_{i∈S} attr_i and f_c(x) − f_c(x with S set to baseline).
// Quantus draws 100 subsets of 224 features for 224×224 maps; we default to 50 subsets
// of 10% of the features, which scales with the input size.
// With patch_size > 0 a subset is instead one square patch of that side at a uniformly
// random position, every channel of it (images (N, C, H, W) only); subset_size is then
// the patch's C·side² features.
struct FaithfulnessCorrelationOptions : SamplingOptions {
  int64_t subsets = 50;
  double subset_fraction = 0.1;  // of the features per example, when subset_size is 0
  int64_t subset_size = 0;       // features per subset (overrides subset_fraction)
  int64_t patch_size = 0;        // > 0: each subset a random square patch of this side
  float baseline = 0.0f;
};
struct FaithfulnessCorrelationProbe {
  Shape shape;                               // x's shape
  FaithfulnessCorrelationOptions options;    // subset_size resolved
  std::vector<double> output_drops;          // [example · subsets + s]
};
FaithfulnessCorrelationProbe probe_faithfulness_correlation(const Classifier& model, const Tensor& x,
                                                            const std::vector<int64_t>& targets,
                                                            FaithfulnessCorrelationOptions options = {});
MetricResult faithfulness_correlation(const FaithfulnessCorrelationProbe& probe, const Tensor& attr);
MetricResult faithfulness_correlation(const Classifier& model, const Tensor& x, const std::vector<int64_t>& targets,
                                      const Tensor& attr, const FaithfulnessCorrelationOptions& options = {});

// ---------------------------------------------------------------------------------------
// The patch metrics cut each image into a grid of square patches of side patch_size (the
// last row and column are cut short when the side does not divide H or W), row-major.
struct Patch {
  int64_t top, left, height, width;
};
std::vector<Patch> patch_grid(int64_t height, int64_t width, int64_t patch_size);

// Faithfulness Estimate (higher is better; Alvarez-Melis & Jaakkola 2018): Pearson
// correlation between each patch's attribution sum and the logit drop f_c(x) − f_c(x with
// the patch set to baseline). Deterministic: no random draws.
struct FaithfulnessEstimateOptions {
  int64_t patch_size = 0;  // 0: ceil(H/8), an 8×8 grid
  float baseline = 0.0f;
  int64_t batch_size = 64;
};
// Monotonicity Correlation (higher is better; Nguyen & Martínez 2020): Spearman
// correlation between each patch's Σ|attr| and the mean squared change of the target
// logit, mean_k (f_c(x_pert,k) − f_c(x))², when the patch is replaced by U(lo, hi) noise,
// `samples` times (Quantus: 100 samples of single features; we default to 10 per patch).
struct MonotonicityOptions : SamplingOptions {
  int64_t patch_size = 0;  // 0: ceil(H/8)
  int64_t samples = 10;
};

// The model's response per patch of every example (the logit drop for Faithfulness
// Estimate, the mean squared change for Monotonicity), for scoring any number of maps.
struct PatchProbe {
  std::string metric;  // "faithfulness_estimate" or "monotonicity_correlation"
  Shape shape;         // x's shape
  int64_t patch_size = 0;
  std::vector<double> responses;  // [example · patches + p]
};
PatchProbe probe_faithfulness_estimate(const Classifier& model, const Tensor& x, const std::vector<int64_t>& targets,
                                       const FaithfulnessEstimateOptions& options = {});
PatchProbe probe_monotonicity(const Classifier& model, const Tensor& x, const std::vector<int64_t>& targets,
                              InputRange range, const MonotonicityOptions& options = {});
MetricResult faithfulness_estimate(const PatchProbe& probe, const Tensor& attr);
MetricResult monotonicity_correlation(const PatchProbe& probe, const Tensor& attr);
MetricResult faithfulness_estimate(const Classifier& model, const Tensor& x, const std::vector<int64_t>& targets,
                                   const Tensor& attr, const FaithfulnessEstimateOptions& options = {});
MetricResult monotonicity_correlation(const Classifier& model, const Tensor& x, const std::vector<int64_t>& targets,
                                      const Tensor& attr, InputRange range, const MonotonicityOptions& options = {});

// ---------------------------------------------------------------------------------------
// Properties of the map alone, over all elements of each example's map (pass a map
// summed over channels for pixel-level scores, as Quantus usually receives).
// Sparseness (higher is better; Chalasani et al. 2020): the Gini index of |attr| exactly as
// Quantus computes it (normalise by the maximum, abs, then the 1e-7 it adds):
// v = sort(|a| / max|a| + 1e-7), Σ_i (2i − d − 1) v_i / (d Σ v), i = 1..d; 0 for a zero map.
MetricResult sparseness(const Tensor& attr);
// Complexity (lower is better; Bhatt et al. 2020): the entropy −Σ p ln p of p = |a| / Σ|a|
// (natural log, as scipy.stats.entropy). NaN for a zero map.
MetricResult complexity(const Tensor& attr);

}  // namespace adjoint
