#include "analysis/stitching/objectives.h"

#include "engine/error.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/loss.h"
#include "ops/reduce.h"
#include "ops/softmax.h"

namespace adjoint {

namespace {

Tensor hard_labels(const std::vector<Tensor>& path, const std::vector<Tensor>&, const std::vector<int64_t>& labels,
                   const ObjectiveOptions&) {
  return cross_entropy(path.back(), labels);
}

Tensor soft_labels(const std::vector<Tensor>& path, const std::vector<Tensor>& targets, const std::vector<int64_t>&,
                   const ObjectiveOptions& o) {
  check(o.temperature > 0, "slm: the temperature must be positive, got ", o.temperature);
  const float inverse_t = float(1.0 / o.temperature);
  const Tensor soft_targets = softmax(targets.back() * inverse_t, 1);
  const Tensor log_probabilities = log_softmax(path.back() * inverse_t, 1);
  return -mean(sum(soft_targets * log_probabilities, {1}));
}

Tensor direct_matching(const std::vector<Tensor>& path, const std::vector<Tensor>& targets,
                       const std::vector<int64_t>&, const ObjectiveOptions&) {
  return mse_loss(path.front(), targets.front());
}

// Σ over the non-batch axes of t², one value per example.
Tensor squared_norms(const Tensor& t) {
  std::vector<int64_t> axes;
  for (int64_t a = 1; a < t.dim(); ++a) axes.push_back(a);
  return sum(t * t, axes);
}

Tensor functional_latent_alignment(const std::vector<Tensor>& path, const std::vector<Tensor>& targets,
                                   const std::vector<int64_t>&, const ObjectiveOptions& o) {
  const size_t terms = path.size() - 1;  // l = j .. L−2: every element but the logits
  check(terms >= 1, "fula: the end model has no block between the stitch point and its head");
  check(o.fula_weights.empty() || o.fula_weights.size() == terms, "fula: ", o.fula_weights.size(),
        " weights given for the ", terms, " terms from the stitch point to the penultimate block");
  Tensor total;
  for (size_t l = 0; l < terms; ++l) {
    const float w = o.fula_weights.empty() ? 1.0f : float(o.fula_weights[l]);
    Tensor term;
    if (o.fula_normalise) {
      const Tensor denominator = clamp(squared_norms(targets[l]), 1e-12f, 3.0e38f);
      term = mean(squared_norms(path[l] - targets[l]) / denominator);
    } else {
      term = mse_loss(path[l], targets[l]);
    }
    term = term * w;
    total = total.defined() ? total + term : term;
  }
  return total;
}

const Objective kObjectives[] = {
    {"hlm", "hard labels: cross-entropy of the stitched model's logits with the labels", EndTargets::none,
     hard_labels},
    {"slm", "soft labels: cross-entropy between softmax(B(x)/T) and softmax(F(x)/T)", EndTargets::last,
     soft_labels},
    {"dm", "direct matching: mean squared difference to B's own features at the stitch point",
     EndTargets::first, direct_matching},
    {"fula", "functional latent alignment: B's features from the stitch point to its penultimate block, each "
             "normalised by ‖B_l(x)‖²",
     EndTargets::all, functional_latent_alignment},
};

}  // namespace

const Objective& objective(const std::string& name) {
  for (const Objective& o : kObjectives)
    if (name == o.name) return o;
  std::string names;
  for (const Objective& o : kObjectives) names += cat(names.empty() ? "" : ", ", o.name);
  throw UsageError(cat("unknown stitching objective '", name, "'; objectives: ", names));
}

std::vector<std::string> objective_names() {
  std::vector<std::string> names;
  for (const Objective& o : kObjectives) names.push_back(o.name);
  return names;
}

}  // namespace adjoint
