// What the files of explain_report (analysis/pullbacks/report.h) share, included by them
// alone: the run, a batch, one method's maps and a batch's counts, which the metrics' steps
// (report_metrics.cpp) work on and the report (report.cpp) fills in, and the small helpers
// both use.
//
//   report.cpp          the report: its batches, pictures, cost and cells
//   report_metrics.cpp  each metric's steps, the table of metrics, their names
//   report_tables.cpp   the metric table as CSV, JSON and Markdown
//   report_record.cpp   the record of what made a report's cells
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "analysis/pullbacks/focus.h"
#include "analysis/pullbacks/metrics.h"
#include "analysis/pullbacks/randomisation.h"
#include "analysis/pullbacks/report.h"
#include "engine/error.h"

namespace adjoint {

// ---- what the metrics' steps work on -----------------------------------------------------

// Everything the metrics share over one report, set up once by start_run.
struct ReportRun {
  const Model& model;
  const ReportOptions& options;
  Classifier classifier{};                   // the model's logits, recording off
  Tensor x{};                                // (N, C, H, W), contiguous
  std::vector<int64_t> labels{}, targets{};  // labels may be empty
  // The predicted classes are read off the first method's own forward pass, batch by batch
  // (explain_predicted), rather than found first: `targets` is empty until the batches are done.
  bool targets_from_first_method = false;
  int64_t images = 0, height = 0, width = 0;
  int64_t expensive = 0;                     // E: the expensive metrics run on the first E images
  int64_t classes = 0;                       // found only where read (ReportMetric::reads_classes, a fixed target)
  int64_t layers = 0, randomised = 0;        // the model's layers; those randomisation re-initialises
  // The metrics' settings, seeded by options.metric_seed (first_example is set per batch).
  InfidelityOptions infidelity{};
  FaithfulnessCorrelationOptions faithfulness_correlation{};
  FaithfulnessEstimateOptions faithfulness_estimate{};
  MonotonicityOptions monotonicity{};
  MaxSensitivityOptions max_sensitivity{};
  RandomisationOptions randomisation{};
  uint64_t random_logit_seed = 0;
  // Focus: mosaics drawn once from the whole set (its prepare step), and how.
  Mosaics mosaics{};
  std::vector<double> recognised{};  // per mosaic, 1 where the model's top class is its target
  std::string focus_note{};

  InputRange range() const { return options.explain.range; }
  int64_t mosaic_count() const { return mosaics.images.defined() ? mosaics.images.size(0) : 0; }
  // "first E of the N images" when the expensive metrics run on part of the set.
  std::string expensive_note() const {
    return expensive < images ? cat("first ", expensive, " of the ", images, " images") : "";
  }
};

// One batch: images [first, first + size), of which the first `expensive` are in the
// expensive set; mosaics [first_mosaic, first_mosaic + mosaics); the batch's probes.
struct ReportBatch {
  int64_t first = 0, size = 0, expensive = 0;
  Tensor x, x_expensive;
  std::vector<int64_t> targets, targets_expensive;
  int64_t first_mosaic = 0, mosaics = 0;
  InfidelityProbe infidelity;
  FaithfulnessCorrelationProbe faithfulness_correlation;
  PatchProbe faithfulness_estimate, monotonicity;
};

// One method's maps of a batch, and how to explain again (for the metrics that do).
struct MethodMaps {
  std::string method;
  Tensor attr, attr_expensive;  // the batch's maps; the rows of its expensive images
  Explainer explainer;
};

// What a batch's cost depends on.
struct BatchCounts {
  const ReportOptions& options;
  int64_t images = 0, expensive = 0;  // of the batch
  double patches = 0;                 // per image, in the patch metrics' grid
  int64_t randomised = 0;             // layers re-initialised by randomisation
};


// ---- helpers ------------------------------------------------------------------------------

// A copy of rows [begin, begin + count) of a contiguous batch.
inline Tensor rows(const Tensor& t, int64_t begin, int64_t count) {
  Shape shape = t.shape();
  const int64_t row = t.numel() / shape[0];
  shape[0] = count;
  Tensor out = Tensor::empty(shape);
  std::copy(t.data() + begin * row, t.data() + (begin + count) * row, out.data());
  return out;
}

inline bool is_ascent(const std::string& method) { return method == "pullback_ascent" || method == "gradient_ascent"; }

// The side of the patch metrics' grid: the settings', else ⌈H/8⌉ (the metrics' default).
inline int64_t patch_side(const MetricSettings& s, int64_t height) { return s.patch_side > 0 ? s.patch_side : (height + 7) / 8; }

inline int64_t patch_count(const MetricSettings& s, int64_t height, int64_t width) {
  const int64_t side = patch_side(s, height);
  return ((height + side - 1) / side) * ((width + side - 1) / side);
}

// Infidelity's patch sizes: the settings', else two (H/2 and H/4).
inline int64_t patch_sizes(const MetricSettings& s) { return s.infidelity_patches.empty() ? 2 : int64_t(s.infidelity_patches.size()); }

// The perturbations per image shared evenly over the patch sizes, rounded up.
inline int64_t samples_per_size(int64_t perturbations, int64_t sizes) {
  return std::max<int64_t>(1, (perturbations + sizes - 1) / sizes);
}

// The images of the expensive set: the first expensive_count (0: all).
inline int64_t expensive_images(const ReportOptions& o, int64_t images) {
  return o.expensive_count > 0 ? std::min(o.expensive_count, images) : images;
}

// A number as the tables and pictures show it: 4 significant digits, "nan" (report_tables.cpp).
std::string number(double v);

// Whether metric `m` runs in pieces (ReportMetric::pieces) rather than in its batches' cells:
// in cells only, and randomisation only where it has layers to re-initialise.
inline bool runs_in_pieces(const ReportOptions& o, const ReportMetric& m, int64_t randomised) {
  if (!o.cells.enabled || m.pieces == ReportMetric::Pieces::None) return false;
  return m.pieces != ReportMetric::Pieces::ByStep || randomised > 0;
}

// Model-parameter randomisation of one method's maps of a batch's expensive images, over the
// steps `options` chooses: the metric's score, and a piece of it (cells.h).
RandomisationResult randomisation_of(const ReportRun& run, const ReportBatch& batch, const MethodMaps& maps,
                                     const RandomisationOptions& options);

// The model's top class of every row of x, `batch` rows at a time.
std::vector<int64_t> predicted_in_batches(const Model& model, const Tensor& x, int64_t batch);

}  // namespace adjoint
