// The input-space optimiser (analysis/common/input_search.h) and identically represented inputs
// (analysis/stitching/iri.h): best iterate, clamping, both step rules, derangements, and a
// real IRI search on the tiny stitching pair whose distance falls far below its start.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "analysis/common/input_search.h"
#include "analysis/stitching/iri.h"
#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "tests/stitch_fixture.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

// Σ_i (x_i − c_i)² per example, for a batch (N, D) and targets c (N, D).
std::function<Tensor(const Tensor&)> squared_distance_to(const Tensor& c) {
  return [c](const Tensor& x) { return sum((x - c) * (x - c), {1}); };
}

}  // namespace

TEST_CASE("input search: the best iterate is kept, not the last") {
  // Steps of length 1 from 0 towards 2.5 visit 0, 1, 2, 3, 2, 3: the last is 3 (loss 0.25),
  // the first best 2 (loss 0.25 too, and seen first). Towards −0.4: 0, −1, 0, −1, ...: 0 stays best.
  InputSearchOptions o;
  o.steps = 5;
  o.step = 1.0f;
  o.range = {-10.0f, 10.0f};
  const InputSearchResult r =
      minimise_per_example(squared_distance_to(Tensor::from_vector({2, 1}, {2.5f, -0.4f})), Tensor::zeros({2, 1}), o);
  CHECK(r.best.to_vector() == std::vector<float>{2.0f, 0.0f});
  CHECK(r.best_loss[0] == doctest::Approx(0.25));
  CHECK(r.best_loss[1] == doctest::Approx(0.16));
  CHECK(r.start_loss[0] == doctest::Approx(6.25));
}

TEST_CASE("input search: every iterate stays in the range when clamping, and leaves it when not") {
  const Tensor target = Tensor::from_vector({1, 2}, {5.0f, -5.0f});
  InputSearchOptions o;
  o.steps = 20;
  o.step = 0.3f;
  const InputSearchResult clamped = minimise_per_example(
      [&](const Tensor& x) {
        for (float v : x.to_vector()) CHECK((v >= 0.0f && v <= 1.0f));
        return squared_distance_to(target)(x);
      },
      Tensor::full({1, 2}, 0.5f), o);
  CHECK(clamped.best.to_vector() == std::vector<float>{1.0f, 0.0f});
  o.clamp = false;
  const InputSearchResult free = minimise_per_example(squared_distance_to(target), Tensor::full({1, 2}, 0.5f), o);
  CHECK(free.best.at({0, 0}) > 1.0f);
  CHECK(free.best.at({0, 1}) < 0.0f);
}

TEST_CASE("input search: Adam converges on a quadratic; unknown rules are refused") {
  InputSearchOptions o;
  o.rule = "adam";
  o.steps = 300;
  o.step = 0.02f;
  const Tensor target = Tensor::from_vector({2, 3}, {0.2f, 0.7f, 0.4f, 0.9f, 0.1f, 0.5f});
  const InputSearchResult r = minimise_per_example(squared_distance_to(target), Tensor::full({2, 3}, 0.5f), o);
  check_close(r.best, target, 0.0, 0.02, "Adam's best iterate");
  o.rule = "lbfgs";
  CHECK_THROWS_WITH_AS(minimise_per_example(squared_distance_to(target), target, o), doctest::Contains("l2, sign, adam"),
                       UsageError);
}

TEST_CASE("IRIs: a derangement moves every index, and the quality summary reads the distances") {
  Generator gen(4);
  for (int64_t n : {2, 3, 10, 101}) {
    const std::vector<int64_t> d = derangement(n, gen);
    CHECK(std::set<int64_t>(d.begin(), d.end()).size() == size_t(n));
    for (int64_t i = 0; i < n; ++i) CHECK(d[size_t(i)] != i);
  }
  const IriQuality q = iri_quality({0.01, 0.02, 0.03, 0.04, 0.2});
  CHECK(q.median == doctest::Approx(0.03));
  CHECK(q.p90 == doctest::Approx(0.2 * 0.6 + 0.04 * 0.4));
  CHECK(q.share_below == doctest::Approx(0.8));
  CHECK(!q.poor());
  CHECK(iri_quality({0.1, 0.2}).poor());
  CHECK(default_iri_step({3, 32, 32}) == doctest::Approx(0.5));
  CHECK(default_iri_step({1, 28, 28}) == doctest::Approx(0.5 * std::sqrt(784.0 / 3072.0)));
}

TEST_CASE("IRIs: on the tiny model the relative distance falls far below its start, inside [0, 1]") {
  // A VGG-11 without BatchNorm, freshly initialised: its early features tell images apart.
  ModelConfig c = tiny_vgg_config();
  c.arch = "vgg11";
  Generator init(3);
  const Endpoint a{"A", make_model(c, init), {}, {}};
  a.model->train(false);
  // Six unlike images: noise of growing brightness with a bright bar in a different row each.
  Tensor x = random_tensor({6, 1, 16, 16}, 31, 0.0f, 0.3f);
  for (int64_t n = 0; n < 6; ++n)
    for (int64_t p = 0; p < 256; ++p) x.data()[n * 256 + p] += 0.12f * float(n) + (p / 16 == 2 * n + 2 ? 0.3f : 0.0f);
  IriOptions o;
  o.search.steps = 150;
  o.batch = 4;  // two batches, the second smaller
  int64_t reported = 0;
  const IriSet set = find_iris(a, 1, x, o, [&](int64_t done, int64_t total) {
    CHECK(total == 6);
    reported = done;
  });
  CHECK(reported == 6);
  REQUIRE(set.distance.size() == 6);
  // The starts are other images of the set, at distances of order one.
  StitchPair cut(a, 1, a, 1, {1, 16, 16});
  for (int64_t n = 0; n < 6; ++n) {
    const Tensor start = select_rows(set.starts, n, n + 1);
    bool from_other = false;
    for (int64_t m = 0; m < 6; ++m)
      if (m != n && select_rows(x, m, m + 1).to_vector() == start.to_vector()) from_other = true;
    CHECK(from_other);
  }
  NoGrad off;
  const Tensor fx = cut.front_features(x), fs = cut.front_features(set.starts), fi = cut.front_features(set.inputs);
  for (int64_t n = 0; n < 6; ++n) {
    auto norm = [&](const Tensor& t) {
      double s = 0;
      for (float v : select_rows(t, n, n + 1).to_vector()) s += double(v) * v;
      return std::sqrt(s);
    };
    const double start = norm(sub(fs, fx)) / norm(fx), achieved = norm(sub(fi, fx)) / norm(fx);
    CHECK(achieved == doctest::Approx(set.distance[size_t(n)]).epsilon(1e-3));
    CHECK(start > 0.1);
    CHECK(achieved < 0.2 * start);
  }
  for (float v : set.inputs.to_vector()) CHECK((v >= 0.0f && v <= 1.0f));
  // The soft pullback carries another cotangent through the ReLUs and max-pools: the option
  // reaches the search and changes its path.
  IriOptions soft = o;
  soft.search.transport = Transport::soft_pullback();
  const IriSet soft_set = find_iris(a, 1, x, soft);
  CHECK(soft_set.inputs.to_vector() != set.inputs.to_vector());
  CHECK(set.quality.count == 6);
  CHECK(set.quality.median < 0.05);
  CHECK_THROWS_WITH_AS(find_iris(a, 1, random_tensor({0, 1, 16, 16}, 1), o), doctest::Contains("is empty"), Error);
}
