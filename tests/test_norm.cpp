// BatchNorm and LayerNorm: exact gradients, goldens, and the frozen-statistics pullbacks;
// BatchNorm's tail (+ residual, ReLU) against the separate ops, bit for bit.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "engine/vectorize.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/norm.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

const std::vector<Transport> kTransports = {Transport::gradient(), Transport::pullback(), Transport::soft_pullback()};

Tensor golden_t(const std::string& name) { return golden("transport", name); }

// Per-channel biased statistics of x (N, C, ...): 1/sqrt(var + eps).
std::vector<double> channel_invstd(const Tensor& x, double eps) {
  const int64_t N = x.size(0), C = x.size(1), L = x.numel() / (N * C);
  std::vector<float> v = x.to_vector();
  std::vector<double> out(C);
  for (int64_t c = 0; c < C; ++c) {
    double s = 0, ss = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l) s += v[(n * C + c) * L + l];
    const double mu = s / double(N * L);
    for (int64_t n = 0; n < N; ++n)
      for (int64_t l = 0; l < L; ++l) ss += std::pow(v[(n * C + c) * L + l] - mu, 2);
    out[c] = 1.0 / std::sqrt(ss / double(N * L) + eps);
  }
  return out;
}

}  // namespace

TEST_CASE("norm: gradcheck of batch_norm in training and eval, with and without affine") {
  const Tensor x = random_tensor({4, 3, 2, 3}, 1, -2, 2), w = random_tensor({3}, 2, 0.5, 1.5),
               b = random_tensor({3}, 3);
  SUBCASE("training, affine") {
    check_gradients(
        [](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], in[2], {}, {}, true); }, {x, w, b});
  }
  SUBCASE("training, no affine, (N, C) input") {
    check_gradients([](const std::vector<Tensor>& in) { return batch_norm(in[0], {}, {}, {}, {}, true); },
                    {random_tensor({6, 4}, 4, -2, 2)});
  }
  SUBCASE("eval") {
    const Tensor rm = random_tensor({3}, 5), rv = random_tensor({3}, 6, 0.5, 2);
    check_gradients(
        [&](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], in[2], rm, rv, false); }, {x, w, b});
  }
}

TEST_CASE("norm: gradcheck of layer_norm over one and two trailing dims") {
  check_gradients([](const std::vector<Tensor>& in) { return layer_norm(in[0], 1, in[1], in[2]); },
                  {random_tensor({3, 4, 7}, 7, -2, 2), random_tensor({7}, 8, 0.5, 1.5), random_tensor({7}, 9)});
  check_gradients([](const std::vector<Tensor>& in) { return layer_norm(in[0], 2, in[1], {}); },
                  {random_tensor({3, 4, 5}, 10, -2, 2), random_tensor({4, 5}, 11, 0.5, 1.5)});
}

TEST_CASE("norm: layer_norm and its cotangents, alone and in one pass with γ's and β's, the same bits at 1 and 2 threads") {
  // 300 rows: three chunks of the γ/β column sums.
  const Tensor x = random_tensor({300, 70}, 21, -2, 2), gamma = random_tensor({70}, 22, 0.5, 1.5);
  const Tensor beta = random_tensor({70}, 23), u = random_tensor({300, 70}, 24);
  const auto run = [&](int threads) {
    const int before = num_threads();
    set_num_threads(threads);
    std::vector<Tensor> out = vjp([](const std::vector<Tensor>& in) { return layer_norm(in[0], 1, in[1], in[2]); },
                                  {x, gamma, beta}, u);
    // The input alone (γ and β frozen) takes the input's own pass.
    out.push_back(vjp([&](const std::vector<Tensor>& in) { return layer_norm(in[0], 1, gamma, beta); }, {x}, u)[0]);
    set_num_threads(before);
    return out;
  };
  const std::vector<Tensor> one = run(1), two = run(2);
  for (size_t i = 0; i < one.size(); ++i) {
    REQUIRE(max_abs(one[i]) > 0);
    CHECK(one[i].to_vector() == two[i].to_vector());
  }
  CHECK(one[0].to_vector() == one[3].to_vector());
}

TEST_CASE("norm: batch_norm matches the PyTorch goldens, running statistics included") {
  const Tensor u = golden_t("bn.u");
  SUBCASE("training") {
    auto in = leaves({golden_t("bn.x"), golden_t("bn.w"), golden_t("bn.b")});
    Tensor rm = golden_t("bn.running_mean0").clone(), rv = golden_t("bn.running_var0").clone();
    Tensor y = batch_norm(in[0], in[1], in[2], rm, rv, true, 0.1f, 1e-5f);
    check_close(y, golden_t("bn.train.y"), 1e-4, 1e-5, "bn train forward");
    check_close(rm, golden_t("bn.train.running_mean"), 1e-5, 1e-6, "bn running mean");
    check_close(rv, golden_t("bn.train.running_var"), 1e-5, 1e-6, "bn running var (unbiased)");
    auto g = grad(y, in, u);
    check_close(g[0], golden_t("bn.train.grad_x"), 1e-4, 1e-5, "bn train grad x");
    check_close(g[1], golden_t("bn.train.grad_w"), 1e-4, 1e-5, "bn train grad w");
    check_close(g[2], golden_t("bn.train.grad_b"), 1e-4, 1e-5, "bn train grad b");
    // The pullbacks against the detached-statistics surrogate; parameter grads unchanged.
    for (const Transport& t : {Transport::pullback(), Transport::soft_pullback()}) {
      auto p = grad(y, in, u, t);
      check_close(p[0], golden_t("bn.train.pullback_x"), 1e-4, 1e-5, "bn train pullback x");
      check_close(p[1], golden_t("bn.train.grad_w"), 1e-4, 1e-5, "bn train pullback w");
      check_close(p[2], golden_t("bn.train.grad_b"), 1e-4, 1e-5, "bn train pullback b");
    }
  }
  SUBCASE("eval") {
    auto in = leaves({golden_t("bn.x"), golden_t("bn.w"), golden_t("bn.b")});
    Tensor rm = golden_t("bn.running_mean0").clone(), rv = golden_t("bn.running_var0").clone();
    Tensor y = batch_norm(in[0], in[1], in[2], rm, rv, false);
    check_close(y, golden_t("bn.eval.y"), 1e-4, 1e-5, "bn eval forward");
    CHECK(rm.to_vector() == golden_t("bn.running_mean0").to_vector());  // eval leaves them alone
    auto g = grad(y, in, u);
    check_close(g[0], golden_t("bn.eval.grad_x"), 1e-4, 1e-5, "bn eval grad x");
    check_close(g[1], golden_t("bn.eval.grad_w"), 1e-4, 1e-5, "bn eval grad w");
    check_close(g[2], golden_t("bn.eval.grad_b"), 1e-4, 1e-5, "bn eval grad b");
  }
  SUBCASE("(N, C) input without affine or running statistics") {
    auto in = leaves({golden_t("bn2d.x")});
    Tensor y = batch_norm(in[0], {}, {}, {}, {}, true);
    check_close(y, golden_t("bn2d.y"), 1e-4, 1e-5, "bn2d forward");
    check_close(grad(y, in, golden_t("bn2d.u"))[0], golden_t("bn2d.grad_x"), 1e-4, 1e-5, "bn2d grad x");
  }
}

TEST_CASE("norm: layer_norm matches the PyTorch goldens") {
  for (const auto& [key, dims] : {std::pair{std::string("ln"), 1}, std::pair{std::string("ln2"), 2}}) {
    auto in = leaves({golden_t(key + ".x"), golden_t(key + ".w"), golden_t(key + ".b")});
    Tensor y = layer_norm(in[0], dims, in[1], in[2]);
    check_close(y, golden_t(key + ".y"), 1e-4, 1e-5, key + " forward");
    auto g = grad(y, in, golden_t(key + ".u"));
    check_close(g[0], golden_t(key + ".grad_x"), 1e-4, 1e-5, key + " grad x");
    check_close(g[1], golden_t(key + ".grad_w"), 1e-4, 1e-5, key + " grad w");
    check_close(g[2], golden_t(key + ".grad_b"), 1e-4, 1e-5, key + " grad b");
  }
  auto in = leaves({golden_t("ln.x"), golden_t("ln.w"), golden_t("ln.b")});
  Tensor y = layer_norm(in[0], 1, in[1], in[2]);
  for (const Transport& t : {Transport::pullback(), Transport::soft_pullback()}) {
    auto p = grad(y, in, golden_t("ln.u"), t);
    check_close(p[0], golden_t("ln.pullback_x"), 1e-4, 1e-5, "ln pullback x");
    check_close(p[1], golden_t("ln.grad_w"), 1e-4, 1e-5, "ln pullback w (unchanged)");
    check_close(p[2], golden_t("ln.grad_b"), 1e-4, 1e-5, "ln pullback b (unchanged)");
  }
}

TEST_CASE("norm: transports against their definitions") {
  const Tensor x = random_tensor({5, 3, 4}, 31, -3, 3), u = random_tensor({5, 3, 4}, 32);
  const Tensor w = random_tensor({3}, 33, 0.5, 1.5), b = random_tensor({3}, 34);
  const std::vector<float> xv = x.to_vector(), uv = u.to_vector(), wv = w.to_vector();

  SUBCASE("batch_norm in eval: pullback == soft pullback == gradient") {
    const Tensor rm = random_tensor({3}, 35), rv = random_tensor({3}, 36, 0.5, 2);
    auto in = leaves({x, w, b});
    Tensor y = batch_norm(in[0], in[1], in[2], rm, rv, false);
    auto g = grad(y, in, u);
    for (const Transport& t : kTransports) {
      auto p = grad(y, in, u, t);
      for (size_t i = 0; i < 3; ++i) check_close(p[i], g[i], 0, 0, cat("bn eval ", to_string(t.kind), " input ", i));
    }
  }
  SUBCASE("batch_norm in training: pullback = gamma/sigma · u; the gradient also centres") {
    auto in = leaves({x, w, b});
    Tensor y = batch_norm(in[0], in[1], in[2], {}, {}, true);
    const std::vector<double> invstd = channel_invstd(x, 1e-5);
    std::vector<float> expected(uv.size());
    for (size_t i = 0; i < uv.size(); ++i) {
      const size_t c = (i / 4) % 3;
      expected[i] = float(wv[c] * invstd[c] * uv[i]);
    }
    check_close(grad(y, in, u, Transport::pullback())[0], Tensor::from_vector(x.shape(), expected), 1e-5, 1e-6,
                "bn train pullback");
    check_close(grad(y, in, u, Transport::soft_pullback())[0], Tensor::from_vector(x.shape(), expected), 1e-5,
                1e-6, "bn train soft pullback");
    // The exact gradient is orthogonal to constants per channel (shifting a channel does
    // not change its normalised output); the pullback is not.
    std::vector<float> gx = grad(y, in, u)[0].to_vector();
    for (int64_t c = 0; c < 3; ++c) {
      double sum_g = 0, sum_p = 0;
      for (size_t i = 0; i < gx.size(); ++i)
        if (int64_t((i / 4) % 3) == c) sum_g += gx[i], sum_p += expected[i];
      CHECK(std::abs(sum_g) < 1e-4);
      CHECK(std::abs(sum_p) > 1e-2);
    }
  }
  SUBCASE("layer_norm: pullback = gamma/sigma · u with per-row sigma, no centring") {
    const Tensor lw = random_tensor({4}, 37, 0.5, 1.5), lb = random_tensor({4}, 38);
    const std::vector<float> lwv = lw.to_vector();
    auto in = leaves({x, lw, lb});
    Tensor y = layer_norm(in[0], 1, in[1], in[2]);
    std::vector<float> expected(uv.size());
    for (size_t r = 0; r < uv.size() / 4; ++r) {
      double s = 0, ss = 0;
      for (size_t j = 0; j < 4; ++j) s += xv[r * 4 + j];
      for (size_t j = 0; j < 4; ++j) ss += std::pow(xv[r * 4 + j] - s / 4, 2);
      const double invstd = 1 / std::sqrt(ss / 4 + 1e-5);
      for (size_t j = 0; j < 4; ++j) expected[r * 4 + j] = float(lwv[j] * invstd * uv[r * 4 + j]);
    }
    auto g = grad(y, in, u);
    for (const Transport& t : {Transport::pullback(), Transport::soft_pullback()}) {
      auto p = grad(y, in, u, t);
      check_close(p[0], Tensor::from_vector(x.shape(), expected), 1e-5, 1e-6, "ln pullback");
      check_close(p[1], g[1], 0, 0, "ln weight grad is transport-independent");
      check_close(p[2], g[2], 0, 0, "ln bias grad is transport-independent");
    }
  }
}

TEST_CASE("norm: bad shapes and modes are errors naming the op and shapes") {
  const Tensor x = Tensor::ones({2, 3, 4});
  CHECK_THROWS_WITH_AS(batch_norm(Tensor::ones({5}), {}, {}, {}, {}, true),
                       doctest::Contains("batch_norm: input [5] needs at least 2 dims"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, Tensor::ones({4}), {}, {}, {}, true),
                       doctest::Contains("batch_norm: weight [4] does not match the 3 channels of input [2, 3, 4]"),
                       Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, {}, {}, Tensor::zeros({2}), Tensor::ones({2}), true),
                       doctest::Contains("running_mean [2]"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(x, {}, {}, {}, {}, false), doctest::Contains("needs running statistics"), Error);
  CHECK_THROWS_WITH_AS(batch_norm(Tensor::ones({1, 3}), {}, {}, {}, {}, true),
                       doctest::Contains("more than one value per channel, input is [1, 3]"), Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, 1, Tensor::ones({3}), {}),
                       doctest::Contains("layer_norm: weight [3] does not match the normalised shape [4] of input "
                                         "[2, 3, 4]"),
                       Error);
  CHECK_THROWS_WITH_AS(layer_norm(x, 4, {}, {}), doctest::Contains("layer_norm: cannot normalise the last 4 dims"),
                       Error);
}

namespace {

// relu(batch_norm(x) + residual) recorded as the separate ops, and as one op with its tail.
struct TailCase {
  bool residual, relu;
};
Tensor composed_tail(const Args& a, const TailCase& c, Tensor rm, Tensor rv) {
  Tensor y = batch_norm(a[0], a[1], a[2], rm, rv, true);
  if (c.residual) y = add(y, a[3]);
  return c.relu ? relu(y) : y;
}
Tensor fused_tail(const Args& a, const TailCase& c, Tensor rm, Tensor rv) {
  return batch_norm(a[0], a[1], a[2], rm, rv, true, 0.1f, 1e-5f, {c.residual ? a[3] : Tensor(), c.relu});
}

std::string describe(const TailCase& c) {
  return cat(c.residual ? "+ residual" : "no residual", c.relu ? ", ReLU" : ", no ReLU");
}

}  // namespace

TEST_CASE("norm: batch_norm with its tail gives the separate ops' bits under every transport") {
  // An even batch: DeepLift reads [inputs; baselines].
  const Tensor x = random_tensor({4, 6, 5, 3}, 41, -2, 2), r = random_tensor({4, 6, 5, 3}, 42, -1, 1);
  const Tensor w = random_tensor({6}, 43, 0.5, 1.5), b = random_tensor({6}, 44), u = random_tensor({4, 6, 5, 3}, 45);
  Temperatures tau;
  tau.relu = 0.4f;
  const std::vector<Transport> transports = {Transport::gradient(), Transport::pullback(), Transport::soft_pullback(tau),
                                             Transport::guided(), Transport::deeplift()};
  for (const TailCase c : {TailCase{true, true}, TailCase{false, true}, TailCase{true, false}, TailCase{false, false}}) {
    INFO(describe(c));
    const Tensor rm1 = random_tensor({6}, 46), rv1 = random_tensor({6}, 47, 0.5, 2);
    const Tensor rm2 = rm1.clone(), rv2 = rv1.clone();
    for (bool gradient_only : {false, true}) {
      INFO(std::string(gradient_only ? "under GradientOnly" : "a full graph"));
      for (const Transport& t : transports) {
        INFO("transport ", std::string(to_string(t.kind)));
        const bool needs_input = t.kind == TransportKind::SoftPullback || t.kind == TransportKind::DeepLift;
        auto ins_a = leaves({x, w, b, r}), ins_b = leaves({x, w, b, r});
        Tensor ya, yb;
        {
          std::optional<GradientOnly> scope;
          if (gradient_only) scope.emplace();
          ya = composed_tail(ins_a, c, rm1, rv1);
          yb = fused_tail(ins_b, c, rm2, rv2);
        }
        check_close(yb, ya, 0, 0, "forward");
        check_close(rm2, rm1, 0, 0, "running mean");
        check_close(rv2, rv1, 0, 0, "running variance");
        const Args wrt_a = c.residual ? ins_a : Args(ins_a.begin(), ins_a.begin() + 3);
        const Args wrt_b = c.residual ? ins_b : Args(ins_b.begin(), ins_b.begin() + 3);
        if (gradient_only && c.relu && needs_input) {
          CHECK_THROWS_WITH_AS(grad(yb, wrt_b, u, t), doctest::Contains("GradientOnly"), Error);
          continue;
        }
        const std::vector<Tensor> ga = grad(ya, wrt_a, u, t), gb = grad(yb, wrt_b, u, t);
        for (size_t i = 0; i < ga.size(); ++i) check_close(gb[i], ga[i], 0, 0, cat("cotangent of input ", i));
        CHECK(max_abs(gb[0]) > 1e-3);
      }
    }
  }
}

TEST_CASE("norm: gradcheck of batch_norm with a residual and a ReLU as its tail") {
  check_gradients(
      [](const std::vector<Tensor>& in) { return batch_norm(in[0], in[1], in[2], {}, {}, true, 0.1f, 1e-5f, {in[3], true}); },
      {random_tensor({4, 3, 2, 3}, 51, -2, 2), random_tensor({3}, 52, 0.5, 1.5), random_tensor({3}, 53),
       random_tensor({4, 3, 2, 3}, 54)});
}

TEST_CASE("norm: batch_norm with its tail gives the same bits at 1 and 2 threads") {
  const Tensor x = random_tensor({3, 37, 9, 11}, 61, -2, 2), r = random_tensor({3, 37, 9, 11}, 62),
               w = random_tensor({37}, 63, 0.5, 1.5), b = random_tensor({37}, 64), u = random_tensor({3, 37, 9, 11}, 65);
  const auto run = [&](int threads) {
    set_num_threads(threads);
    auto in = leaves({x, w, b, r});
    Tensor y = batch_norm(in[0], in[1], in[2], {}, {}, true, 0.1f, 1e-5f, {in[3], true});
    std::vector<Tensor> out = grad(y, in, u);
    out.push_back(y);
    return out;
  };
  const int previous = num_threads();
  const std::vector<Tensor> one = run(1), two = run(2);
  set_num_threads(previous);
  for (size_t i = 0; i < one.size(); ++i) check_close(two[i], one[i], 0, 0, cat("output ", i));
}

TEST_CASE("norm: under GradientOnly the ReLU's gate read from bits gives the separate ops' bits") {
  // ops/gate_bits.h: rows shorter than a word, rows ending inside a word and rows of whole
  // words; the AVX-512 path and the plain one; 1 and 2 threads.
  const int previous = num_threads();
  for (const Shape& shape : {Shape{3, 5, 3, 3}, Shape{2, 7, 7, 7}, Shape{2, 3, 8, 8}})
    for (const VectorIsa isa : {cpu_vector_isa(), VectorIsa::Baseline})
      for (const int threads : {1, 2})
        for (const TailCase c : {TailCase{true, true}, TailCase{false, true}}) {
          INFO("x ", to_string(shape), ", ", describe(c), ", vector isa ", int(isa), ", threads ", threads);
          cap_vector_isa(isa);
          set_num_threads(threads);
          const int64_t C = shape[1];
          const Tensor x = random_tensor(shape, 71, -2, 2), r = random_tensor(shape, 72), u = random_tensor(shape, 73);
          const Tensor w = random_tensor({C}, 74, 0.5, 1.5), b = random_tensor({C}, 75);
          auto ins_a = leaves({x, w, b, r}), ins_b = leaves({x, w, b, r});
          Tensor ya, yb;
          {
            GradientOnly scope;
            ya = composed_tail(ins_a, c, random_tensor({C}, 76), random_tensor({C}, 77, 0.5, 2));
            yb = fused_tail(ins_b, c, random_tensor({C}, 76), random_tensor({C}, 77, 0.5, 2));
          }
          check_close(yb, ya, 0, 0, "forward");
          const std::vector<float> y = yb.to_vector();
          CHECK(std::count(y.begin(), y.end(), 0.0f) > int64_t(y.size()) / 5);  // the gate closes often
          const Args wrt_a = c.residual ? ins_a : Args(ins_a.begin(), ins_a.begin() + 3);
          const Args wrt_b = c.residual ? ins_b : Args(ins_b.begin(), ins_b.begin() + 3);
          const std::vector<Tensor> ga = grad(ya, wrt_a, u), gb = grad(yb, wrt_b, u);
          for (size_t i = 0; i < ga.size(); ++i) check_close(gb[i], ga[i], 0, 0, cat("cotangent of input ", i));
          CHECK(max_abs(gb[0]) > 1e-3);
        }
  cap_vector_isa(cpu_vector_isa());
  set_num_threads(previous);
}
