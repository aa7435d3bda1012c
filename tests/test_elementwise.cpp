// Elementwise ops: gradients, PyTorch goldens, transports, strided inputs, bad input.
#include <doctest/doctest.h>

#include <cmath>

#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "tests/math_golden.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {
using Unary = Tensor (*)(const Tensor&);
}  // namespace

TEST_CASE("elementwise: gradients match central differences") {
  const Tensor a = random_tensor({3, 5}, 1), b = random_tensor({3, 5}, 2);
  const Tensor away = random_tensor({3, 5}, 3, 0.3f, 1.5f);  // positive, away from 0
  const Tensor signed_away = mul(away, random_tensor({3, 5}, 4) / abs(random_tensor({3, 5}, 4)));  // ±[0.3, 1.5)

  check_gradients([](const Args& v) { return add(v[0], v[1]); }, {a, b});
  check_gradients([](const Args& v) { return sub(v[0], v[1]); }, {a, b});
  check_gradients([](const Args& v) { return mul(v[0], v[1]); }, {a, b});
  check_gradients([](const Args& v) { return div(v[0], v[1]); }, {a, signed_away});

  const std::vector<std::pair<const char*, Unary>> smooth = {
      {"neg", neg}, {"exp", exp}, {"sigmoid", sigmoid}, {"tanh", tanh}};
  for (const auto& [name, op] : smooth) {
    INFO(name);
    check_gradients([op = op](const Args& v) { return op(v[0]); }, {a});
  }
  check_gradients([](const Args& v) { return log(v[0]); }, {away});
  check_gradients([](const Args& v) { return sqrt(v[0]); }, {away});
  check_gradients([](const Args& v) { return abs(v[0]); }, {signed_away});
  check_gradients([](const Args& v) { return pow(v[0], 2.5f); }, {away});
  check_gradients([](const Args& v) { return pow(v[0], -1.5f); }, {away});
  check_gradients([](const Args& v) { return pow(v[0], 3.0f); }, {a});
  // Points at least 0.02 from the clamp bounds (the step is 0.01).
  const Tensor spread = Tensor::from_vector({6}, {-0.9f, -0.45f, -0.1f, 0.2f, 0.47f, 1.3f});
  check_gradients([](const Args& v) { return clamp(v[0], -0.5f, 0.5f); }, {spread});
  check_gradients([](const Args& v) { return add_scalar(v[0], 0.7f); }, {a});
  check_gradients([](const Args& v) { return mul_scalar(v[0], -1.3f); }, {a});
  check_gradients([](const Args& v) { return 2.0f - v[0] * 3.0f + v[0] / 4.0f; }, {a});
  check_gradients([](const Args& v) { return 2.0f / v[0] + (1.0f + v[0]) * -v[1]; }, {away, b});
  check_gradients([](const Args& v) { return (v[0] - 0.5f) * (v[0] + v[1]) / (v[1] + 2.0f); }, {a, b});
}

TEST_CASE("elementwise: forward and cotangents match PyTorch") {
  using Fn = adjoint::testing::Fn;
  check_math_case("add", {"a", "b"}, [](const Args& v) { return v[0] + v[1]; });
  check_math_case("sub", {"a", "b"}, [](const Args& v) { return v[0] - v[1]; });
  check_math_case("mul", {"a", "b"}, [](const Args& v) { return v[0] * v[1]; });
  check_math_case("div", {"a", "b"}, [](const Args& v) { return v[0] / v[1]; });
  const std::vector<std::pair<const char*, Fn>> unary = {
      {"neg", [](const Args& v) { return -v[0]; }},
      {"exp", [](const Args& v) { return exp(v[0]); }},
      {"log", [](const Args& v) { return log(v[0]); }},
      {"sqrt", [](const Args& v) { return sqrt(v[0]); }},
      {"abs", [](const Args& v) { return abs(v[0]); }},
      {"sigmoid", [](const Args& v) { return sigmoid(v[0]); }},
      {"tanh", [](const Args& v) { return tanh(v[0]); }},
      {"pow", [](const Args& v) { return pow(v[0], 2.5f); }},
      {"pow_int", [](const Args& v) { return pow(v[0], 3.0f); }},
      {"clamp", [](const Args& v) { return clamp(v[0], -0.5f, 0.5f); }},
      {"add_scalar", [](const Args& v) { return add_scalar(v[0], 0.7f); }},
      {"mul_scalar", [](const Args& v) { return mul_scalar(v[0], -1.3f); }},
      {"rsub_scalar", [](const Args& v) { return 2.0f - v[0]; }},
      {"div_scalar", [](const Args& v) { return v[0] / 3.0f; }},
      {"scalar_div", [](const Args& v) { return 2.0f / v[0]; }},
  };
  for (const auto& [name, f] : unary) check_math_case(name, {"x"}, f);
}

TEST_CASE("elementwise: the three transports coincide") {
  const Tensor a = random_tensor({4, 3}, 5), b = random_tensor({4, 3}, 6, 0.5f, 2.0f);
  const Tensor u = random_tensor({4, 3}, 7);
  auto f = [](const Args& v) { return tanh(v[0]) * sigmoid(v[1]) / v[1] + clamp(abs(v[0]), 0.1f, 0.8f); };
  const auto gradient = vjp(f, {a, b}, u, Transport::gradient());
  for (const Transport& t : {Transport::pullback(), Transport::soft_pullback()}) {
    const auto other = vjp(f, {a, b}, u, t);
    for (size_t i = 0; i < 2; ++i) CHECK(other[i].to_vector() == gradient[i].to_vector());
  }
}

TEST_CASE("elementwise: kinks follow PyTorch") {
  const Tensor x = Tensor::from_vector({5}, {-1.0f, -0.5f, 0.0f, 0.5f, 1.0f});
  const Tensor u = Tensor::ones({5});
  // abs'(0) = 0; clamp passes u on the bounds themselves (the gate is lo ≤ x ≤ hi).
  CHECK(vjp([](const Args& v) { return abs(v[0]); }, {x}, u)[0].to_vector() == std::vector<float>{-1, -1, 0, 1, 1});
  CHECK(vjp([](const Args& v) { return clamp(v[0], -0.5f, 0.5f); }, {x}, u)[0].to_vector() ==
        std::vector<float>{0, 1, 1, 1, 0});
  // d/dx x⁰ = 0, even at x = 0.
  CHECK(vjp([](const Args& v) { return pow(v[0], 0.0f); }, {x}, u)[0].to_vector() == std::vector<float>{0, 0, 0, 0, 0});
  // sigmoid saturates without overflow.
  const Tensor big = Tensor::from_vector({2}, {-200.0f, 200.0f});
  CHECK(sigmoid(big).to_vector() == std::vector<float>{0.0f, 1.0f});
}

TEST_CASE("elementwise: a tensor used twice gets both cotangents") {
  const Tensor x = random_tensor({2, 3}, 8);
  const Tensor u = random_tensor({2, 3}, 9);
  // d(x+x) = 2u, d(x·x) = 2xu, d(x−x) = 0.
  check_close(vjp([](const Args& v) { return v[0] + v[0]; }, {x}, u)[0], u * 2.0f, 0, 0, "x+x");
  check_close(vjp([](const Args& v) { return v[0] * v[0]; }, {x}, u)[0], x * u * 2.0f, 1e-6, 1e-7, "x·x");
  check_close(vjp([](const Args& v) { return v[0] - v[0]; }, {x}, u)[0], Tensor::zeros({2, 3}), 0, 0, "x−x");
  // (x + y) feeding two users: the pass-through cotangent must not be shared and overwritten.
  const Tensor y = random_tensor({2, 3}, 10);
  auto f = [](const Args& v) {
    Tensor s = v[0] + v[1];
    Tensor t = v[0] * 1.0f;
    return s * 3.0f + t + s;
  };
  const auto g = vjp(f, {x, y}, u);
  check_close(g[0], u * 5.0f, 1e-6, 0, "x");
  check_close(g[1], u * 4.0f, 1e-6, 0, "y");
}

TEST_CASE("elementwise: strided and large inputs") {
  // A transposed view is read through its strides.
  const Tensor a = random_tensor({3, 4}, 11), b = random_tensor({4, 3}, 12);
  const Tensor s = add(transpose(a, 0, 1), b);
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 3; ++j) CHECK(s.at({i, j}) == a.at({j, i}) + b.at({i, j}));
  check_gradients([](const Args& v) { return mul(transpose(v[0], 0, 1), v[1]); }, {a, b});

  // Many parallel chunks: every element still right.
  const Tensor x = random_tensor({70001}, 13), y = random_tensor({70001}, 14);
  const std::vector<float> xv = x.to_vector(), yv = y.to_vector(), z = (x * y + exp(x)).to_vector();
  int64_t bad = 0;
  for (size_t i = 0; i < xv.size(); ++i) bad += z[i] != xv[i] * yv[i] + std::exp(xv[i]);
  CHECK(bad == 0);
}

TEST_CASE("elementwise: bad input") {
  const Tensor a = Tensor::zeros({2, 3}), b = Tensor::zeros({3});
  CHECK_THROWS_WITH_AS(add(a, b), doctest::Contains("add: shapes [2, 3] and [3] differ"), Error);
  CHECK_THROWS_WITH_AS(mul(a, b), doctest::Contains("broadcast_to"), Error);
  CHECK_THROWS_WITH_AS(a / b, doctest::Contains("div: shapes"), Error);
  CHECK_THROWS_WITH_AS(b - a, doctest::Contains("sub: shapes [3] and [2, 3]"), Error);
  CHECK_THROWS_WITH_AS(clamp(a, 1.0f, -1.0f), doctest::Contains("clamp: lower bound 1 exceeds upper bound -1"), Error);
  CHECK_THROWS_AS(exp(Tensor()), Error);
}
