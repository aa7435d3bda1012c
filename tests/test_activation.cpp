// Activations (ReLU, GELU, SiLU) under their three transports, and dropout.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "engine/vectorize.h"
#include "ops/activation.h"
#include "ops/dropout.h"
#include "ops/elementwise.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

// Random values with |z| in [0.2, 2]: away from the ReLU kink by more than the
// finite-difference step.
Tensor away_from_zero(const Shape& shape, uint64_t seed) {
  Tensor t = random_tensor(shape, seed, -1.0f, 1.0f);
  float* p = t.data();
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = (p[i] < 0 ? -1.0f : 1.0f) * (0.2f + 1.8f * std::abs(p[i]));
  return t;
}

// The cotangent that reaches x of activation(x) for cotangent u under a transport.
Tensor transported(Activation kind, const Tensor& x, const Tensor& u, const Transport& t) {
  return vjp([&](const std::vector<Tensor>& in) { return activation(in[0], kind); }, {x}, u, t)[0];
}

Tensor map(const Tensor& x, float (*fn)(float)) {
  std::vector<float> v = x.to_vector();
  for (float& e : v) e = fn(e);
  return Tensor::from_vector(x.shape(), v);
}
Tensor times(const Tensor& a, const Tensor& b) {
  std::vector<float> va = a.to_vector(), vb = b.to_vector();
  for (size_t i = 0; i < va.size(); ++i) va[i] *= vb[i];
  return Tensor::from_vector(a.shape(), va);
}

float Phi(float z) { return 0.5f * std::erfc(-z / std::sqrt(2.0f)); }

const Activation kAll[] = {Activation::Relu, Activation::Gelu, Activation::Silu};

}  // namespace

TEST_CASE("activation: gradcheck of relu, gelu, silu away from kinks") {
  Tensor x = away_from_zero({3, 5, 4}, 11);
  for (Activation kind : kAll) {
    INFO(to_string(kind));
    check_gradients([&](const std::vector<Tensor>& in) { return activation(in[0], kind); }, {x});
  }
}

TEST_CASE("activation: forward and every transport match the PyTorch goldens") {
  const Tensor x = golden("transport", "act.x"), u = golden("transport", "act.u");
  Temperatures half;
  half.relu = half.gelu = half.silu = 0.5f;
  for (Activation kind : kAll) {
    const std::string n = to_string(kind), key = "act." + n;
    check_close(activation(x, kind), golden("transport", key + ".y"), 1e-5, 1e-6, n + " forward");
    check_close(transported(kind, x, u, Transport::gradient()), golden("transport", key + ".grad"), 1e-4, 1e-5,
                n + " gradient");
    check_close(transported(kind, x, u, Transport::pullback()), golden("transport", key + ".pullback"), 1e-4, 1e-5,
                n + " pullback");
    check_close(transported(kind, x, u, Transport::soft_pullback()), golden("transport", key + ".soft"), 1e-4, 1e-5,
                n + " soft pullback, default tau");
    check_close(transported(kind, x, u, Transport::soft_pullback(half)), golden("transport", key + ".soft_tau05"),
                1e-4, 1e-5, n + " soft pullback, tau 0.5");
  }
}

TEST_CASE("activation: transports against their definitions") {
  const Tensor x = away_from_zero({4, 9}, 21), u = random_tensor({4, 9}, 22);
  SUBCASE("relu gradient and pullback are the same gate 1{z>0}") {
    Tensor gate = map(x, [](float z) { return z > 0 ? 1.0f : 0.0f; });
    check_close(transported(Activation::Relu, x, u, Transport::gradient()), times(gate, u), 0, 0, "relu gradient");
    check_close(transported(Activation::Relu, x, u, Transport::pullback()), times(gate, u), 0, 0, "relu pullback");
  }
  SUBCASE("relu soft pullback tends to the hard pullback as tau -> 0") {
    const Tensor hard = transported(Activation::Relu, x, u, Transport::pullback());
    double previous = INFINITY;
    for (float tau : {1.0f, 0.3f, 0.1f, 0.01f}) {
      Temperatures t;
      t.relu = tau;
      std::vector<float> soft = transported(Activation::Relu, x, u, Transport::soft_pullback(t)).to_vector();
      std::vector<float> h = hard.to_vector();
      double err = 0;
      for (size_t i = 0; i < h.size(); ++i) err = std::max(err, double(std::abs(soft[i] - h[i])));
      CHECK(err < previous);  // strictly closer at each smaller temperature
      previous = err;
    }
    CHECK(previous < 1e-6);  // |z| >= 0.2: Φ(±20) is 1 or 0 in float
  }
  SUBCASE("gelu pullback is Phi(z)·u, gradient adds z·phi(z)·u") {
    check_close(transported(Activation::Gelu, x, u, Transport::pullback()), times(map(x, Phi), u), 1e-6, 1e-7,
                "gelu pullback");
    Tensor derivative = map(x, [](float z) { return Phi(z) + z * std::exp(-z * z / 2) / std::sqrt(2 * float(M_PI)); });
    check_close(transported(Activation::Gelu, x, u, Transport::gradient()), times(derivative, u), 1e-5, 1e-6,
                "gelu gradient");
  }
  SUBCASE("silu pullback is sigma(z)·u; soft is sigma(z/tau)·u") {
    check_close(transported(Activation::Silu, x, u, Transport::pullback()),
                times(map(x, [](float z) { return 1 / (1 + std::exp(-z)); }), u), 1e-6, 1e-7, "silu pullback");
    check_close(transported(Activation::Silu, x, u, Transport::soft_pullback()),
                times(map(x, [](float z) { return 1 / (1 + std::exp(-z / 1.6f)); }), u), 1e-6, 1e-7, "silu soft");
  }
  SUBCASE("the pullback of a gated activation reproduces the output: <pullback(u), x> = <u, y>") {
    // y = g(z)·z with the gate frozen is linear in z, so the pullback is its exact adjoint.
    for (Activation kind : kAll) {
      std::vector<float> p = transported(kind, x, u, Transport::pullback()).to_vector();
      std::vector<float> y = activation(x, kind).to_vector(), xv = x.to_vector(), uv = u.to_vector();
      double lhs = 0, rhs = 0;
      for (size_t i = 0; i < p.size(); ++i) lhs += double(p[i]) * xv[i], rhs += double(uv[i]) * y[i];
      CHECK(lhs == doctest::Approx(rhs).epsilon(1e-5));
    }
  }
}

// engine/vectorize.h promises that run_widest changes the speed, never a bit of the result.
// Where the CPU (or the build) has no wider path there is nothing to compare, and doctest
// reports the test as skipped.
TEST_CASE("activation: the AVX2 and AVX-512 loops give the same bits as the plain x86-64 ones" *
          doctest::skip(cpu_vector_isa() == VectorIsa::Baseline)) {
  // Ragged length (not a multiple of 8) with negatives, zeros, large values and ±inf.
  Tensor x = random_tensor({3, 1001}, 31, -6.0f, 6.0f);
  x.data()[0] = 0.0f, x.data()[1] = 40.0f, x.data()[2] = -40.0f, x.data()[3] = INFINITY, x.data()[4] = -INFINITY;
  const Tensor u = random_tensor({3, 1001}, 32);
  // DeepLift needs the batch [inputs; baselines]: an even leading axis.
  const Tensor xd = random_tensor({4, 777}, 33, -3.0f, 3.0f), ud = random_tensor({4, 777}, 34);
  for (Activation kind : kAll) {
    CAPTURE(to_string(kind));
    std::vector<std::vector<float>> results[3];  // by VectorIsa
    const VectorIsa widest = cpu_vector_isa();
    for (VectorIsa isa : {VectorIsa::Baseline, VectorIsa::Avx2, VectorIsa::Avx512}) {
      if (isa > widest) continue;
      cap_vector_isa(isa);
      std::vector<std::vector<float>>& r = results[int(isa)];
      r.push_back(activation(x, kind).to_vector());
      for (const Transport& t : {Transport::gradient(), Transport::pullback(), Transport::soft_pullback(),
                                 Transport::guided()})
        r.push_back(transported(kind, x, u, t).to_vector());
      r.push_back(transported(kind, xd, ud, Transport::deeplift()).to_vector());
    }
    cap_vector_isa(VectorIsa::Avx512);  // back to the CPU's widest
    for (int wide = 1; wide <= int(widest); ++wide) {
      CAPTURE(wide);
      REQUIRE(results[0].size() == results[wide].size());
      for (size_t k = 0; k < results[0].size(); ++k) {
        CAPTURE(k);
        REQUIRE(results[0][k].size() == results[wide][k].size());
        CHECK(std::memcmp(results[0][k].data(), results[wide][k].data(), results[0][k].size() * sizeof(float)) == 0);
      }
    }
  }
}

TEST_CASE("activation: strided input and no recording without grad") {
  Tensor x = away_from_zero({3, 4}, 5);
  Tensor xt = x.view_as_strided({4, 3}, {1, 4}, 0);  // the transpose
  Tensor y = relu(xt);
  CHECK(y.shape() == Shape{4, 3});
  CHECK(y.at({2, 1}) == std::max(x.at({1, 2}), 0.0f));
  CHECK_FALSE(y.grad_fn());
}

TEST_CASE("activation: GELU and SiLU values and derivatives within 2e-6 of the double-precision formulas") {
  // The kernels use a rational erf and a polynomial exp (no libm calls, so they
  // vectorise); this bounds what that costs, on a grid that covers both tails.
  std::vector<float> grid;
  for (int i = -2000; i <= 2000; ++i) grid.push_back(float(i) * 0.005f);  // [-10, 10]
  const int64_t n = int64_t(grid.size());
  Tensor z = Tensor::from_vector({n}, grid);
  Tensor u = Tensor::ones({n});
  for (Activation kind : {Activation::Gelu, Activation::Silu}) {
    std::vector<float> value = activation(z, kind).to_vector();
    std::vector<float> slope = transported(kind, z, u, Transport::gradient()).to_vector();
    double worst_value = 0, worst_slope = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double x = grid[size_t(i)];
      double f, df;
      if (kind == Activation::Gelu) {
        const double Phi = 0.5 * std::erfc(-x / std::sqrt(2.0)), phi = std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
        f = x * Phi, df = Phi + x * phi;
      } else {
        const double s = 1.0 / (1.0 + std::exp(-x));
        f = x * s, df = s + x * s * (1 - s);
      }
      worst_value = std::max(worst_value, std::abs(value[size_t(i)] - f) / std::max(1.0, std::abs(f)));
      worst_slope = std::max(worst_slope, std::abs(slope[size_t(i)] - df));
    }
    INFO(to_string(kind));
    CHECK(worst_value < 2e-6);
    CHECK(worst_slope < 2e-6);
  }
}

namespace {

// Every float whose bits are a multiple of `stride` apart, from `lo` up to `hi` (both
// positive), with both signs: a dense grid in every binade, which a uniform grid is not.
std::vector<float> floats_between(float lo, float hi, uint32_t stride) {
  uint32_t a, b;
  std::memcpy(&a, &lo, sizeof a), std::memcpy(&b, &hi, sizeof b);
  std::vector<float> out;
  for (uint32_t bits = a; bits <= b && bits >= a; bits += stride) {
    float v;
    std::memcpy(&v, &bits, sizeof v);
    out.push_back(v), out.push_back(-v);
  }
  return out;
}

}  // namespace

// The largest errors of GELU's Φ (its pullback gate, which the soft gates share), its value
// and its derivative against the double-precision formulas. The grid: every 127th float of
// magnitude 1e-9 to 16 (where Φ moves; 4.5 million points with both signs), every 4099th beyond up to the
// largest float, and 0, the smallest subnormal, ±inf. The bounds are the largest errors
// over every float (an exhaustive run, docs/benchmarks.md), rounded up: the function
// promises them everywhere, and this grid comes within 15% of each.
TEST_CASE("activation: GELU's Φ, value and derivative over the floats against double-precision erf") {
  std::vector<float> grid = floats_between(1e-9f, 16.0f, 127);
  const std::vector<float> tails = floats_between(16.0f, std::numeric_limits<float>::max(), 4099);
  grid.insert(grid.end(), tails.begin(), tails.end());
  for (float v : {0.0f, std::numeric_limits<float>::denorm_min(), 16.0f, 1e30f, INFINITY})
    grid.push_back(v), grid.push_back(-v);
  const int64_t n = int64_t(grid.size());
  const Tensor z = Tensor::from_vector({n}, grid), u = Tensor::ones({n});
  const std::vector<float> value = activation(z, Activation::Gelu).to_vector();
  const std::vector<float> gate = transported(Activation::Gelu, z, u, Transport::pullback()).to_vector();
  const std::vector<float> slope = transported(Activation::Gelu, z, u, Transport::gradient()).to_vector();
  double worst_gate = 0, worst_value = 0, worst_slope = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double x = grid[size_t(i)];
    const double Phi = 0.5 * std::erfc(-x / std::sqrt(2.0));
    // x·φ(x) without inf·0 at x = ±inf: the density's term vanishes beyond |x| = 40.
    const double x_phi = std::abs(x) > 40 ? 0.0 : x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
    const double f = std::isinf(x) ? (x > 0 ? x : 0.0) : x * Phi;  // GELU(−inf) = 0, the limit
    worst_gate = std::max(worst_gate, std::abs(gate[size_t(i)] - Phi));
    if (!std::isinf(x) || x > 0)
      worst_value = std::max(worst_value, std::abs(value[size_t(i)] - f) / std::max(1.0, std::abs(f)));
    worst_slope = std::max(worst_slope, std::abs(slope[size_t(i)] - (Phi + x_phi)));
  }
  MESSAGE("GELU over ", n, " floats: |Φ error| ", worst_gate, ", value error (relative beyond 1) ", worst_value,
          ", |derivative error| ", worst_slope);
  CHECK(worst_gate < 2.5e-7);
  CHECK(worst_value < 1.25e-6);  // |z|·(Φ's error) where Φ → 0: the value is z·Φ
  CHECK(worst_slope < 2.5e-7);
  // NaN stays NaN through the value, the gate and the derivative.
  const Tensor nan = Tensor::from_vector({1}, {std::numeric_limits<float>::quiet_NaN()});
  CHECK(std::isnan(activation(nan, Activation::Gelu).to_vector()[0]));
  CHECK(std::isnan(transported(Activation::Gelu, nan, Tensor::ones({1}), Transport::pullback()).to_vector()[0]));
  CHECK(std::isnan(transported(Activation::Gelu, nan, Tensor::ones({1}), Transport::gradient()).to_vector()[0]));
}

TEST_CASE("activation: a ReLU recorded under GradientOnly keeps its output and refuses soft transports") {
  Tensor x = random_tensor({4, 8}, 11, -1.0f, 1.0f), u = random_tensor({4, 8}, 12, -1.0f, 1.0f);
  auto under_gradient_only = [&](const Transport& t) {
    return vjp([&](const std::vector<Tensor>& in) {
      GradientOnly training_graph;
      return relu(in[0]);
    }, {x}, u, t)[0];
  };
  // Same cotangents as the ordinary graph for every transport that reads only the gates.
  for (const Transport& t : {Transport::gradient(), Transport::pullback(), Transport::guided()})
    CHECK(under_gradient_only(t).to_vector() == transported(Activation::Relu, x, u, t).to_vector());
  CHECK_THROWS_WITH_AS(under_gradient_only(Transport::soft_pullback()), doctest::Contains("GradientOnly"), Error);

  // The pre-activation is not kept: only the input and the output stay alive.
  const int64_t n = 1 << 18;
  Tensor big = Tensor::zeros({n}).requires_grad_();
  const int64_t before = memory_stats().current_bytes;
  Tensor y;
  {
    GradientOnly training_graph;
    y = relu(add_scalar(big, 1.0f));
  }
  CHECK(memory_stats().current_bytes - before < 2 * n * int64_t(sizeof(float)));
  backward(y, Tensor::ones({n}));
  CHECK(big.grad().to_vector() == std::vector<float>(size_t(n), 1.0f));
}

TEST_CASE("dropout: mask reproducible across thread counts, keep rate, scaling, eval identity") {
  const Tensor x = Tensor::ones({64, 1000});
  const int previous = num_threads();
  set_num_threads(1);
  Generator g1(77);
  const std::vector<float> y1 = dropout(x, 0.3f, true, g1).to_vector();
  set_num_threads(2);
  Generator g2(77);
  const std::vector<float> y2 = dropout(x, 0.3f, true, g2).to_vector();
  set_num_threads(previous);
  CHECK(y1 == y2);
  CHECK(g1.offset() == uint64_t(x.numel()));

  int64_t kept = 0, other = 0;
  for (float v : y1) {
    kept += v != 0.0f;
    other += v != 0.0f && v != 1.0f / 0.7f;  // kept values are scaled by exactly 1/(1 − p)
  }
  CHECK(other == 0);
  const double rate = double(kept) / double(y1.size());
  CHECK(rate == doctest::Approx(0.7).epsilon(0.02));  // 64000 draws: sd of the rate ≈ 0.002

  Generator g3(78);
  Tensor again = dropout(x, 0.3f, true, g3);
  CHECK(again.to_vector() != y1);  // another seed, another mask

  Generator g(1);
  CHECK(dropout(x, 0.5f, false, g).impl() == x.impl());
  CHECK(dropout(x, 0.0f, true, g).impl() == x.impl());
  CHECK(g.offset() == 0);  // nothing drawn
  const std::vector<float> all_dropped = dropout(x, 1.0f, true, g).to_vector();
  CHECK(std::all_of(all_dropped.begin(), all_dropped.end(), [](float v) { return v == 0.0f; }));
}

TEST_CASE("dropout: backward applies the same mask and scale under every transport") {
  Tensor x = random_tensor({8, 16}, 3).requires_grad_();
  Tensor u = random_tensor({8, 16}, 4);
  Generator g(5);
  Tensor y = dropout(x, 0.25f, true, g);
  std::vector<float> yv = y.to_vector(), xv = x.to_vector(), uv = u.to_vector();
  for (Transport t : {Transport::gradient(), Transport::pullback(), Transport::soft_pullback()}) {
    std::vector<float> dx = grad(y, {x}, u, t)[0].to_vector();
    for (size_t i = 0; i < dx.size(); ++i) {
      const float m = yv[i] / xv[i];  // the scaled mask value
      CHECK(dx[i] == doctest::Approx(m * uv[i]));
    }
  }
  Generator gc(9);
  check_gradients(
      [&](const std::vector<Tensor>& in) {
        Generator fresh(gc.seed());  // the same mask at every evaluation
        return dropout(in[0], 0.4f, true, fresh);
      },
      {random_tensor({5, 7}, 10)});
}

TEST_CASE("dropout: bad probability is an error naming the op") {
  Generator g(1);
  CHECK_THROWS_WITH_AS(dropout(Tensor::ones({2, 3}), 1.5f, true, g), doctest::Contains("dropout: probability 1.5"),
                       Error);
}

TEST_CASE("add_relu: outside a graph the separate ops' bits in one pass; recorded, their gradients") {
  Tensor a = random_tensor({3, 5, 7}, 81), b = random_tensor({3, 5, 7}, 82);
  a.data()[4] = std::numeric_limits<float>::quiet_NaN();  // a NaN sum stays NaN, as ReLU keeps it
  {
    NoGrad off;
    const std::vector<float> fused = add_relu(a, b).to_vector(), separate = relu(a + b).to_vector();
    REQUIRE(fused.size() == separate.size());
    CHECK(std::isnan(fused[4]));
    CHECK(std::memcmp(fused.data(), separate.data(), fused.size() * sizeof(float)) == 0);
    CHECK(std::count(fused.begin(), fused.end(), 0.0f) > 10);  // the gate closes somewhere
  }
  const Tensor c = random_tensor({2, 3, 4}, 83), d = random_tensor({2, 3, 4}, 84);
  check_gradients([](const std::vector<Tensor>& in) { return add_relu(in[0], in[1]); }, {c, d});
  const Tensor u = random_tensor({2, 3, 4}, 85);
  const auto fused = vjp([](const std::vector<Tensor>& in) { return add_relu(in[0], in[1]); }, {c, d}, u);
  const auto separate = vjp([](const std::vector<Tensor>& in) { return relu(in[0] + in[1]); }, {c, d}, u);
  CHECK(fused[0].to_vector() == separate[0].to_vector());
  CHECK(fused[1].to_vector() == separate[1].to_vector());
}
