// The channels-last depth-wise convolution (ops/depthwise_conv.h) against the reference
// conv2d with groups = channels on the same values laid out (B, C, H, W), under every
// transport, by finite differences, and at one and two threads.
#include <doctest/doctest.h>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "ops/depthwise_conv.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/reference/reference.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;
namespace ref = adjoint::reference;

namespace {


std::vector<Transport> every_transport() {
  Temperatures t;
  t.relu = 0.4f, t.gelu = 0.7f, t.attention = 2.0f;
  return {Transport::gradient(), Transport::pullback(), Transport::soft_pullback(t), Transport::guided(),
          Transport::deeplift()};
}

}  // namespace

TEST_CASE("depthwise conv: forward and every transport match the reference grouped conv2d") {
  struct Case {
    int64_t B, C, H, W, k;
  };
  uint64_t seed = 900;
  // Channels off the vector width, more than one block of 64 channels, a 5×5 kernel, a map
  // smaller than the kernel.
  for (const Case& c : {Case{2, 19, 5, 7, 3}, Case{1, 70, 4, 3, 5}, Case{2, 3, 1, 1, 3}, Case{1, 16, 6, 6, 1}}) {
    INFO("B ", c.B, " C ", c.C, " H ", c.H, " W ", c.W, " k ", c.k);
    const Tensor x = random_tensor({c.B, c.C, c.H, c.W}, seed++), w = random_tensor({c.C, 1, c.k, c.k}, seed++, -0.5f, 0.5f);
    const Tensor b = random_tensor({c.C}, seed++), u = random_tensor({c.B, c.C, c.H, c.W}, seed++);
    const ref::ConvShape s{c.B, c.C, c.H, c.W, c.C, c.k, c.k, Conv2dOptions::square(1, c.k / 2, 1, c.C)};
    const ref::Values y_ref = ref::conv2d_forward(ref::values(x), ref::values(w), ref::values(b), s);
    const ref::ConvGrads g_ref = ref::conv2d_backward(ref::values(u), ref::values(x), ref::values(w), s);
    {
      NoGrad off;
      check_close(channels_first(depthwise_conv2d_channels_last(channels_last(x), w, b)),
                  ref::to_tensor(x.shape(), y_ref), 1e-5, 1e-5, "forward");
    }
    const auto f = [](const std::vector<Tensor>& in) { return depthwise_conv2d_channels_last(in[0], in[1], in[2]); };
    for (const Transport& t : every_transport()) {
      INFO("transport ", to_string(t.kind));
      const std::vector<Tensor> g = vjp(f, {channels_last(x), w, b}, channels_last(u), t);
      check_close(channels_first(g[0]), ref::to_tensor(x.shape(), g_ref.dx), 1e-5, 1e-5, "input cotangent");
      check_close(g[1], ref::to_tensor(w.shape(), g_ref.dw), 1e-4, 1e-4, "weight cotangent");
      check_close(g[2], ref::to_tensor(b.shape(), g_ref.dbias), 1e-4, 1e-4, "bias cotangent");
      // The input alone (a frozen layer, as explanations see it) takes its own pass.
      const auto input_only = [&](const std::vector<Tensor>& in) { return depthwise_conv2d_channels_last(in[0], w, b); };
      check_close(channels_first(vjp(input_only, {channels_last(x)}, channels_last(u), t)[0]),
                  ref::to_tensor(x.shape(), g_ref.dx), 1e-5, 1e-5, "input cotangent of a frozen layer");
    }
  }
}

TEST_CASE("depthwise conv: gradients agree with finite differences, without a bias too") {
  const Tensor x = random_tensor({2, 4, 5, 6}, 31), w = random_tensor({6, 1, 3, 3}, 32), b = random_tensor({6}, 33);
  check_gradients([](const Args& a) { return depthwise_conv2d_channels_last(a[0], a[1], a[2]); }, {x, w, b});
  check_gradients([](const Args& a) { return depthwise_conv2d_channels_last(a[0], a[1]); }, {x, w});
}

TEST_CASE("depthwise conv: the same bits at one and two threads; bad shapes are named") {
  const Tensor x = random_tensor({3, 9, 8, 130}, 41), w = random_tensor({130, 1, 3, 3}, 42), b = random_tensor({130}, 43);
  const Tensor u = random_tensor({3, 9, 8, 130}, 44);
  const auto run = [&](int threads) {
    const int before = num_threads();
    set_num_threads(threads);
    const auto f = [](const std::vector<Tensor>& in) { return depthwise_conv2d_channels_last(in[0], in[1], in[2]); };
    std::vector<Tensor> out = vjp(f, {x, w, b}, u, Transport::gradient());
    NoGrad off;
    out.push_back(depthwise_conv2d_channels_last(x, w, b));
    set_num_threads(before);
    return out;
  };
  const std::vector<Tensor> one = run(1), two = run(2);
  for (size_t i = 0; i < one.size(); ++i) CHECK(one[i].to_vector() == two[i].to_vector());
  CHECK_THROWS_WITH_AS(depthwise_conv2d_channels_last(x, random_tensor({130, 1, 2, 2}, 1)),
                       doctest::Contains("weight must be (130, 1, k, k) with k odd"), Error);
  CHECK_THROWS_WITH_AS(depthwise_conv2d_channels_last(x, w, random_tensor({3}, 1)),
                       doctest::Contains("bias must be (130), got [3]"), Error);
}

TEST_CASE("depthwise conv then an activation: the two ops' bits in one op, forward and under every transport") {
  const Tensor x = random_tensor({2, 5, 6, 70}, 51, -2.0f, 2.0f), w = random_tensor({70, 1, 3, 3}, 52);
  const Tensor b = random_tensor({70}, 53), u = random_tensor({2, 5, 6, 70}, 54);
  for (Activation act : {Activation::Gelu, Activation::Relu, Activation::Silu}) {
    INFO(to_string(act));
    {
      NoGrad off;
      const Tensor fused = depthwise_conv2d_channels_last(x, w, b, act);
      CHECK(fused.to_vector() == activation(depthwise_conv2d_channels_last(x, w, b), act).to_vector());
      REQUIRE(max_abs(fused) > 0);
      const int before = num_threads();
      set_num_threads(before == 1 ? 2 : 1);
      CHECK(depthwise_conv2d_channels_last(x, w, b, act).to_vector() == fused.to_vector());
      set_num_threads(before);
    }
    const auto fused = [act](const std::vector<Tensor>& in) {
      return depthwise_conv2d_channels_last(in[0], in[1], in[2], act);
    };
    const auto composed = [act](const std::vector<Tensor>& in) {
      return activation(depthwise_conv2d_channels_last(in[0], in[1], in[2]), act);
    };
    // The input alone in the graph (a frozen layer, as explanations see it): its own pass.
    const auto fused_input = [&](const std::vector<Tensor>& in) { return fused({in[0], w, b}); };
    const auto composed_input = [&](const std::vector<Tensor>& in) { return composed({in[0], w, b}); };
    for (const Transport& t : every_transport()) {
      INFO("transport ", to_string(t.kind));
      const std::vector<Tensor> got = vjp(fused, {x, w, b}, u, t), want = vjp(composed, {x, w, b}, u, t);
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        REQUIRE(max_abs(want[i]) > 0);
        CHECK_MESSAGE(got[i].to_vector() == want[i].to_vector(), "cotangent ", i);
      }
      CHECK(vjp(fused_input, {x}, u, t)[0].to_vector() == vjp(composed_input, {x}, u, t)[0].to_vector());
    }
  }
}

TEST_CASE("depthwise conv with a bias on its input: the composed ops' bits, the bias's sum within rounding") {
  struct Case {
    int64_t B, H, W, C, k;
  };
  uint64_t seed = 60;
  for (const Case& c : {Case{2, 5, 6, 70, 3}, Case{2, 9, 4, 19, 5}}) {
    INFO("B ", c.B, " H ", c.H, " W ", c.W, " C ", c.C, " k ", c.k);
    const Tensor x = random_tensor({c.B, c.H, c.W, c.C}, seed++, -2.0f, 2.0f);
    const Tensor w = random_tensor({c.C, 1, c.k, c.k}, seed++), b = random_tensor({c.C}, seed++);
    const Tensor xb = random_tensor({c.C}, seed++), u = random_tensor({c.B, c.H, c.W, c.C}, seed++);
    const auto fused = [](const std::vector<Tensor>& in) {
      return depthwise_conv2d_channels_last(in[0], in[1], in[2], Activation::Gelu, in[3]);
    };
    const auto composed = [](const std::vector<Tensor>& in) {
      const Tensor shifted = in[0] + broadcast_to(in[3], in[0].shape());
      return activation(depthwise_conv2d_channels_last(shifted, in[1], in[2]), Activation::Gelu);
    };
    {
      NoGrad off;
      CHECK(fused({x, w, b, xb}).to_vector() == composed({x, w, b, xb}).to_vector());
    }
    for (const Transport& t : every_transport()) {
      INFO("transport ", to_string(t.kind));
      const std::vector<Tensor> got = vjp(fused, {x, w, b, xb}, u, t), want = vjp(composed, {x, w, b, xb}, u, t);
      for (size_t i = 0; i < 3; ++i) CHECK_MESSAGE(got[i].to_vector() == want[i].to_vector(), "cotangent ", i);
      REQUIRE(max_abs(want[3]) > 0);
      check_close(got[3], want[3], 1e-5, 1e-5 * max_abs(want[3]), "input bias cotangent");
    }
  }
  const Tensor x = random_tensor({2, 4, 5, 6}, 71), w = random_tensor({6, 1, 3, 3}, 72);
  const Tensor b = random_tensor({6}, 73), xb = random_tensor({6}, 74);
  check_gradients(
      [](const Args& a) { return depthwise_conv2d_channels_last(a[0], a[1], a[2], Activation::Gelu, a[3]); },
      {x, w, b, xb});
  CHECK_THROWS_WITH_AS(depthwise_conv2d_channels_last(x, w, b, Activation::Gelu, random_tensor({5}, 1)),
                       doctest::Contains("input_bias must be (6), got [5]"), Error);
}

TEST_CASE("depthwise conv with an activation and an input bias: the same bits at one and two threads") {
  // Enough rows that the backward's chunks of rows fall differently on one and two threads.
  const Tensor x = random_tensor({3, 20, 8, 130}, 81), w = random_tensor({130, 1, 3, 3}, 82);
  const Tensor b = random_tensor({130}, 83), xb = random_tensor({130}, 84), u = random_tensor({3, 20, 8, 130}, 85);
  const auto run = [&](int threads, const Transport& t) {
    const int before = num_threads();
    set_num_threads(threads);
    const auto f = [](const std::vector<Tensor>& in) {
      return depthwise_conv2d_channels_last(in[0], in[1], in[2], Activation::Gelu, in[3]);
    };
    std::vector<Tensor> out = vjp(f, {x, w, b, xb}, u, t);
    set_num_threads(before);
    return out;
  };
  for (const Transport& t : {Transport::gradient(), Transport::soft_pullback()}) {
    const std::vector<Tensor> one = run(1, t), two = run(2, t);
    for (size_t i = 0; i < one.size(); ++i) CHECK(one[i].to_vector() == two[i].to_vector());
  }
}

TEST_CASE("depthwise conv then GELU recorded for a training step: the derivative kept, the gradient's bits") {
  const Tensor x0 = random_tensor({2, 5, 6, 70}, 91, -2.0f, 2.0f), w0 = random_tensor({70, 1, 3, 3}, 92);
  const Tensor b0 = random_tensor({70}, 93), xb0 = random_tensor({70}, 94), u = random_tensor({2, 5, 6, 70}, 95);
  for (Activation act : {Activation::Gelu, Activation::Silu, Activation::Relu}) {
    INFO(to_string(act));
    const auto leaves = [&] {
      std::vector<Tensor> in = {x0.clone(), w0.clone(), b0.clone(), xb0.clone()};
      for (Tensor& t : in) t.requires_grad_();
      return in;
    };
    std::vector<Tensor> want, got;
    {
      GradientOnly training;
      const std::vector<Tensor> in = leaves();
      const Tensor y = activation(depthwise_conv2d_channels_last(in[0] + broadcast_to(in[3], in[0].shape()), in[1], in[2]), act);
      want = grad(y, in, u);
    }
    {
      GradientOnly training;
      const std::vector<Tensor> in = leaves();
      got = grad(depthwise_conv2d_channels_last(in[0], in[1], in[2], act, in[3]), in, u);
    }
    for (size_t i = 0; i < 3; ++i) {
      REQUIRE(max_abs(want[i]) > 0);
      CHECK_MESSAGE(got[i].to_vector() == want[i].to_vector(), "cotangent ", i);
    }
    check_close(got[3], want[3], 1e-5, 1e-5 * max_abs(want[3]), "input bias cotangent");
    if (act == Activation::Relu) continue;  // ReLU keeps its input: its rule selects
    GradientOnly training;
    const std::vector<Tensor> in = leaves();
    const Tensor y = depthwise_conv2d_channels_last(in[0], in[1], in[2], act, in[3]);
    CHECK_THROWS_WITH_AS(grad(y, {in[0]}, u, Transport::soft_pullback()),
                         doctest::Contains("recorded under GradientOnly (a training step), which keeps the"), Error);
  }
}
