// Model stitching (analysis/stitching_*.h): the stitch layer's shapes, resize rule,
// initialisations and gradients, and the four objectives against PyTorch goldens
// (tests/goldens/gen_stitch.py).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <string>

#include "analysis/common/robustness.h"
#include "analysis/stitching/layer.h"
#include "analysis/stitching/objectives.h"
#include "analysis/stitching/pair.h"
#include "analysis/stitching/train.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/layout.h"
#include "tests/stitch_fixture.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

std::vector<int64_t> fixture_labels() {
  std::vector<int64_t> labels;
  for (float v : golden("stitch", "labels").to_vector()) labels.push_back(int64_t(v));
  return labels;
}

}  // namespace

TEST_CASE("stitch: output shapes for equal maps, resized maps and tokens; incompatible shapes are refused") {
  Stitch same({{8, 4, 4}, {6, 4, 4}, "test"});
  CHECK(same.forward(random_tensor({2, 8, 4, 4}, 1)).shape() == Shape{2, 6, 4, 4});
  Stitch down({{8, 8, 6}, {3, 4, 3}, "test"});
  CHECK(down.forward(random_tensor({2, 8, 8, 6}, 2)).shape() == Shape{2, 3, 4, 3});
  Stitch up({{8, 2, 2}, {5, 4, 8}, "test"});
  CHECK(up.forward(random_tensor({3, 8, 2, 2}, 3)).shape() == Shape{3, 5, 4, 8});
  Stitch tokens({{17, 12}, {17, 20}, "test"});
  CHECK(tokens.forward(random_tensor({2, 17, 12}, 4)).shape() == Shape{2, 17, 20});
  CHECK_THROWS_WITH_AS(Stitch({{8, 4, 4}, {10}, "front a block 1 → end b block 2"}),
                       doctest::Contains("front a block 1 → end b block 2: cannot join front features [8, 4, 4] to "
                                         "end features [10]"),
                       Error);
  CHECK_THROWS_WITH_AS(Stitch({{17, 12}, {16, 12}, "w"}), doctest::Contains("token counts differ (17 against 16)"), Error);
  CHECK_THROWS_AS(Stitch({{10}, {10}, "w"}), Error);
  CHECK_THROWS_WITH_AS(same.forward(random_tensor({2, 8, 5, 4}, 1)), doctest::Contains("[2, 8, 5, 4]"), Error);
}

TEST_CASE("stitch: the resize rule is area averaging down and align_corners=False bilinear up") {
  // 4 → 2: windows [0, 2) and [2, 4).
  CHECK(resize_matrix(4, 2).to_vector() == std::vector<float>{0.5f, 0.5f, 0, 0, 0, 0, 0.5f, 0.5f});
  // 3 → 2: adaptive pooling's overlapping windows [0, 2) and [1, 3).
  CHECK(resize_matrix(3, 2).to_vector() == std::vector<float>{0.5f, 0.5f, 0, 0, 0.5f, 0.5f});
  // 2 → 4: source positions max(0, (i + 0.5)/2 − 0.5) = 0, 0.25, 0.75, 1 (clamped at the edge).
  CHECK(resize_matrix(2, 4).to_vector() == std::vector<float>{1, 0, 0.75f, 0.25f, 0.25f, 0.75f, 0, 1});
  // Rows sum to one, so constants survive any resize.
  const Tensor ones = resize_maps(Tensor::ones({1, 2, 3, 5}), 7, 2);
  CHECK(ones.shape() == Shape{1, 2, 7, 2});
  for (float v : ones.to_vector()) CHECK(v == doctest::Approx(1.0));
}

TEST_CASE("stitch: identity initialisation reproduces the end model when front and end are the same model") {
  const Endpoint b = stitch_fixture_model("B");
  const Tensor x = random_tensor({3, 1, 16, 16}, 7, 0.0f, 1.0f);
  NoGrad off;
  const Tensor expected = b.model->forward(b.input(x));
  for (size_t block = 0; block + 1 < b.model->num_blocks(); ++block) {
    INFO("block ", block);
    StitchPair pair(b, block, b, block, {1, 16, 16});
    Stitch s(pair.shapes());
    s.init_identity();
    check_close(pair.stitched_logits(s, x), expected, 1e-6, 1e-6, "identity-stitched logits");
  }
  Stitch wider({{4, 2, 2}, {8, 2, 2}, "w"});
  CHECK_THROWS_WITH_AS(wider.init_identity(), doctest::Contains("equal widths"), Error);
}

TEST_CASE("stitch: least squares recovers a known affine map, on maps with and without resizing, on tokens and "
          "through the map↔token adapter both ways and between token grids") {
  struct Case {
    Shape front, end;
  };
  for (const Case& c : {Case{{5, 3, 3}, {4, 3, 3}}, Case{{5, 4, 4}, {3, 2, 2}}, Case{{5, 2, 2}, {3, 4, 4}},
                        Case{{5, 6}, {5, 7}}, Case{{5, 4, 4}, {5, 3}}, Case{{3, 2, 2}, {10, 4}}, Case{{10, 4}, {3, 6, 6}},
                        Case{{17, 5}, {4, 4, 4}}, Case{{10, 4}, {5, 3}}}) {
    INFO("front ", c.front, " end ", c.end);
    Stitch truth({c.front, c.end, "truth"});
    Generator gen(3);
    truth.init_random(gen);
    truth.bias.copy_from(random_tensor(truth.bias.shape(), 9));
    Shape batch = c.front;
    batch.insert(batch.begin(), 40);
    const Tensor front = random_tensor(batch, 11);
    Tensor end;
    {
      NoGrad off;
      end = truth.forward(front).contiguous();
    }
    Stitch fitted({c.front, c.end, "fitted"});
    fitted.init_least_squares(front, end);
    check_close(fitted.weight, truth.weight, 1e-4, 1e-4, "least-squares weight");
    check_close(fitted.bias, truth.bias, 1e-4, 1e-4, "least-squares bias");
    // A ridge shrinks the weights towards zero.
    Stitch ridged({c.front, c.end, "ridged"});
    ridged.init_least_squares(front, end, 10.0);
    CHECK(max_abs(ridged.weight) < max_abs(fitted.weight));
  }
  // Two identical front channels make XᵀX singular: refused without a ridge, solved with one.
  Stitch s({{2, 2, 2}, {1, 2, 2}, "singular"});
  const Tensor one = random_tensor({10, 1, 2, 2}, 5);
  const Tensor twin = concat({one, one}, 1);
  CHECK_THROWS_WITH_AS(s.init_least_squares(twin, one), doctest::Contains("singular"), Error);
  s.init_least_squares(twin, one, 1e-3);
  CHECK(s.weight.at({0, 0}) == doctest::Approx(s.weight.at({0, 1})));
}

TEST_CASE("stitch: the least-squares ridge is λ·trace(XᵀX)/C_in on the diagonal of the centred normal equations") {
  // One output, two front channels, 1×1 maps: W solves (XᵀX + λ·tr(XᵀX)/C_in · I) W = XᵀY on
  // centred X and Y, written out here by hand (Cramer's rule) against the same rows.
  Stitch s({{2, 1, 1}, {1, 1, 1}, "ridge"});
  const std::vector<float> x = {1, 0, 2, 1, 0, 3, 4, 1, 3, 5}, y = {1, 2, 0, 5, 7};
  const Tensor front = Tensor::from_vector({5, 2, 1, 1}, x), end = Tensor::from_vector({5, 1, 1, 1}, y);
  const double lambda = 0.5;
  s.init_least_squares(front, end, lambda);
  double mx0 = 0, mx1 = 0, my = 0;
  for (int r = 0; r < 5; ++r) mx0 += x[2 * r] / 5.0, mx1 += x[2 * r + 1] / 5.0, my += y[r] / 5.0;
  double g00 = 0, g01 = 0, g11 = 0, c0 = 0, c1 = 0;
  for (int r = 0; r < 5; ++r) {
    const double a = x[2 * r] - mx0, b = x[2 * r + 1] - mx1, t = y[r] - my;
    g00 += a * a, g01 += a * b, g11 += b * b, c0 += a * t, c1 += b * t;
  }
  const double shift = lambda * (g00 + g11) / 2;  // C_in = 2
  const double d00 = g00 + shift, d11 = g11 + shift, det = d00 * d11 - g01 * g01;
  const double w0 = (c0 * d11 - g01 * c1) / det, w1 = (d00 * c1 - g01 * c0) / det;
  CHECK(s.weight.at({0, 0}) == doctest::Approx(w0).epsilon(1e-5));
  CHECK(s.weight.at({0, 1}) == doctest::Approx(w1).epsilon(1e-5));
  CHECK(s.bias.at({0}) == doctest::Approx(my - w0 * mx0 - w1 * mx1).epsilon(1e-5));
  // Without the division by C_in the shift would double here, and the weights shrink further.
  const double wrong = lambda * (g00 + g11), e00 = g00 + wrong, e11 = g11 + wrong;
  CHECK(std::abs(w0 - (c0 * e11 - g01 * c1) / (e00 * e11 - g01 * g01)) > 1e-3);
}

TEST_CASE("stitch: gradients with respect to features, weight and bias match central differences") {
  for (const Shape& end : {Shape{3, 4, 4}, Shape{3, 2, 2}, Shape{3, 6, 5}}) {
    INFO("end ", end);
    check_gradients([&](const Args& in) { return apply_stitch(in[0], in[1], in[2], end); },
                    {random_tensor({2, 4, 4, 4}, 1), random_tensor({3, 4}, 2), random_tensor({3}, 3)});
  }
  check_gradients([](const Args& in) { return apply_stitch(in[0], in[1], in[2], {5, 3}); },
                  {random_tensor({2, 5, 4}, 4), random_tensor({3, 4}, 5), random_tensor({3}, 6)});
}

TEST_CASE("stitching objectives: every loss and its gradient in the stitch match PyTorch on a tiny pair") {
  const Endpoint a = stitch_fixture_model("A"), b = stitch_fixture_model("B");
  const Tensor x = golden("stitch", "x");
  const std::vector<int64_t> labels = fixture_labels();
  for (auto [i, j] : {std::pair<size_t, size_t>{2, 2}, {0, 1}, {1, 0}}) {
    const std::string pair_name = cat("pair_", i, "_", j);
    StitchPair pair(a, i, b, j, {1, 16, 16});
    Stitch s(pair.shapes());
    s.weight.copy_from(golden("stitch", pair_name + ".weight"));
    s.bias.copy_from(golden("stitch", pair_name + ".bias"));
    Tensor front;
    {
      NoGrad off;
      front = pair.front_features(x);
    }
    const std::vector<Tensor> targets = pair.end_targets(x);
    ObjectiveOptions weighted;
    weighted.temperature = 2.0;
    weighted.fula_normalise = false;
    for (float w : golden("stitch", pair_name + ".fula_weights").to_vector()) weighted.fula_weights.push_back(w);
    for (const auto& [suffix, options] : {std::pair<std::string, ObjectiveOptions>{"", {}}, {"_t2_weighted_raw", weighted}})
      for (const std::string& name : objective_names()) {
        const std::string key = cat(pair_name, ".", name, suffix);
        INFO(key);
        const Tensor loss = objective(name).loss(pair.stitched_path(s, front), targets, labels, options);
        check_close(reshape(loss, {1}), golden("stitch", key + ".loss"), 1e-4, 1e-6, key + " loss");
        const std::vector<Tensor> g = grad(loss, {s.weight, s.bias});
        check_close(g[0], golden("stitch", key + ".grad_weight"), 1e-3, 1e-6, key + " weight gradient");
        check_close(g[1], golden("stitch", key + ".grad_bias"), 1e-3, 1e-6, key + " bias gradient");
      }
  }
  CHECK_THROWS_WITH_AS(objective("kl"), doctest::Contains("hlm, slm, dm, fula"), UsageError);
}

TEST_CASE("stitch pair: blocks out of range and models in training mode are refused with the models named") {
  const Endpoint a = stitch_fixture_model("A"), b = stitch_fixture_model("B");
  CHECK_THROWS_WITH_AS(StitchPair(a, 8, b, 2, {1, 16, 16}),
                       doctest::Contains("front block 8 is out of range for A (vgg11_bn), which has 9 blocks "
                                         "(stitch points 0..7, before the head 'head')"),
                       Error);
  CHECK_THROWS_WITH_AS(StitchPair(a, 1, b, 12, {1, 16, 16}), doctest::Contains("end block 12 is out of range for B"),
                       Error);
  b.model->train(true);
  CHECK_THROWS_WITH_AS(StitchPair(a, 1, b, 1, {1, 16, 16}), doctest::Contains("training mode"), Error);
  b.model->train(false);
}

TEST_CASE("stitch training: A and B stay bit for bit, BatchNorm buffers included, while the stitch learns") {
  // Freshly initialised models: their deep features still vary with the input.
  Generator init(8);
  const Endpoint a{"A", make_model(tiny_vgg_config(), init), {0.3f}, {0.4f}};
  const Endpoint b{"B", make_model(tiny_vgg_config(), init), {0.5f}, {0.25f}};
  a.model->train(false);
  b.model->train(false);
  std::map<std::string, std::vector<float>> before;
  for (const auto& [which, e] : {std::pair<std::string, const Endpoint*>{"A.", &a}, {"B.", &b}})
    for (const auto& [name, t] : e->model->state_dict()) before[which + name] = t.to_vector();
  REQUIRE(before.count("B.features.1.running_mean"));
  const Tensor x = random_tensor({24, 1, 16, 16}, 21, 0.0f, 1.0f);
  StitchPair pair(a, 2, b, 2, {1, 16, 16});
  // Labels the end model can reach: its own predictions.
  std::vector<int64_t> labels;
  {
    NoGrad off;
    const Tensor logits = b.model->forward(b.input(x)).contiguous();
    for (int64_t n = 0; n < 24; ++n) labels.push_back(std::max_element(logits.data() + n * 10, logits.data() + n * 10 + 10) - (logits.data() + n * 10));
  }
  const std::vector<Tensor> targets = pair.end_targets(x);
  for (const std::string& name : objective_names()) {
    INFO(name);
    Stitch s(pair.shapes());
    Generator gen(5);
    s.init_random(gen);
    auto whole_set_loss = [&] {
      NoGrad off;
      return objective(name).loss(pair.stitched_path(s, pair.front_features(x)), targets, labels, {}).item();
    };
    const double before = whole_set_loss();
    StitchTrainOptions o;
    o.objective = name;
    o.epochs = 3;
    o.batch = 8;
    o.lr = 1e-2;
    int64_t calls = 0;
    const StitchTrainResult r = train_stitch(s, pair, {x, x, labels}, o, [&](int64_t step, int64_t total, double) {
      CHECK(step == ++calls);
      CHECK(total == 9);
    });
    CHECK(r.steps == 9);
    CHECK(whole_set_loss() < before);
    // Kept after one pass or recomputed every step, A's features and B's targets are the
    // same, and so is the trained stitch.
    Stitch recomputed(pair.shapes());
    Generator same_init(5);
    recomputed.init_random(same_init);
    o.cache_bytes = 0;
    train_stitch(recomputed, pair, {x, x, labels}, o);
    check_close(recomputed.weight, s.weight, 1e-4, 1e-6, name + ": weight, recomputed against kept passes");
    check_close(recomputed.bias, s.bias, 1e-4, 1e-6, name + ": bias, recomputed against kept passes");
  }
  for (const auto& [which, e] : {std::pair<std::string, const Endpoint*>{"A.", &a}, {"B.", &b}}) {
    for (const auto& [name, t] : e->model->state_dict()) CHECK_MESSAGE(t.to_vector() == before.at(which + name), std::string(which + name));
    for (const Tensor& p : e->model->parameters()) CHECK(!p.grad().defined());
  }
}

TEST_CASE("stitch training: the identity-stitched model scores what the end model scores") {
  const Endpoint b = stitch_fixture_model("B");
  const Tensor x = random_tensor({20, 1, 16, 16}, 22, 0.0f, 1.0f);
  StitchPair pair(b, 3, b, 3, {1, 16, 16});
  Stitch s(pair.shapes());
  s.init_identity();
  std::vector<int64_t> labels;
  {
    NoGrad off;
    const Tensor logits = b.model->forward(b.input(x)).contiguous();
    for (int64_t n = 0; n < 20; ++n) {
      const float* row = logits.data() + n * 10;
      labels.push_back(n < 15 ? std::max_element(row, row + 10) - row : (std::max_element(row, row + 10) - row + 1) % 10);
    }
  }
  const auto end = [&](const Tensor& raw) { return b.model->forward(b.input(raw)); };
  const auto stitched = [&](const Tensor& raw) { return pair.stitched_logits(s, raw); };
  CHECK(accuracy(end, x, labels, 7) == doctest::Approx(0.75));
  CHECK(accuracy(stitched, x, labels, 7) == doctest::Approx(0.75));
}
