// Bilinear layer (Lx̃)⊙(Rx̃): exact gradient, and the pullback as half of it, which is the
// adjoint of the exact dynamic-linear split y = ½J(x̃)x̃.
#include <doctest/doctest.h>

#include <cmath>

#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/bilinear.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

Tensor golden_t(const std::string& name) { return golden("transport", name); }

// W x̃ for row m of x (M, d) and W (h, d+1), in double.
double project_row(const std::vector<float>& x, const std::vector<float>& W, int64_t m, int64_t o, int64_t d) {
  double s = W[size_t(o * (d + 1))];
  for (int64_t j = 0; j < d; ++j) s += double(W[size_t(o * (d + 1) + j + 1)]) * x[size_t(m * d + j)];
  return s;
}

}  // namespace

TEST_CASE("bilinear: gradcheck through x, L and R") {
  check_gradients([](const std::vector<Tensor>& in) { return bilinear(in[0], in[1], in[2]); },
                  {random_tensor({2, 3, 4}, 1), random_tensor({5, 5}, 2), random_tensor({5, 5}, 3)});
  check_gradients([](const std::vector<Tensor>& in) { return bilinear(in[0], in[1], in[2]); },
                  {random_tensor({6}, 4), random_tensor({3, 7}, 5), random_tensor({3, 7}, 6)});
}

TEST_CASE("bilinear: forward, gradient and pullback match the PyTorch goldens") {
  auto in = leaves({golden_t("bil.x"), golden_t("bil.L"), golden_t("bil.R")});
  const Tensor u = golden_t("bil.u");
  Tensor y = bilinear(in[0], in[1], in[2]);
  check_close(y, golden_t("bil.y"), 1e-5, 1e-6, "bilinear forward");
  auto g = grad(y, in, u);
  check_close(g[0], golden_t("bil.grad_x"), 1e-4, 1e-5, "bilinear grad x");
  check_close(g[1], golden_t("bil.grad_L"), 1e-4, 1e-5, "bilinear grad L");
  check_close(g[2], golden_t("bil.grad_R"), 1e-4, 1e-5, "bilinear grad R");
  for (const Transport& t : {Transport::pullback(), Transport::soft_pullback()}) {
    auto p = grad(y, in, u, t);
    check_close(p[0], golden_t("bil.pullback_x"), 1e-4, 1e-5, "bilinear pullback x");
    check_close(p[1], golden_t("bil.grad_L"), 1e-4, 1e-5, "bilinear pullback L (unchanged)");
    check_close(p[2], golden_t("bil.grad_R"), 1e-4, 1e-5, "bilinear pullback R (unchanged)");
  }
}

TEST_CASE("bilinear: the pullback is half the gradient and the adjoint of y = ½J(x̃)x̃") {
  const int64_t M = 6, d = 5, h = 4;
  const Tensor x = random_tensor({2, 3, d}, 11, -2, 2), u = random_tensor({2, 3, h}, 12);
  Tensor L = random_tensor({h, d + 1}, 13), R = random_tensor({h, d + 1}, 14);

  SUBCASE("half of the gradient's input cotangent; parameter grads unchanged") {
    auto in = leaves({x, L, R});
    Tensor y = bilinear(in[0], in[1], in[2]);
    auto g = grad(y, in, u);
    std::vector<float> half = g[0].to_vector();
    for (float& v : half) v *= 0.5f;
    for (const Transport& t : {Transport::pullback(), Transport::soft_pullback()}) {
      auto p = grad(y, in, u, t);
      check_close(p[0], Tensor::from_vector(x.shape(), half), 1e-6, 1e-7, "pullback = ½ gradient");
      check_close(p[1], g[1], 0, 0, "L grad under the pullback");
      check_close(p[2], g[2], 0, 0, "R grad under the pullback");
    }
  }
  SUBCASE("per row: <u, y> = <p, x> + ½ Σ_o u_o (Rx̃_o L_o0 + Lx̃_o R_o0)") {
    // y = ½J(x̃)x̃ gives <u, y> = <½Jᵀu, x̃>: the x coordinates of ½Jᵀu are the pullback
    // p, and its bias coordinate is the last term.
    auto in = leaves({x, L, R});
    Tensor y = bilinear(in[0], in[1], in[2]);
    const std::vector<float> p = grad(y, in, u, Transport::pullback())[0].to_vector();
    const std::vector<float> xv = x.to_vector(), uv = u.to_vector(), yv = y.to_vector(), lv = L.to_vector(),
                             rv = R.to_vector();
    for (int64_t m = 0; m < M; ++m) {
      double uy = 0, px = 0, bias = 0;
      for (int64_t o = 0; o < h; ++o) {
        uy += double(uv[size_t(m * h + o)]) * yv[size_t(m * h + o)];
        bias += 0.5 * uv[size_t(m * h + o)] *
                (project_row(xv, rv, m, o, d) * lv[size_t(o * (d + 1))] +
                 project_row(xv, lv, m, o, d) * rv[size_t(o * (d + 1))]);
      }
      for (int64_t j = 0; j < d; ++j) px += double(p[size_t(m * d + j)]) * xv[size_t(m * d + j)];
      CHECK(uy == doctest::Approx(px + bias).epsilon(1e-5));
    }
  }
  SUBCASE("without biases the pullback reproduces the output: <u, y> = <p, x>") {
    for (int64_t o = 0; o < h; ++o) L.data()[o * (d + 1)] = R.data()[o * (d + 1)] = 0;
    auto in = leaves({x, L, R});
    Tensor y = bilinear(in[0], in[1], in[2]);
    const std::vector<float> p = grad(y, in, u, Transport::pullback())[0].to_vector();
    const std::vector<float> xv = x.to_vector(), uv = u.to_vector(), yv = y.to_vector();
    double uy = 0, px = 0;
    for (size_t i = 0; i < uv.size(); ++i) uy += double(uv[i]) * yv[i];
    for (size_t i = 0; i < xv.size(); ++i) px += double(p[i]) * xv[i];
    CHECK(uy == doctest::Approx(px).epsilon(1e-5));
    // ... while the gradient gives twice the output (Euler: y is homogeneous of degree 2).
    const std::vector<float> gx = grad(y, in, u)[0].to_vector();
    double gxx = 0;
    for (size_t i = 0; i < xv.size(); ++i) gxx += double(gx[i]) * xv[i];
    CHECK(gxx == doctest::Approx(2 * uy).epsilon(1e-5));
  }
}

TEST_CASE("bilinear: bad shapes are errors naming the op and shapes") {
  const Tensor x = Tensor::ones({2, 4});
  CHECK_THROWS_WITH_AS(bilinear(x, Tensor::ones({3, 4}), Tensor::ones({3, 4})),
                       doctest::Contains("bilinear: L must be (h, d+1) for x (..., d), its bias in column 0, got x "
                                         "[2, 4], L [3, 4], R [3, 4]"),
                       Error);
  CHECK_THROWS_WITH_AS(bilinear(x, Tensor::ones({3, 5}), Tensor::ones({2, 5})),
                       doctest::Contains("L and R shapes differ"), Error);
  CHECK_THROWS_WITH_AS(bilinear(Tensor::scalar(1), Tensor::ones({3, 2}), Tensor::ones({3, 2})),
                       doctest::Contains("bilinear: x needs a non-empty feature dim"), Error);
}
