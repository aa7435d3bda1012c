// Quality metrics for explanations (analysis/pullbacks/metrics.h, randomisation.h, focus.h), each
// against a case whose value is known by hand: tiny linear classifiers f(x) = W·x, whose
// exact attributions are known, and maps whose Gini index and entropy are known.
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <set>

#include "analysis/pullbacks/focus.h"
#include "analysis/pullbacks/metrics.h"
#include "analysis/pullbacks/randomisation.h"
#include "analysis/common/statistics.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "models/layers.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/matmul.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

constexpr int64_t kN = 3, kC = 2, kH = 8, kW = 8, kD = kC * kH * kW, kClasses = 4;
const Shape kImages{kN, kC, kH, kW};

// f(x) = flatten(x) · Wᵀ with W (classes, D).
Classifier linear_classifier(const Tensor& weight) {
  return [weight](const Tensor& x) { return linear(reshape(x, {x.size(0), x.numel() / x.size(0)}), weight); };
}

// A map of x's shape built per example from row c_i of W: value(w, x) elementwise.
template <class Value>
Tensor map_from_weight(const Tensor& weight, const Tensor& x, const std::vector<int64_t>& targets, Value value) {
  const int64_t n = x.size(0), d = x.numel() / n;
  Tensor out = Tensor::empty(x.shape());
  const std::vector<float> w = weight.to_vector(), xv = x.to_vector();
  for (int64_t i = 0; i < n; ++i)
    for (int64_t k = 0; k < d; ++k) out.data()[i * d + k] = value(w[targets[i] * d + k], xv[i * d + k]);
  return out;
}

// The gradient of a linear model: attr = W[c] for every example.
Explainer gradient_of_linear(const Tensor& weight) {
  return [weight](const Tensor& x, const std::vector<int64_t>& targets) {
    return map_from_weight(weight, x, targets, [](float w, float) { return w; });
  };
}

// Input × gradient of a linear model: attr_i = w_i x_i, exact for a zero baseline.
Explainer input_times_gradient_of_linear(const Tensor& weight) {
  return [weight](const Tensor& x, const std::vector<int64_t>& targets) {
    return map_from_weight(weight, x, targets, [](float w, float xv) { return w * xv; });
  };
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double e : v) m = std::max(m, std::fabs(e));
  return m;
}

const std::vector<int64_t> kTargets{0, 2, 3};

}  // namespace

TEST_CASE("metrics: pearson and spearman against hand values, ties included") {
  const std::vector<double> a{1, 2, 3, 4, 5}, b{2, 4, 5, 4, 5};
  // Deviations (−2,−1,0,1,2) and (−2,0,1,0,1): 6 / √(10·6).
  CHECK(pearson(a, b) == doctest::Approx(6.0 / std::sqrt(60.0)).epsilon(1e-12));
  // Ranks of b with ties averaged: (1, 2.5, 4.5, 2.5, 4.5); Pearson with 1..5 = 7/√90.
  CHECK(average_ranks(b) == std::vector<double>{1, 2.5, 4.5, 2.5, 4.5});
  CHECK(spearman(a, b) == doctest::Approx(7.0 / std::sqrt(90.0)).epsilon(1e-12));
  CHECK(average_ranks(std::vector<double>{3, 1, 3, 2}) == std::vector<double>{3.5, 1, 3.5, 2});
  // Monotone but not linear: Spearman 1, Pearson below 1.
  const std::vector<double> cube{1, 8, 27, 64, 125};
  CHECK(spearman(a, cube) == doctest::Approx(1.0));
  CHECK(pearson(a, cube) < 0.99);
  CHECK(pearson(a, std::vector<double>{5, 4, 3, 2, 1}) == doctest::Approx(-1.0));
  CHECK(std::isnan(pearson(a, std::vector<double>{0.1, 0.1, 0.1, 0.1, 0.1})));
  CHECK(std::isnan(spearman(a, std::vector<double>{2, 2, 2, 2, 2})));
  CHECK_THROWS_WITH_AS(pearson(a, std::vector<double>{1, 2}), doctest::Contains("pearson: inputs of different lengths"),
                       Error);
}

TEST_CASE("metrics: summary gives the mean, the sample std and Student's t interval") {
  CHECK(student_t_quantile(0.975, 1) == doctest::Approx(12.7062047362).epsilon(1e-8));
  CHECK(student_t_quantile(0.975, 4) == doctest::Approx(2.7764451052).epsilon(1e-8));
  CHECK(student_t_quantile(0.975, 30) == doctest::Approx(2.0422724563).epsilon(1e-8));
  CHECK(student_t_quantile(0.975, 1e7) == doctest::Approx(1.9599640).epsilon(1e-6));
  CHECK(student_t_quantile(0.025, 4) == doctest::Approx(-2.7764451052).epsilon(1e-8));

  const double nan = std::numeric_limits<double>::quiet_NaN();
  const Summary s = summarize(std::vector<double>{1, 2, nan, 3, 4, 5});
  CHECK(s.count == 5);
  CHECK(s.undefined == 1);
  CHECK(s.mean == doctest::Approx(3.0));
  CHECK(s.std == doctest::Approx(std::sqrt(2.5)));
  const double half = 2.7764451052 * std::sqrt(2.5) / std::sqrt(5.0);
  CHECK(s.ci_low == doctest::Approx(3.0 - half).epsilon(1e-8));
  CHECK(s.ci_high == doctest::Approx(3.0 + half).epsilon(1e-8));
  CHECK(std::isnan(summarize(std::vector<double>{1.0}).std));
}

TEST_CASE("metrics: every metric states its direction") {
  CHECK_FALSE(metric_info("infidelity").higher_is_better);
  CHECK_FALSE(metric_info("max_sensitivity").higher_is_better);
  CHECK_FALSE(metric_info("random_logit").higher_is_better);
  CHECK(metric_info("faithfulness_correlation").higher_is_better);
  CHECK(metric_info("faithfulness_estimate").higher_is_better);
  CHECK(metric_info("monotonicity_correlation").higher_is_better);
  CHECK(metric_info("sparseness").higher_is_better);
  CHECK_FALSE(metric_info("complexity").higher_is_better);
  CHECK_FALSE(metric_info("model_parameter_randomisation").higher_is_better);
  CHECK(metric_info("focus").higher_is_better);
  CHECK(metric_catalogue().size() == 10);
  CHECK(metric_info("focus").direction() == "higher is better");
  CHECK_THROWS_WITH_AS(metric_info("accuracy"), doctest::Contains("unknown metric 'accuracy'; known: infidelity"),
                       Error);
}

TEST_CASE("metrics: sparseness is Quantus's Gini index of |attr|") {
  const int64_t d = 64;
  Tensor one_hot = Tensor::zeros({2, d});
  one_hot.data()[5] = -3.0f;   // the sign does not matter
  one_hot.data()[d + 0] = 0.5f;
  const MetricResult r = sparseness(one_hot);
  CHECK(r.info.higher_is_better);
  // Exactly (d−1)/(d(1 + d·1e-7)) with Quantus's 1e-7 added to every value.
  CHECK(r.values[0] == doctest::Approx(double(d - 1) / d).epsilon(1e-5));
  CHECK(r.values[1] == doctest::Approx(double(d - 1) / d).epsilon(1e-5));
  CHECK(sparseness(Tensor::full({1, d}, 0.7f)).values[0] == doctest::Approx(0.0).epsilon(1e-12));
  // |a| = (0, 1, 2, 3) → v = (0, 1/3, 2/3, 1): Σ(2i−5)v_i / (4Σv) = (10/3) / 8.
  CHECK(sparseness(Tensor::from_vector({1, 4}, {0, -1, 2, 3})).values[0] == doctest::Approx(10.0 / 24).epsilon(1e-5));
  // As Quantus: a zero map becomes uniform after its 1e-7.
  CHECK(sparseness(Tensor::zeros({1, d})).values[0] == doctest::Approx(0.0).epsilon(1e-12));
}

TEST_CASE("metrics: complexity is the entropy of |attr| / sum |attr|") {
  const int64_t d = 50;
  const MetricResult uniform_map = complexity(Tensor::full({2, 5, 10}, -2.0f));
  CHECK_FALSE(uniform_map.info.higher_is_better);
  CHECK(uniform_map.values[0] == doctest::Approx(std::log(double(d))));
  Tensor one_hot = Tensor::zeros({1, d});
  one_hot.data()[7] = 4.0f;
  CHECK(complexity(one_hot).values[0] == doctest::Approx(0.0));
  // p = (1/4, 1/4, 1/2).
  CHECK(complexity(Tensor::from_vector({1, 3}, {1, -1, 2})).values[0] ==
        doctest::Approx(0.5 * std::log(4.0) + 0.5 * std::log(2.0)));
  CHECK(std::isnan(complexity(Tensor::zeros({1, d})).values[0]));
}

TEST_CASE("metrics: infidelity is 0 for the gradient of a linear model and positive for a wrong map") {
  const Tensor weight = random_tensor({kClasses, kD}, 1);
  const Tensor x = random_tensor(kImages, 2);
  const Classifier model = linear_classifier(weight);
  const InputRange range{-1.0f, 1.0f};

  InfidelityOptions options;
  options.seed = 7;
  const InfidelityProbe probe = probe_infidelity(model, x, kTargets, range, options);
  CHECK(probe.options.patch_sizes == std::vector<int64_t>{4, 2});  // {H/2, H/4}
  CHECK(probe.samples() == 10);

  // b = ⟨w, x − x_pert⟩ = a exactly, so β = 1 and every error is rounding.
  const Tensor gradient = gradient_of_linear(weight)(x, kTargets);
  const MetricResult exact = infidelity(probe, gradient);
  CHECK_FALSE(exact.info.higher_is_better);
  CHECK(max_abs(exact.values) < 1e-9);
  // Twice the gradient is as good: β absorbs the scale.
  CHECK(max_abs(infidelity(probe, mul_scalar(gradient, 2.0f)).values) < 1e-9);
  const MetricResult wrong = infidelity(probe, random_tensor(kImages, 3));
  for (double v : wrong.values) CHECK(v > 1e-3);

  // The one-shot form and a batch split give the same perturbations, hence the same scores.
  CHECK(infidelity(model, x, kTargets, random_tensor(kImages, 3), range, options).values == wrong.values);
  InfidelityOptions tail = options;
  tail.first_example = 1;
  const Tensor x_tail = slice(x, 0, 1, 3).contiguous();
  const Tensor attr_tail = slice(random_tensor(kImages, 3), 0, 1, 3).contiguous();
  const MetricResult split = infidelity(model, x_tail, {2, 3}, attr_tail, range, tail);
  // Equal up to the GEMM's rounding, which may depend on the batch's row count.
  CHECK(split.values[0] == doctest::Approx(wrong.values[1]).epsilon(1e-5));
  CHECK(split.values[1] == doctest::Approx(wrong.values[2]).epsilon(1e-5));

  // The draws are keyed per example and sample, so the thread count changes nothing.
  const int threads = num_threads();
  set_num_threads(1);
  const std::vector<double> one_thread = probe_infidelity(model, x, kTargets, range, options).output_drops;
  set_num_threads(threads);
  CHECK(one_thread == probe.output_drops);

  options.samples_per_size = 25;  // ≥ 50 perturbations per image (docs/methods.md §1.4)
  CHECK(probe_infidelity(model, x, kTargets, range, options).output_drops.size() == size_t(kN * 50));
}

TEST_CASE("metrics: max-sensitivity is 0 for an explainer that ignores x") {
  const Tensor weight = random_tensor({kClasses, kD}, 4);
  const Tensor x = random_tensor(kImages, 5);
  const MetricResult constant = max_sensitivity(gradient_of_linear(weight), x, kTargets, {});
  CHECK_FALSE(constant.info.higher_is_better);
  CHECK(constant.values == std::vector<double>(kN, 0.0));
  // Input × gradient moves with x: ‖w ⊙ δ‖ / ‖w ⊙ x‖ is small but positive.
  MaxSensitivityOptions options;
  options.samples = 4;
  const MetricResult moving = max_sensitivity(input_times_gradient_of_linear(weight), x, kTargets, {}, options);
  for (double v : moving.values) {
    CHECK(v > 1e-3);
    CHECK(v < 0.2);
  }
  // A larger ball moves it more.
  options.radius = 0.2;
  const MetricResult wide = max_sensitivity(input_times_gradient_of_linear(weight), x, kTargets, {}, options);
  for (int64_t i = 0; i < kN; ++i) CHECK(wide.values[i] > moving.values[i]);
  const Explainer zero = [](const Tensor& in, const std::vector<int64_t>&) { return Tensor::zeros(in.shape()); };
  CHECK(std::isnan(max_sensitivity(zero, x, kTargets, {}).values[0]));
}

TEST_CASE("metrics: random logit is 1 for an explainer blind to the class") {
  const Tensor weight = random_tensor({kClasses, kD}, 6);
  const Tensor x = random_tensor(kImages, 7);
  const Explainer blind = [](const Tensor& in, const std::vector<int64_t>&) { return in.clone(); };
  const MetricResult same = random_logit(blind, x, kTargets, kClasses);
  CHECK_FALSE(same.info.higher_is_better);
  for (double v : same.values) CHECK(v == doctest::Approx(1.0));
  // Rows of a random W are nearly uncorrelated.
  for (double v : random_logit(gradient_of_linear(weight), x, kTargets, kClasses).values) CHECK(std::fabs(v) < 0.5);
  // The other class is uniform over the classes but the target.
  std::vector<int> seen(kClasses, 0);
  for (int64_t example = 0; example < 400; ++example) {
    const int64_t other = random_other_class(1, kClasses, 3, example);
    REQUIRE(other != 1);
    ++seen[static_cast<size_t>(other)];
  }
  CHECK(seen[0] > 100);
  CHECK(seen[2] > 100);
  CHECK(seen[3] > 100);
}

TEST_CASE("metrics: faithfulness correlation is 1 for the exact attribution of a linear model") {
  const Tensor weight = random_tensor({kClasses, kD}, 8);
  const Tensor x = random_tensor(kImages, 9);
  const Classifier model = linear_classifier(weight);
  const FaithfulnessCorrelationProbe probe = probe_faithfulness_correlation(model, x, kTargets);
  CHECK(probe.options.subset_size == 13);  // 10% of 128 features
  // With baseline 0 the drop is Σ_{i∈S} w_i x_i: the subset sum of attr_i = w_i x_i.
  const MetricResult exact = faithfulness_correlation(probe, input_times_gradient_of_linear(weight)(x, kTargets));
  CHECK(exact.info.higher_is_better);
  for (double v : exact.values) CHECK(v == doctest::Approx(1.0).epsilon(1e-5));
  // The plain gradient ignores x's values: a weaker, still positive correlation.
  for (double v : faithfulness_correlation(probe, gradient_of_linear(weight)(x, kTargets)).values) CHECK(v < 0.95);
}

TEST_CASE("metrics: faithfulness estimate and monotonicity on patches of a linear model") {
  const Tensor x = random_tensor(kImages, 10);
  // Weights on two of the 16 patches (2×2): large on patch 0, small on patch 5.
  Tensor weight = Tensor::zeros({kClasses, kD});
  for (int64_t c = 0; c < kClasses; ++c)
    for (int64_t ch = 0; ch < kC; ++ch)
      for (int64_t y = 0; y < 2; ++y)
        for (int64_t xx = 0; xx < 2; ++xx) {
          weight.data()[c * kD + (ch * kH + y) * kW + xx] = 3.0f;                  // patch 0
          weight.data()[c * kD + (ch * kH + 2 + y) * kW + 2 + xx] = 0.1f * (c + 1);  // patch 5
        }
  const Classifier model = linear_classifier(weight);

  FaithfulnessEstimateOptions estimate;
  estimate.patch_size = 2;
  const Tensor exact = input_times_gradient_of_linear(weight)(x, kTargets);
  const MetricResult faithful = faithfulness_estimate(model, x, kTargets, exact, estimate);
  CHECK(faithful.info.higher_is_better);
  for (double v : faithful.values) CHECK(v == doctest::Approx(1.0).epsilon(1e-5));

  MonotonicityOptions options;
  options.patch_size = 2;
  const PatchProbe probe = probe_monotonicity(model, x, kTargets, {}, options);
  CHECK(probe.responses.size() == size_t(kN * 16));
  // |attr| ranks patch 0 over patch 5 over the rest, as the logit's variance does.
  const Tensor magnitude = gradient_of_linear(weight)(x, kTargets);
  const MetricResult monotone = monotonicity_correlation(probe, magnitude);
  CHECK(monotone.info.higher_is_better);
  for (double v : monotone.values) CHECK(v == doctest::Approx(1.0));
  // Swapping the two patches' importance swaps the top two ranks of 16 (14 tied at 0, rank
  // 7.5): rank deviations (−1 ×14, 6.5, 7.5) against (−1 ×14, 7.5, 6.5) give 111.5 / 112.5.
  Tensor swapped = magnitude.clone();
  for (int64_t i = 0; i < kN * kD; ++i) {
    float& v = swapped.data()[i];
    v = v == 3.0f ? 0.05f : v > 0 ? 3.0f : 0.0f;
  }
  for (double v : monotonicity_correlation(probe, swapped).values) CHECK(v == doctest::Approx(111.5 / 112.5));

  CHECK_THROWS_WITH_AS(faithfulness_estimate(probe, exact), doctest::Contains("probe was made for monotonicity"), Error);
}

TEST_CASE("metrics: patch grid covers the image, cutting the last patches short") {
  const std::vector<Patch> grid = patch_grid(5, 7, 3);
  REQUIRE(grid.size() == 6);
  CHECK(grid[2].left == 6);
  CHECK(grid[2].width == 1);
  CHECK(grid[5].top == 3);
  CHECK(grid[5].height == 2);
}

TEST_CASE("metrics: bad inputs name the metric and the shapes") {
  const Tensor weight = random_tensor({kClasses, kD}, 11);
  const Tensor x = random_tensor(kImages, 12);
  const Classifier model = linear_classifier(weight);
  const InfidelityProbe probe = probe_infidelity(model, x, kTargets, {});
  CHECK_THROWS_WITH_AS(infidelity(probe, Tensor::zeros({3, 2, 8, 4})),
                       doctest::Contains("infidelity: attribution [3, 2, 8, 4] does not have the input's shape [3, 2, 8, 8]"),
                       Error);
  CHECK_THROWS_WITH_AS(probe_infidelity(model, Tensor::zeros({3, 128}), kTargets, {}),
                       doctest::Contains("infidelity: needs images (N, C, H, W), x is [3, 128]"), Error);
  CHECK_THROWS_WITH_AS(probe_faithfulness_correlation(model, x, {0, 1}),
                       doctest::Contains("faithfulness_correlation: 2 target classes for a batch of 3 examples"), Error);
  CHECK_THROWS_WITH_AS(probe_faithfulness_estimate(model, x, {0, 1, 9}),
                       doctest::Contains("target class 9 is outside the classifier's 4 classes"), Error);
  CHECK_THROWS_WITH_AS(random_logit(gradient_of_linear(weight), x, kTargets, 1),
                       doctest::Contains("random_logit: needs at least 2 classes"), Error);
}

TEST_CASE("metrics: focus is 1 for maps on the target tiles and 1/2 for uniform maps") {
  // Six constant images: image p holds the value p everywhere, so each quadrant of a
  // mosaic (a downscaled constant) shows which pool image it came from.
  const std::vector<int64_t> labels{0, 0, 1, 1, 2, 2};
  Tensor pool = Tensor::empty({6, 3, 8, 8});
  for (int64_t p = 0; p < 6; ++p)
    std::fill_n(pool.data() + p * 192, 192, static_cast<float>(p));
  const Mosaics mosaics = make_mosaics(pool, labels, 8, 5);
  REQUIRE(mosaics.images.shape() == Shape{8, 3, 8, 8});
  Tensor on_target = Tensor::zeros(mosaics.images.shape());
  for (int64_t m = 0; m < 8; ++m) {
    int targets_seen = 0;
    std::set<int64_t> other_labels;
    for (int q = 0; q < 4; ++q) {
      const int64_t source = mosaics.sources[m][q];
      const int64_t top = q >= 2 ? 4 : 0, left = q % 2 ? 4 : 0;
      CHECK(mosaics.images.at({m, 1, top + 1, left + 2}) == static_cast<float>(source));
      if (mosaics.target_tiles[m][q]) {
        ++targets_seen;
        CHECK(labels[source] == mosaics.targets[m]);
        for (int64_t c = 0; c < 3; ++c)
          for (int64_t y = 0; y < 4; ++y)
            for (int64_t x = 0; x < 4; ++x) on_target.data()[((m * 3 + c) * 8 + top + y) * 8 + left + x] = 1.0f;
      } else {
        CHECK(labels[source] != mosaics.targets[m]);
        other_labels.insert(labels[source]);
      }
    }
    CHECK(targets_seen == 2);
    CHECK(mosaics.sources[m][0] != mosaics.sources[m][1]);
    CHECK(other_labels.size() == 2);  // the pool has three classes: the others differ
  }
  const MetricResult all_in = focus(mosaics, on_target);
  CHECK(all_in.info.higher_is_better);
  CHECK(all_in.values == std::vector<double>(8, 1.0));
  // Negative values count for nothing.
  CHECK(focus(mosaics, on_target - 0.5f).values == std::vector<double>(8, 1.0));
  for (double v : focus(mosaics, Tensor::full(mosaics.images.shape(), 2.0f)).values) CHECK(v == doctest::Approx(0.5));
  // Mosaic m depends on the seed and m only.
  const Mosaics fewer = make_mosaics(pool, labels, 3, 5);
  CHECK(fewer.sources == std::vector<std::array<int64_t, 4>>(mosaics.sources.begin(), mosaics.sources.begin() + 3));
  CHECK_THROWS_WITH_AS(make_mosaics(pool, {0, 1, 2, 3, 4, 5}, 2, 0), doctest::Contains("at least two images"), Error);
}

namespace {

// Two linear layers without a non-linearity: the gradient is W1ᵀ W2[c], independent of x.
class TwoLinear : public Model {
public:
  explicit TwoLinear(Generator& gen) : Model(ModelConfig{}) {
    auto fc1 = register_module("fc1", std::make_shared<Linear>(kD, 6, true, gen));
    auto fc2 = register_module("fc2", std::make_shared<Linear>(6, kClasses, true, gen));
    add_block("fc1", [fc1](const Tensor& x) { return fc1->forward(flatten(x, 1)); });
    add_block("fc2", [fc2](const Tensor& x) { return fc2->forward(x); });
  }
};

Explainer gradient_of(const Model& model) {
  return [&model](const Tensor& x, const std::vector<int64_t>& targets) {
    Tensor input = x.detach().clone();
    input.requires_grad_();
    const Tensor logits = model.forward(input);
    Tensor u = Tensor::zeros(logits.shape());
    for (size_t i = 0; i < targets.size(); ++i) u.data()[i * kClasses + targets[i]] = 1.0f;
    return grad(logits, {input}, u)[0];
  };
}

}  // namespace

TEST_CASE("metrics: model-parameter randomisation, top-down and cumulative") {
  Generator gen(3);
  const auto model = std::make_shared<TwoLinear>(gen);
  const ModelFactory factory = [](Generator& g) { return std::make_shared<TwoLinear>(g); };
  const Tensor x = random_tensor(kImages, 13);
  CHECK(layers_top_down(*model) == std::vector<std::string>{"fc2", "fc1"});
  const std::vector<float> before = model->state_dict().at("fc1.weight").to_vector();

  // An explainer that never reads the parameters cannot tell the models apart.
  const ExplainerFactory blind = [](const Model&) {
    return Explainer([](const Tensor& in, const std::vector<int64_t>&) { return in.clone(); });
  };
  const RandomisationResult same = model_parameter_randomisation(*model, blind, x, kTargets, {}, {}, factory);
  CHECK(same.layers == std::vector<std::string>{"fc2", "fc1"});
  REQUIRE(same.per_layer.size() == 2);
  CHECK_FALSE(same.mean.info.higher_is_better);
  for (double v : same.mean.values) CHECK(v == doctest::Approx(1.0));
  for (double v : same.curve()) CHECK(v == doctest::Approx(1.0));

  // The gradient changes as soon as the head is re-initialised.
  const ExplainerFactory gradient = [](const Model& m) { return gradient_of(m); };
  const RandomisationResult sensitive = model_parameter_randomisation(*model, gradient, x, kTargets, {}, {}, factory);
  for (const auto& step : sensitive.per_layer)
    for (double v : step) CHECK(v < 0.9);
  for (double v : sensitive.mean.values) CHECK(v < 0.9);
  CHECK(model->state_dict().at("fc1.weight").to_vector() == before);  // the model keeps its weights

  RandomisationOptions head_only;
  head_only.max_layers = 1;
  head_only.absolute = false;
  const RandomisationResult one = model_parameter_randomisation(*model, gradient, x, kTargets, head_only, {}, factory);
  CHECK(one.layers == std::vector<std::string>{"fc2"});
  CHECK(one.per_layer.size() == 1);
}
