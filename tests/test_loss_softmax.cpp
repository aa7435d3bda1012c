// softmax, log_softmax, cross_entropy and mse_loss: gradients, PyTorch goldens,
// numerical stability, the fused cross-entropy rule, bad input.
#include <doctest/doctest.h>

#include <cmath>

#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/elementwise.h"
#include "ops/loss.h"
#include "ops/reduce.h"
#include "ops/softmax.h"
#include "tests/math_golden.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

TEST_CASE("softmax: gradients match central differences") {
  const Tensor x = random_tensor({2, 3, 5}, 51, -2.0f, 2.0f);
  for (int64_t axis : {0, 1, 2, -1}) {
    INFO("axis ", axis);
    check_gradients([axis](const Args& v) { return softmax(v[0], axis); }, {x});
    check_gradients([axis](const Args& v) { return log_softmax(v[0], axis); }, {x});
  }
}

TEST_CASE("softmax: forward and cotangents match PyTorch") {
  check_math_case("softmax_last", {"x"}, [](const Args& v) { return softmax(v[0], -1); });
  check_math_case("softmax_mid", {"x"}, [](const Args& v) { return softmax(v[0], 1); });
  check_math_case("log_softmax_last", {"x"}, [](const Args& v) { return log_softmax(v[0], 2); });
  check_math_case("log_softmax_first", {"x"}, [](const Args& v) { return log_softmax(v[0], 0); });
}

TEST_CASE("softmax: stable for large logits, rows sum to one") {
  const Tensor x = Tensor::from_vector({2, 3}, {1000, 1001, 1002, -1000, -1001, -1002});
  const std::vector<float> p = softmax(x, 1).to_vector();
  const std::vector<float> lp = log_softmax(x, 1).to_vector();
  for (int64_t r = 0; r < 2; ++r) {
    double total = 0;
    for (int64_t c = 0; c < 3; ++c) {
      CHECK(std::isfinite(lp[r * 3 + c]));
      CHECK(std::exp(lp[r * 3 + c]) == doctest::Approx(p[r * 3 + c]).epsilon(1e-6));
      total += p[r * 3 + c];
    }
    CHECK(total == doctest::Approx(1.0).epsilon(1e-6));
  }
  CHECK(lp[2] == doctest::Approx(-std::log(1 + std::exp(-1.0) + std::exp(-2.0))).epsilon(1e-6));
  // Smooth: the three transports coincide.
  const Tensor y = random_tensor({3, 4}, 52), u = random_tensor({3, 4}, 53);
  auto f = [](const Args& v) { return softmax(v[0], 0) + log_softmax(v[0], 1); };
  const auto g = vjp(f, {y}, u);
  for (const Transport& t : {Transport::pullback(), Transport::soft_pullback()})
    CHECK(vjp(f, {y}, u, t)[0].to_vector() == g[0].to_vector());
}

TEST_CASE("loss: gradients match central differences") {
  const Tensor logits = random_tensor({4, 6}, 54, -2.0f, 2.0f);
  const std::vector<int64_t> labels{5, 0, 2, 5};
  for (float smoothing : {0.0f, 0.1f, 1.0f}) {
    INFO("label_smoothing ", smoothing);
    check_gradients([&](const Args& v) { return cross_entropy(v[0], labels, smoothing); }, {logits});
  }
  check_gradients([](const Args& v) { return mse_loss(v[0], v[1]); },
                  {random_tensor({3, 4}, 55), random_tensor({3, 4}, 56)});
}

TEST_CASE("loss: forward and cotangents match PyTorch") {
  const std::vector<int64_t> labels = math_golden_indices("cross_entropy.labels");
  check_math_case("cross_entropy", {"logits"}, [&](const Args& v) { return cross_entropy(v[0], labels); });
  check_math_case("cross_entropy_smooth", {"logits"}, [&](const Args& v) { return cross_entropy(v[0], labels, 0.1f); });
  check_math_case("mse_loss", {"a", "b"}, [](const Args& v) { return mse_loss(v[0], v[1]); });
}

TEST_CASE("loss: cross_entropy is fused, stable and matches its definition") {
  const Tensor logits = random_tensor({3, 4}, 57, -3.0f, 3.0f);
  const std::vector<int64_t> labels{1, 3, 1};
  const float eps = 0.2f;
  // The fused value equals the composition −mean(Σ target·log_softmax).
  std::vector<float> target(12, eps / 4);
  for (int64_t i = 0; i < 3; ++i) target[i * 4 + labels[i]] += 1 - eps;
  const Tensor t = Tensor::from_vector({3, 4}, target);
  const Tensor composed = -sum(t * log_softmax(logits, 1)) / 3.0f;
  CHECK(cross_entropy(logits, labels, eps).item() == doctest::Approx(composed.item()).epsilon(1e-6));
  // One node, whose transport is u·(softmax − target)/N.
  Tensor leaf = logits.detach();
  leaf.requires_grad_();
  const Tensor loss = cross_entropy(leaf, labels, eps);
  CHECK(loss.grad_fn()->name() == "cross_entropy");
  CHECK(leaf.is_leaf());
  const Tensor g = grad(loss, {leaf}, Tensor::scalar(2.0f))[0];
  check_close(g, (softmax(logits, 1) - t) * (2.0f / 3.0f), 1e-6, 1e-7, "(softmax − target)/N");
  // Huge logits: finite loss and gradient.
  const Tensor huge = Tensor::from_vector({2, 3}, {1e4f, -1e4f, 0, 5e3f, 5e3f, -3e4f});
  const Tensor big_loss = cross_entropy(huge, {1, 0});
  CHECK(std::isfinite(big_loss.item()));
  CHECK(big_loss.item() == doctest::Approx((2e4 + std::log(2.0)) / 2).epsilon(1e-6));
  for (float v : vjp(
                     [](const Args& a) {
                       return cross_entropy(a[0], {1, 0});
                     },
                     {huge}, Tensor::scalar(1))[0]
                     .to_vector())
    CHECK(std::isfinite(v));
}

TEST_CASE("loss: bad input") {
  const Tensor logits = Tensor::zeros({2, 5});
  CHECK_THROWS_WITH_AS(cross_entropy(logits, {0, 7}),
                       doctest::Contains("cross_entropy: label 7 at index 1 is out of range for 5 classes"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, {-1, 0}), doctest::Contains("label -1 at index 0"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, {0}), doctest::Contains("cross_entropy: 1 labels for logits [2, 5]"),
                       Error);
  CHECK_THROWS_WITH_AS(cross_entropy(Tensor::zeros({2, 5, 1}), {0, 0}),
                       doctest::Contains("logits must be (N, C), got [2, 5, 1]"), Error);
  CHECK_THROWS_WITH_AS(cross_entropy(logits, {0, 0}, 1.5f), doctest::Contains("label_smoothing 1.5 is outside [0, 1]"),
                       Error);
  CHECK_THROWS_WITH_AS(mse_loss(Tensor::zeros({2, 3}), Tensor::zeros({3, 2})),
                       doctest::Contains("mse_loss: shapes [2, 3] and [3, 2] differ"), Error);
  CHECK_THROWS_WITH_AS(softmax(logits, 2), doctest::Contains("softmax: axis 2 is out of range"), Error);
  CHECK_THROWS_WITH_AS(log_softmax(logits, -3), doctest::Contains("log_softmax: axis -3"), Error);
}
