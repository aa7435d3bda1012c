// The tensor-similarity paper's LM layout (models/paper_lm.h): random weights written in that
// layout by tests/goldens/gen_paper_lm.py, whose logits come from a PyTorch forward of the
// architecture written in the script; the view's polynomial must give the same logits. Then
// the routes: sampled with an interval, refused by name where a route does not take QK
// biases or rotary positions.
#include <doctest/doctest.h>

#include <cmath>

#include "analysis/similarity/monte_carlo.h"
#include "analysis/similarity/network_tensor.h"
#include "analysis/similarity/second_moment.h"
#include "engine/error.h"
#include "models/paper_lm.h"
#include "tests/support.h"

using namespace adjoint;
using adjoint::testing::fixture;
using adjoint::testing::golden;

TEST_CASE("paper LM: the view read by parameter names gives PyTorch's logits") {
  const SafetensorsFile& weights = fixture("paper_lm");
  const int64_t heads = std::stoll(weights.metadata.at("heads"));
  const Tensor tokens = golden("paper_lm_logits", "tokens"), logits = golden("paper_lm_logits", "logits");
  const int64_t batch = tokens.size(0), T = tokens.size(1), vocab = logits.size(2);
  const PolynomialView v = paper_lm_view(weights.tensors, {heads, 0.35}, T, "paper_lm.safetensors");
  CHECK(v.steps.size() == 4);  // embedding, 2 attention layers, unembedding
  std::vector<double> x(size_t(batch * T * vocab), 0.0);
  const std::vector<float> ids = tokens.to_vector();
  for (size_t i = 0; i < ids.size(); ++i) x[i * size_t(vocab) + size_t(ids[i])] = 1.0;
  const std::vector<double> ours = evaluate_polynomial(v, x, batch);
  const std::vector<float> theirs = logits.to_vector();
  REQUIRE(ours.size() == theirs.size());
  double worst = 0, largest = 0;
  for (size_t i = 0; i < ours.size(); ++i)
    worst = std::max(worst, std::abs(ours[i] - double(theirs[i]))), largest = std::max(largest, std::abs(double(theirs[i])));
  MESSAGE("largest logit ", largest, ", worst difference ", worst);
  CHECK(largest > 0.1);
  CHECK(worst <= 1e-5 * largest);
}

TEST_CASE("paper LM: compared by sampling with an interval; routes that do not take its attention refuse by name") {
  const SafetensorsFile& weights = fixture("paper_lm");
  const PolynomialView a = paper_lm_view(weights.tensors, {2, 0.35}, 4, "paper_lm.safetensors");
  std::map<std::string, Tensor> other = weights.tensors;
  std::vector<float> halved = other["layers.1.o.weight"].to_vector();
  for (float& w : halved) w *= 0.5f;
  other["layers.1.o.weight"] = Tensor::from_vector({8, 8}, halved);
  const PolynomialView b = paper_lm_view(other, {2, 0.35}, 4, "other.safetensors");
  MonteCarloPlan plan;
  plan.tolerance = 0.01, plan.input_std = 1 / std::sqrt(11.0);
  plan.tempering = false;  // its marked estimate would be tempered, at a minute's cost; the route is tested here
  const MonteCarloSimilarity mc = monte_carlo_sized(a, b, plan);
  CHECK(std::isfinite(mc.similarity));
  CHECK(mc.similarity_se <= 0.01);
  CHECK(mc.similarity > 0.5);  // one layer's output halved: still much alike
  CHECK_THROWS_WITH_AS(network_tensor_inner(a, b), doctest::Contains("'layers.0.attention' has QK biases or rotary"), Error);
  CHECK_THROWS_WITH_AS(deep_similarity(a, b), doctest::Contains("QK biases or rotary positions"), Error);
  // A missing or misshapen tensor is named.
  std::map<std::string, Tensor> broken = weights.tensors;
  broken.erase("layers.1.k2.bias");
  CHECK_THROWS_WITH_AS(paper_lm_view(broken, {2, 0.35}, 4, "broken.safetensors"),
                       doctest::Contains("broken.safetensors: no tensor 'layers.1.k2.bias'"), Error);
  broken = weights.tensors;
  broken["layers.0.o.weight"] = Tensor::zeros({8, 7});
  CHECK_THROWS_WITH_AS(paper_lm_view(broken, {2, 0.35}, 4, "broken.safetensors"), doctest::Contains("'layers.0.o.weight' has shape"),
                       Error);
  CHECK_THROWS_WITH_AS(paper_lm_view(weights.tensors, {3, 0.35}, 4, "paper_lm.safetensors"), doctest::Contains("3 heads"), Error);
}
