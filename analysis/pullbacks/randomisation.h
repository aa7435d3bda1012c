// Model-parameter randomisation test (Adebayo et al. 2018), docs/methods.md §1.4: an
// explanation that depends on what the model learned must change when the learned
// weights are destroyed.
//
// Top-down cascading randomisation, as Quantus's ModelParameterRandomisation: the layers
// (modules that own parameters directly) are taken from the output back to the input, and
// at step k the first k of them have been re-initialised in one copy of the model. At each
// step the explanation is recomputed on the copy and compared with the original map by
// the Spearman rank correlation, per example. Lower is better: a low correlation means the
// explanation is sensitive to the parameters.
//
// Re-initialisation follows torch's reset_parameters: every tensor of the layer
// (parameters and buffers, e.g. BatchNorm running statistics) takes the value it has in a
// freshly built model of the same architecture made with Generator(seed), i.e. the
// architecture's default initialisation.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "analysis/pullbacks/metrics.h"
#include "models/model.h"

namespace adjoint {

// Builds an untrained model of the architecture under test. The default builds
// make_model(model.config(), gen); pass one for models make_model does not know.
using ModelFactory = std::function<std::shared_ptr<Model>(Generator& gen)>;

// Makes the explainer of a given model (e.g. a soft pullback through that model's blocks).
using ExplainerFactory = std::function<Explainer(const Model& model)>;

struct RandomisationOptions {
  uint64_t seed = 42;     // of the freshly initialised values (Quantus's default seed)
  bool absolute = true;   // correlate |attr| (Quantus's default abs=True); false: raw maps
  int64_t max_layers = 0; // stop after this many layers from the top; 0: all of them
  // Only steps [first_step, first_step + step_count) are explained and correlated (0: to the
  // last), the layers before them re-initialised without explaining: a piece of the test that
  // gives exactly the per-layer values of the whole, so that pieces can run apart.
  int64_t first_step = 0, step_count = 0;
};

// The layers in top-down order: the dotted name of each module that owns parameters
// ("fc", "layer4.1.bn2"; "<root>" for parameters registered on the model itself), from
// the last registered to the first. Models register their modules in forward order.
std::vector<std::string> layers_top_down(const Model& model);

struct RandomisationResult {
  std::vector<std::string> layers;             // re-initialised cumulatively, output first
  std::vector<std::vector<double>> per_layer;  // [step][example]: Spearman correlation (the steps run)
  MetricResult mean;                           // per example: the mean over the steps run
  // The curve to plot: the mean over examples at each step (NaNs left out).
  std::vector<double> curve() const;
};

// Per example, the mean of its correlations over the steps ([step][example]); NaN without
// steps. The whole test's score, and the score of pieces put back together.
std::vector<double> mean_over_steps(const std::vector<std::vector<double>>& per_layer, int64_t examples);

// `attr` is the original explanation when the caller has it; undefined: computed with
// make_explainer(model). The model keeps its weights: every step works on a copy, which
// is put in the model's training/eval mode.
RandomisationResult model_parameter_randomisation(const Model& model, const ExplainerFactory& make_explainer,
                                                  const Tensor& x, const std::vector<int64_t>& targets,
                                                  const RandomisationOptions& options = {}, const Tensor& attr = {},
                                                  const ModelFactory& factory = {});

}  // namespace adjoint
