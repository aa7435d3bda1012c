#include "analysis/pullbacks/randomisation.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "engine/error.h"
#include "engine/threads.h"
#include "models/checkpoint.h"

namespace adjoint {

namespace {

constexpr const char* kRootLayer = "<root>";

// The module that owns a tensor: its dotted name without the last part ("" for the root).
std::string owner_of(const std::string& tensor_name) {
  const size_t dot = tensor_name.rfind('.');
  return dot == std::string::npos ? std::string() : tensor_name.substr(0, dot);
}

std::string module_of_layer(const std::string& layer) { return layer == kRootLayer ? std::string() : layer; }

}  // namespace

std::vector<std::string> layers_top_down(const Model& model) {
  std::vector<std::string> layers;
  for (const auto& [name, tensor] : model.named_parameters()) {
    std::string owner = owner_of(name);
    if (owner.empty()) owner = kRootLayer;
    // named_parameters lists a module's tensors together, so comparing with the last
    // layer seen is enough to list each module once, in registration order.
    if (layers.empty() || layers.back() != owner) layers.push_back(owner);
  }
  return {layers.rbegin(), layers.rend()};
}

std::vector<double> RandomisationResult::curve() const {
  std::vector<double> out;
  for (const auto& step : per_layer) out.push_back(summarize(step).mean);
  return out;
}

RandomisationResult model_parameter_randomisation(const Model& model, const ExplainerFactory& make_explainer,
                                                  const Tensor& x, const std::vector<int64_t>& targets,
                                                  const RandomisationOptions& options, const Tensor& attr,
                                                  const ModelFactory& factory) {
  const std::string metric = "model_parameter_randomisation";
  check(x.defined() && x.dim() >= 2, metric, ": x must be a batch (N, ...), got ",
        x.defined() ? to_string(x.shape()) : std::string("undefined"));
  check(static_cast<int64_t>(targets.size()) == x.size(0), metric, ": ", targets.size(),
        " target classes for a batch of ", x.size(0), " examples ", x.shape());
  check(options.max_layers >= 0, metric, ": max_layers must not be negative, got ", options.max_layers);
  check(options.first_step >= 0 && options.step_count >= 0, metric, ": steps from ", options.first_step, ", ",
        options.step_count, " of them: expected numbers >= 0");
  const ModelFactory build = factory ? factory : [&model](Generator& gen) { return make_model(model.config(), gen); };

  // The values re-initialised layers take, and the copy the layers are re-initialised in.
  Generator fresh_gen(options.seed), copy_gen(options.seed);
  const std::shared_ptr<Model> fresh = build(fresh_gen);
  const std::shared_ptr<Model> copy = build(copy_gen);
  check(fresh && copy, metric, ": the model factory returned no model");
  load_state_dict(*copy, model.state_dict(), metric + ": copy of the model");
  copy->train(model.training());
  const std::map<std::string, Tensor> fresh_state = fresh->state_dict();
  const std::map<std::string, Tensor> copy_state = copy->state_dict();

  const auto check_shape = [&](const Tensor& map, const char* what) {
    check(map.defined() && map.shape() == x.shape(), metric, ": ", what, " ",
          map.defined() ? to_string(map.shape()) : std::string("undefined"), " does not have the input's shape ",
          x.shape());
  };
  const Tensor original = (attr.defined() ? attr : make_explainer(model)(x, targets)).detach().contiguous();
  check_shape(original, "attribution");

  const int64_t n = x.size(0), d = x.numel() / n;
  // An example's map as doubles, in magnitude when options.absolute.
  const auto example_values = [&](const Tensor& map, int64_t i) {
    const float* p = map.data() + i * d;
    std::vector<double> v(p, p + d);
    if (options.absolute)
      for (double& e : v) e = std::fabs(e);
    return v;
  };

  RandomisationResult result;
  result.layers = layers_top_down(model);
  if (options.max_layers > 0 && static_cast<size_t>(options.max_layers) < result.layers.size())
    result.layers.resize(static_cast<size_t>(options.max_layers));
  const int64_t end_step = options.step_count > 0 ? options.first_step + options.step_count : int64_t(result.layers.size());
  for (int64_t k = 0; k < std::min<int64_t>(end_step, int64_t(result.layers.size())); ++k) {
    const std::string module = module_of_layer(result.layers[size_t(k)]);
    for (const auto& [name, tensor] : copy_state) {
      if (owner_of(name) != module) continue;
      const auto it = fresh_state.find(name);
      check(it != fresh_state.end() && it->second.shape() == tensor.shape(), metric, ": the fresh model has no tensor '",
            name, "' of shape ", tensor.shape());
      Tensor target = tensor;
      target.copy_from(it->second);
    }
    if (k < options.first_step) continue;  // re-initialised only, on the way to the piece's steps
    const Tensor randomised = make_explainer(*copy)(x, targets).detach().contiguous();
    check_shape(randomised, "explanation of the randomised model");
    std::vector<double> step(static_cast<size_t>(n));
    parallel_for(n, 1, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i)
        step[static_cast<size_t>(i)] = spearman(example_values(original, i), example_values(randomised, i));
    });
    result.per_layer.push_back(std::move(step));
  }

  result.mean = {metric_info(metric), mean_over_steps(result.per_layer, n)};
  return result;
}

std::vector<double> mean_over_steps(const std::vector<std::vector<double>>& per_layer, int64_t examples) {
  std::vector<double> means(static_cast<size_t>(examples));
  for (int64_t i = 0; i < examples; ++i) {
    std::vector<double> over_steps;
    for (const auto& step : per_layer) over_steps.push_back(step.at(static_cast<size_t>(i)));
    means[static_cast<size_t>(i)] =
        over_steps.empty() ? std::numeric_limits<double>::quiet_NaN() : summarize(over_steps).mean;
  }
  return means;
}

}  // namespace adjoint
