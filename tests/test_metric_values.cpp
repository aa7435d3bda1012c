// Every quality metric (analysis/pullbacks/metrics.h, randomisation.h, focus.h) on a case small
// enough to work out by hand, asserted to float tolerance rather than within a range.
// Where a metric draws random perturbations the case is built so that the draws cannot
// change the value: a noise range of width 1e-6 (the noise is a constant to 1e-6), patches
// that are interchangeable, or a model whose output names the subset it was given.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <set>

#include "analysis/pullbacks/focus.h"
#include "analysis/pullbacks/metrics.h"
#include "analysis/pullbacks/randomisation.h"
#include "analysis/common/statistics.h"
#include "engine/error.h"
#include "models/layers.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

// A classifier with one logit per example, logit(values of the example, their count).
Classifier one_logit(std::function<double(const float*, int64_t)> logit) {
  return [logit](const Tensor& x) {
    const Tensor xc = x.contiguous();
    const int64_t n = xc.size(0), d = xc.numel() / n;
    Tensor out = Tensor::empty({n, 1});
    for (int64_t i = 0; i < n; ++i) out.data()[i] = float(logit(xc.data() + i * d, d));
    return out;
  };
}

// f(x) = Σ w_k x_k with the given weights.
Classifier weighted_sum(std::vector<double> w) {
  return one_logit([w](const float* x, int64_t d) {
    double s = 0;
    for (int64_t k = 0; k < d; ++k) s += w[size_t(k)] * x[k];
    return s;
  });
}

// An explainer that returns, for example i, the row given for its target class.
Explainer rows_per_class(std::vector<std::vector<float>> rows) {
  return [rows](const Tensor& x, const std::vector<int64_t>& targets) {
    Tensor out = Tensor::empty(x.shape());
    const int64_t d = x.numel() / x.size(0);
    for (size_t i = 0; i < targets.size(); ++i)
      std::copy_n(rows[size_t(targets[i])].begin(), d, out.data() + int64_t(i) * d);
    return out;
  };
}

// A noise range of width 1e-6 at 0: U(lo, hi) noise is 0 to within 1e-6.
constexpr InputRange kNoiseIsZero{0.0f, 1e-6f};

}  // namespace

TEST_CASE("metric values: infidelity of a quadratic model on two pixels is 0.4") {
  // One image of two pixels x = (1, 1), f(x) = (x0 + x1)², attr = (1, 1). The noise is 0.
  // Patch of side 2: the whole image, a = ⟨attr, x − 0⟩ = 2, b = f(x) − f(0) = 4.
  // Patch of side 1 (either pixel, the draws cannot tell them apart): a = 1, b = 4 − 1 = 3.
  // Two of each: β = Σab / Σa² = 2·(8 + 3) / 2·(4 + 1) = 2.2, and the score is
  // mean (βa − b)² = ((4.4 − 4)² + (2.2 − 3)²) / 2 = (0.16 + 0.64) / 2 = 0.4.
  const Tensor x = Tensor::from_vector({1, 1, 1, 2}, {1, 1});
  const Classifier model = one_logit([](const float* v, int64_t) { return double(v[0] + v[1]) * (v[0] + v[1]); });
  InfidelityOptions options;
  options.patch_sizes = {2, 1};
  options.samples_per_size = 2;
  const InfidelityProbe probe = probe_infidelity(model, x, {0}, kNoiseIsZero, options);
  CHECK(infidelity(probe, Tensor::from_vector({1, 1, 1, 2}, {1, 1})).values[0] == doctest::Approx(0.4).epsilon(1e-4));
  // The scale of the map does not matter (β absorbs it).
  CHECK(infidelity(probe, Tensor::from_vector({1, 1, 1, 2}, {3, 3})).values[0] == doctest::Approx(0.4).epsilon(1e-4));
  // A map that is zero on every patch explains nothing: β = 0, mean b² = (16 + 9) / 2.
  CHECK(infidelity(probe, Tensor::zeros({1, 1, 1, 2})).values[0] == doctest::Approx(12.5).epsilon(1e-4));
}

TEST_CASE("metric values: max-sensitivity is ||a(x+d) - a(x)|| / ||a(x)|| in a ball scaled by the range") {
  // Range [−2, 2]: radius 0.02 of its width is r = 0.08. The explainer returns v_i, plus e_i
  // once the input has moved by more than r/2 in some element (certain in 10 samples of 16
  // elements each uniform in [−r, r]: the chance of none is 2⁻¹⁶⁰), plus 10·e_i if it moved
  // by more than r (impossible in the ball). The score is ‖e_i‖ / ‖v_i‖:
  //   example 0: v = (3, 4, 0, …), e = (0, 0, 2, 0, …): 2 / 5 = 0.4;
  //   example 1: v = (0, 0, 1, 0, …), e = (0.5, 0, …): 0.5.
  // A ball of radius 0.02 (not scaled by the width 4) never moves by r/2 and gives 0.
  const int64_t d = 16;
  const double r = 0.02 * 4.0;
  const Tensor x0 = Tensor::full({2, d}, 0.5f);
  const std::vector<std::vector<float>> v = {{3, 4}, {0, 0, 1}}, e = {{0, 0, 2}, {0.5f}};
  const Explainer explainer = [&](const Tensor& x, const std::vector<int64_t>&) {
    Tensor out = Tensor::zeros(x.shape());
    for (int64_t i = 0; i < 2; ++i) {
      double moved = 0;
      for (int64_t k = 0; k < d; ++k) moved = std::max(moved, std::fabs(double(x.data()[i * d + k]) - 0.5));
      const float weight = moved > r * 1.001 ? 11.0f : moved > r / 2 ? 1.0f : 0.0f;
      for (size_t k = 0; k < v[size_t(i)].size(); ++k) out.data()[i * d + int64_t(k)] += v[size_t(i)][k];
      for (size_t k = 0; k < e[size_t(i)].size(); ++k) out.data()[i * d + int64_t(k)] += weight * e[size_t(i)][k];
    }
    return out;
  };
  const MetricResult result = max_sensitivity(explainer, x0, {0, 0}, InputRange{-2.0f, 2.0f});
  CHECK(result.values[0] == doctest::Approx(0.4).epsilon(1e-6));
  CHECK(result.values[1] == doctest::Approx(0.5).epsilon(1e-6));
}

TEST_CASE("metric values: random logit is the Pearson (not Spearman) correlation of the two maps") {
  // Two classes, so the other class is the one not explained. Maps (1, 2, 3, 4, 5) and their
  // cubes (1, 8, 27, 64, 125): deviations (−2, −1, 0, 1, 2) and (−44, −37, −18, 19, 80),
  // Σ products 304, Σ squares 10 and 10390: r = 304 / √103900 ≈ 0.9431 (Spearman: 1).
  const Explainer explainer = rows_per_class({{1, 2, 3, 4, 5}, {1, 8, 27, 64, 125}});
  const MetricResult result = random_logit(explainer, Tensor::zeros({2, 5}), {0, 1}, 2);
  const double expected = 304.0 / std::sqrt(103900.0);
  CHECK(expected == doctest::Approx(0.94311).epsilon(1e-5));
  CHECK(result.values[0] == doctest::Approx(expected).epsilon(1e-9));
  CHECK(result.values[1] == doctest::Approx(expected).epsilon(1e-9));
}

TEST_CASE("metric values: faithfulness correlation from the subsets the probe removed") {
  // x = (1, 1, 1, 1), f(x) = x0 + 10 x1 + 100 x2 + 1000 x3, baseline 0, subsets of 2:
  // the drop f(x) − f(x with S at 0) = Σ_{k∈S} 10^k spells out S in decimal digits. The
  // score is the Pearson correlation of Σ_{k∈S} attr_k with those drops, over the subsets.
  const Tensor x = Tensor::full({1, 4}, 1.0f);
  FaithfulnessCorrelationOptions options;
  options.subsets = 20;
  options.subset_size = 2;
  const FaithfulnessCorrelationProbe probe =
      probe_faithfulness_correlation(weighted_sum({1, 10, 100, 1000}), x, {0}, options);
  const std::vector<float> attr{1, 4, 9, 16};
  std::vector<double> sums, drops;
  std::set<long> distinct;
  for (double drop : probe.output_drops) {
    const long digits = std::lround(drop);
    CHECK(double(digits) == drop);
    double sum = 0;
    int members = 0;
    for (int k = 0, place = 1; k < 4; ++k, place *= 10) {
      const long digit = digits / place % 10;
      REQUIRE((digit == 0 || digit == 1));
      if (digit == 1) sum += attr[size_t(k)], ++members;
    }
    CHECK(members == 2);
    sums.push_back(sum);
    drops.push_back(drop);
    distinct.insert(digits);
  }
  REQUIRE(distinct.size() >= 3);  // otherwise any correlation would be ±1
  const MetricResult result = faithfulness_correlation(probe, Tensor::from_vector({1, 4}, attr));
  CHECK(result.values[0] == doctest::Approx(pearson(sums, drops)).epsilon(1e-9));
  // Every subset sum of attr_k = 10^k equals its drop: exactly 1.
  CHECK(faithfulness_correlation(probe, Tensor::from_vector({1, 4}, {1, 10, 100, 1000})).values[0] ==
        doctest::Approx(1.0).epsilon(1e-9));
}

TEST_CASE("metric values: faithfulness estimate is the Pearson correlation over patches") {
  // A 2×2 image of ones, patches of one pixel, f = Σ w_k x_k with w = (1, 4, 9, 16): the
  // drops are w. attr = (1, 2, 3, 4): deviations (−1.5, −0.5, 0.5, 1.5) and
  // (−6.5, −3.5, 1.5, 8.5), Σ products 25, Σ squares 5 and 129: 25 / √645 ≈ 0.98437.
  const Tensor x = Tensor::full({1, 1, 2, 2}, 1.0f);
  FaithfulnessEstimateOptions options;
  options.patch_size = 1;
  const MetricResult result = faithfulness_estimate(weighted_sum({1, 4, 9, 16}), x, {0},
                                                    Tensor::from_vector({1, 1, 2, 2}, {1, 2, 3, 4}), options);
  CHECK(result.values[0] == doctest::Approx(25.0 / std::sqrt(645.0)).epsilon(1e-9));
}

TEST_CASE("metric values: monotonicity correlation is the Spearman correlation of |attr| with the variance") {
  // A 2×2 image of ones, f = Σ w_k x_k with w = (1, 2, 3, 4), noise 0 on one-pixel
  // patches: the mean squared change of pixel k is w_k² = (1, 4, 9, 16), ranks (1, 2, 3, 4).
  // attr = (4, −3, 1, 2): |attr| ranks (4, 3, 1, 2); deviations (1.5, 0.5, −1.5, −0.5) against
  // (−1.5, −0.5, 0.5, 1.5): −4 / 5 = −0.8. (Signed ranks (4, 1, 2, 3) would give −0.2;
  // Pearson of |attr| with (1, 4, 9, 16): −18 / √645 ≈ −0.71.)
  const Tensor x = Tensor::full({1, 1, 2, 2}, 1.0f);
  MonotonicityOptions options;
  options.patch_size = 1;
  options.samples = 3;
  const PatchProbe probe = probe_monotonicity(weighted_sum({1, 2, 3, 4}), x, {0}, kNoiseIsZero, options);
  for (size_t k = 0; k < 4; ++k) CHECK(probe.responses[k] == doctest::Approx(double((k + 1) * (k + 1))).epsilon(1e-5));
  const MetricResult result = monotonicity_correlation(probe, Tensor::from_vector({1, 1, 2, 2}, {4, -3, 1, 2}));
  CHECK(result.values[0] == doctest::Approx(-0.8).epsilon(1e-9));
}

TEST_CASE("metric values: sparseness and complexity of a four-value map") {
  // |a| = (1, 1, 2, 4): v = |a| / 4 = (0.25, 0.25, 0.5, 1) (plus Quantus's 1e-7);
  // Gini Σ(2i − 5)v_i / (4Σv) = (−3·0.25 − 0.25 + 0.5 + 3) / (4·2) = 2.5 / 8 = 0.3125.
  // Entropy of p = (1/8, 1/8, 1/4, 1/2): 2·(1/8)ln 8 + (1/4)ln 4 + (1/2)ln 2 = (7/4)·ln 2.
  const Tensor map = Tensor::from_vector({1, 4}, {-1, 1, 2, -4});
  CHECK(sparseness(map).values[0] == doctest::Approx(0.3125).epsilon(1e-6));
  CHECK(complexity(map).values[0] == doctest::Approx(1.75 * std::log(2.0)).epsilon(1e-9));
}

namespace {

// One linear layer "fc" (4 inputs, 2 classes) whose first weight row is given.
class OneLinear : public Model {
public:
  OneLinear(Generator& gen, const std::vector<float>& first_row) : Model(ModelConfig{}) {
    auto fc = register_module("fc", std::make_shared<Linear>(4, 2, true, gen));
    std::copy(first_row.begin(), first_row.end(), fc->weight.data());
    add_block("fc", [fc](const Tensor& x) { return fc->forward(x); });
  }
};

// The gradient of a linear model: the weight row of each example's target class.
Explainer weight_row(const Model& model) {
  return [&model](const Tensor& x, const std::vector<int64_t>& targets) {
    const Tensor w = model.state_dict().at("fc.weight");
    Tensor out = Tensor::empty(x.shape());
    for (size_t i = 0; i < targets.size(); ++i)
      std::copy_n(w.data() + targets[i] * 4, 4, out.data() + int64_t(i) * 4);
    return out;
  };
}

}  // namespace

TEST_CASE("metric values: randomisation is the Spearman correlation of the maps before and after") {
  // The model's row (1, −2, 3, −4); re-initialised, (1, 9, 4, 16). |maps|: ranks (1, 2, 3, 4)
  // and (1, 3, 2, 4): deviations (−1.5, −0.5, 0.5, 1.5) · (−1.5, 0.5, −0.5, 1.5) = 4, / 5 = 0.8.
  // Signed maps: ranks (3, 2, 4, 1) and (1, 3, 2, 4): −4 / 5 = −0.8.
  Generator gen(1);
  const OneLinear model(gen, {1, -2, 3, -4});
  const ModelFactory factory = [](Generator& g) { return std::make_shared<OneLinear>(g, std::vector<float>{1, 9, 4, 16}); };
  const ExplainerFactory explainer = [](const Model& m) { return weight_row(m); };
  const Tensor x = Tensor::zeros({1, 4});
  const RandomisationResult absolute = model_parameter_randomisation(model, explainer, x, {0}, {}, {}, factory);
  REQUIRE(absolute.per_layer.size() == 1);
  CHECK(absolute.per_layer[0][0] == doctest::Approx(0.8).epsilon(1e-9));
  CHECK(absolute.mean.values[0] == doctest::Approx(0.8).epsilon(1e-9));
  RandomisationOptions signed_maps;
  signed_maps.absolute = false;
  CHECK(model_parameter_randomisation(model, explainer, x, {0}, signed_maps, {}, factory).mean.values[0] ==
        doctest::Approx(-0.8).epsilon(1e-9));
}

TEST_CASE("metric values: focus is the positive mass on the target tiles over all positive mass") {
  const std::vector<int64_t> labels{0, 0, 1, 1, 2, 2};
  const Tensor pool = random_tensor({6, 2, 8, 8}, 3);
  const Mosaics mosaics = make_mosaics(pool, labels, 4, 9);
  // Per mosaic: 3 on one target quadrant, 1 on one other quadrant, −5 on the two left: the
  // quadrants are equal (4×4 pixels, 2 channels), so the score is 3 / (3 + 1) = 0.75.
  // Then 2 on both target quadrants and 1 on both others: 4 / 6.
  Tensor one_each = Tensor::empty(mosaics.images.shape()), all = Tensor::empty(mosaics.images.shape());
  for (int64_t m = 0; m < 4; ++m) {
    bool first_target = true, first_other = true;
    for (int q = 0; q < 4; ++q) {
      const bool target = mosaics.target_tiles[size_t(m)][size_t(q)];
      const float value = target ? (first_target ? 3.0f : -5.0f) : (first_other ? 1.0f : -5.0f);
      (target ? first_target : first_other) = false;
      const int64_t top = q >= 2 ? 4 : 0, left = q % 2 ? 4 : 0;
      for (int64_t c = 0; c < 2; ++c)
        for (int64_t y = 0; y < 4; ++y)
          for (int64_t xx = 0; xx < 4; ++xx) {
            const int64_t at = ((m * 2 + c) * 8 + top + y) * 8 + left + xx;
            one_each.data()[at] = value;
            all.data()[at] = target ? 2.0f : 1.0f;
          }
    }
  }
  for (double v : focus(mosaics, one_each).values) CHECK(v == doctest::Approx(0.75).epsilon(1e-9));
  for (double v : focus(mosaics, all).values) CHECK(v == doctest::Approx(4.0 / 6.0).epsilon(1e-9));
}

TEST_CASE("metric values: a mosaic is recognised where the model's top class is its target class") {
  // Four mosaics by hand, targets 2, 0, 1, 2: predictions right on the first and the last, a
  // tile's other class on the second and a class on no tile on the third: 2 of 4 recognised.
  Mosaics mosaics;
  mosaics.targets = {2, 0, 1, 2};
  mosaics.target_tiles = {{true, true, false, false}, {true, false, true, false}, {false, true, true, false},
                          {false, false, true, true}};
  mosaics.sources = {{0, 1, 2, 3}, {4, 5, 6, 7}, {0, 2, 4, 6}, {1, 3, 5, 7}};
  const std::vector<double> recognised = recognised_mosaics(mosaics, {2, 1, 7, 2});
  CHECK(recognised == std::vector<double>{1, 0, 0, 1});
  CHECK(summarize(recognised).mean == 0.5);
  CHECK_THROWS_WITH_AS(recognised_mosaics(mosaics, {2, 0, 1}), doctest::Contains("3 predictions for 4 mosaics"), Error);
}
