// Reductions: gradients, PyTorch goldens, determinism and accuracy, max routing, bad input.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/lane_sum.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "ops/elementwise.h"
#include "ops/reduce.h"
#include "tests/math_golden.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

// Distinct values at least 0.1 apart in a shuffled order: no near-ties for max.
Tensor separated(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  const std::vector<int64_t> order = permutation(numel(shape), gen);
  std::vector<float> v;
  for (int64_t k : order) v.push_back(0.1f * float(k) - 1.0f);
  return Tensor::from_vector(shape, v);
}

// Σ over axis `axis` of a [outer, count, inner] tensor, in double, the obvious way.
std::vector<double> reference_sum(const std::vector<float>& x, int64_t outer, int64_t count, int64_t inner) {
  std::vector<double> out(size_t(outer * inner), 0.0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t r = 0; r < count; ++r)
      for (int64_t j = 0; j < inner; ++j) out[o * inner + j] += x[(o * count + r) * inner + j];
  return out;
}
}  // namespace

TEST_CASE("lane sums: the row maximum and sums in lanes, for every length around the lanes' width") {
  // Lengths 1..20 cover no full lane group, one, two, and every tail; the maximum is put at
  // each position in turn (tail included), far above the rest.
  for (int64_t n = 1; n <= 20; ++n) {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float((i * 7) % 5) - 2.0f;  // small integers: exact sums
    const double sum = std::accumulate(x.begin(), x.end(), 0.0);
    CHECK(lane_sum(n, [&](int64_t i) { return x[size_t(i)]; }) == sum);
    const auto [a, b] = lane_sums(
        n, [&](int64_t i) { return x[size_t(i)]; }, [&](int64_t i) { return 2 * x[size_t(i)] + 1; });
    CHECK(a == sum);
    CHECK(b == 2 * sum + double(n));
    for (int64_t at = 0; at < n; ++at) {
      std::vector<float> y = x;
      y[size_t(at)] = 100.0f + float(at);
      CAPTURE(n);
      CAPTURE(at);
      CHECK(lane_max(y.data(), n) == *std::max_element(y.begin(), y.end()));
    }
  }
  CHECK(lane_max(nullptr, 0) == -INFINITY);
}

TEST_CASE("reduce: gradients match central differences") {
  const Tensor x = random_tensor({2, 3, 4}, 21);
  for (const std::vector<int64_t>& axes :
       std::vector<std::vector<int64_t>>{{}, {0}, {1}, {2}, {0, 1}, {0, 2}, {-1, 1}}) {
    for (bool keepdim : {false, true}) {
      INFO("axes of size ", axes.size(), " first ", axes.empty() ? 99 : axes[0], " keepdim ", keepdim);
      check_gradients([&](const Args& v) { return sum(v[0], axes, keepdim); }, {x});
      check_gradients([&](const Args& v) { return mean(v[0], axes, keepdim); }, {x});
      check_gradients([&](const Args& v) { return var(v[0], axes, true, keepdim); }, {x});
      check_gradients([&](const Args& v) { return var(v[0], axes, false, keepdim); }, {x});
      check_gradients([&](const Args& v) { return max(v[0], axes, keepdim); }, {separated({2, 3, 4}, 22)});
    }
  }
}

TEST_CASE("reduce: forward and cotangents match PyTorch") {
  auto one = [](auto op) { return [op](const Args& v) { return op(v[0]); }; };
  check_math_case("sum_all", {"x"}, one([](const Tensor& x) { return sum(x); }));
  check_math_case("sum_last", {"x"}, one([](const Tensor& x) { return sum(x, {2}); }));
  check_math_case("sum_lead", {"x"}, one([](const Tensor& x) { return sum(x, {0, 1}); }));
  check_math_case("sum_mid_keep", {"x"}, one([](const Tensor& x) { return sum(x, {1}, true); }));
  check_math_case("sum_split_keep", {"x"}, one([](const Tensor& x) { return sum(x, {0, 2}, true); }));
  check_math_case("mean_all", {"x"}, one([](const Tensor& x) { return mean(x); }));
  check_math_case("mean_split", {"x"}, one([](const Tensor& x) { return mean(x, {0, 2}); }));
  check_math_case("mean_last_keep", {"x"}, one([](const Tensor& x) { return mean(x, {-1}, true); }));
  check_math_case("max_mid", {"x"}, one([](const Tensor& x) { return max(x, {1}); }));
  check_math_case("max_split_keep", {"x"}, one([](const Tensor& x) { return max(x, {0, 2}, true); }));
  check_math_case("max_all", {"x"}, one([](const Tensor& x) { return max(x); }));
  check_math_case("var_last", {"x"}, one([](const Tensor& x) { return var(x, {2}); }));
  check_math_case("var_split_biased_keep", {"x"}, one([](const Tensor& x) { return var(x, {0, 2}, false, true); }));
  check_math_case("var_all", {"x"}, one([](const Tensor& x) { return var(x); }));
}

TEST_CASE("reduce: max routes to the first maximum, softly under SoftPullback") {
  // Ties: the first maximal element in row-major order over the reduced axes.
  const Tensor x = Tensor::from_vector({2, 4}, {1, 3, 3, 2, /**/ 5, 5, 5, 5});
  const Tensor u = Tensor::from_vector({2}, {10, 20});
  auto f = [](const Args& v) { return max(v[0], {1}); };
  CHECK(max(x, {1}).to_vector() == std::vector<float>{3, 5});
  const std::vector<float> routed{0, 10, 0, 0, 20, 0, 0, 0};
  CHECK(vjp(f, {x}, u, Transport::gradient())[0].to_vector() == routed);
  CHECK(vjp(f, {x}, u, Transport::pullback())[0].to_vector() == routed);
  // Over several axes, "first" is row-major over them: (0, 1) before (1, 0).
  const Tensor y = Tensor::from_vector({2, 2}, {0, 7, 7, 1});
  CHECK(vjp([](const Args& v) { return max(v[0]); }, {y}, Tensor::scalar(1))[0].to_vector() ==
        std::vector<float>{0, 1, 0, 0});
  // A NaN is the maximum.
  const Tensor n = Tensor::from_vector({3}, {1, NAN, 2});
  CHECK(std::isnan(max(n).item()));
  CHECK(vjp([](const Args& v) { return max(v[0]); }, {n}, Tensor::scalar(1))[0].to_vector()[1] == 1.0f);

  // SoftPullback: u spread with softmax(x/τ) over the reduced elements, τ from the transport.
  Temperatures tau;
  tau.max_pool = 0.5f;
  const Tensor soft = vjp(f, {x}, u, Transport::soft_pullback(tau))[0];
  std::vector<float> expected;
  for (int64_t o = 0; o < 2; ++o) {
    double total = 0;
    for (int64_t r = 0; r < 4; ++r) total += std::exp(x.at({o, r}) / 0.5);
    for (int64_t r = 0; r < 4; ++r) expected.push_back(float(u.at({o}) * std::exp(x.at({o, r}) / 0.5) / total));
  }
  check_close(soft, Tensor::from_vector({2, 4}, expected), 1e-6, 1e-7, "soft max spread");

  // Against the PyTorch reference with detached weights at the default τ = 0.3.
  for (const char* name : {"soft_max_mid", "soft_max_split_keep"}) {
    const bool keep = std::string(name) == "soft_max_split_keep";
    const std::vector<int64_t> axes = keep ? std::vector<int64_t>{0, 2} : std::vector<int64_t>{1};
    const auto g = vjp([&](const Args& v) { return max(v[0], axes, keep); }, {math_golden(std::string(name) + ".x")},
                       math_golden(std::string(name) + ".u"), Transport::soft_pullback());
    check_close(g[0], math_golden(std::string(name) + ".gx"), 1e-4, 1e-6, name);
  }
}

TEST_CASE("reduce: sum, mean and var transports coincide") {
  const Tensor x = random_tensor({3, 4}, 23), u = random_tensor({4}, 24);
  auto f = [](const Args& v) { return sum(v[0], {0}) + mean(v[0], {0}) * 2.0f + var(v[0], {0}); };
  const auto g = vjp(f, {x}, u, Transport::gradient());
  for (const Transport& t : {Transport::pullback(), Transport::soft_pullback()})
    CHECK(vjp(f, {x}, u, t)[0].to_vector() == g[0].to_vector());
}

TEST_CASE("reduce: large reductions are accurate and independent of the thread count") {
  // Shapes that exercise several row blocks and column blocks of the blocked kernel.
  struct Case {
    Shape shape;
    std::vector<int64_t> axes;
    int64_t outer, count, inner;
  };
  const std::vector<Case> cases = {
      {{300000}, {}, 1, 300000, 1},      // one long row
      {{7, 40000}, {1}, 7, 40000, 1},    // rows
      {{20000, 9}, {0}, 1, 20000, 9},    // columns (leading axis)
      {{150, 5000}, {0}, 1, 150, 5000},  // wide columns: two column blocks, three row blocks
      {{3, 500, 40}, {1}, 3, 500, 40},   // middle axis
  };
  for (const Case& c : cases) {
    INFO("shape ", to_string(c.shape));
    const Tensor x = random_tensor(c.shape, 25, -1.0f, 3.0f);
    set_num_threads(1);
    const std::vector<float> one = sum(x, c.axes).to_vector();
    const std::vector<float> one_var = var(x, c.axes).to_vector();
    set_num_threads(0);
    const std::vector<float> all = sum(x, c.axes).to_vector();
    CHECK(one == all);
    CHECK(one_var == var(x, c.axes).to_vector());
    const std::vector<double> ref = reference_sum(x.to_vector(), c.outer, c.count, c.inner);
    int64_t bad = 0;
    for (size_t k = 0; k < ref.size(); ++k) bad += std::abs(one[k] - ref[k]) > 1e-6 * std::abs(ref[k]) + 1e-6;
    CHECK(bad == 0);
  }
  // Accumulating in double: a million copies of 0.1 sum to 100000 to float precision
  // (naive float accumulation is off by about 1%).
  const Tensor tenths = Tensor::full({1000000}, 0.1f);
  CHECK(sum(tenths).item() == doctest::Approx(100000.0).epsilon(1e-7));
  CHECK(mean(tenths).item() == 0.1f);
  // Two-pass variance: a large offset does not cancel the small spread.
  const Tensor offset = Tensor::from_vector({4}, {10000.0f, 10001.0f, 10002.0f, 10003.0f});
  CHECK(var(offset, {}, false).item() == 1.25f);
}

TEST_CASE("reduce: bad input") {
  const Tensor x = Tensor::zeros({2, 3});
  CHECK_THROWS_WITH_AS(sum(x, {1, 1}), doctest::Contains("sum: axis 1 is listed twice for input [2, 3]"), Error);
  CHECK_THROWS_WITH_AS(mean(x, {2}), doctest::Contains("mean: axis 2 is out of range"), Error);
  CHECK_THROWS_WITH_AS(var(x, {-3}), doctest::Contains("var: axis -3"), Error);
  CHECK_THROWS_WITH_AS(max(Tensor::zeros({2, 0}), {1}), doctest::Contains("max: cannot reduce over zero elements"),
                       Error);
  CHECK(sum(Tensor::zeros({2, 0}), {1}).to_vector() == std::vector<float>{0, 0});
}
