// The patch convolution on channels-last maps (ops/patch_conv.h) against the reference
// conv2d with kernel = stride on the same values laid out (B, C, H, W), under every
// transport and by finite differences.
#include <doctest/doctest.h>

#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/layout.h"
#include "ops/patch_conv.h"
#include "ops/reference/reference.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;
namespace ref = adjoint::reference;

TEST_CASE("patch conv: forward and every transport match the reference conv2d with kernel = stride") {
  struct Case {
    int64_t B, C, H, W, O, r;
  };
  uint64_t seed = 700;
  // Patches that tile the map; rows and columns left over; 1×1 patches; one patch.
  for (const Case& c : {Case{2, 5, 8, 12, 7, 4}, Case{1, 3, 7, 9, 4, 2}, Case{2, 6, 3, 3, 5, 1}, Case{1, 4, 5, 6, 3, 5}}) {
    INFO("B ", c.B, " C ", c.C, " H ", c.H, " W ", c.W, " O ", c.O, " r ", c.r);
    const int64_t OH = c.H / c.r, OW = c.W / c.r;
    const Tensor x = random_tensor({c.B, c.C, c.H, c.W}, seed++), w = random_tensor({c.O, c.C, c.r, c.r}, seed++);
    const Tensor b = random_tensor({c.O}, seed++), u = random_tensor({c.B, c.O, OH, OW}, seed++);
    const ref::ConvShape s{c.B, c.C, c.H, c.W, c.O, c.r, c.r, Conv2dOptions::square(c.r)};
    const ref::Values y_ref = ref::conv2d_forward(ref::values(x), ref::values(w), ref::values(b), s);
    const ref::ConvGrads g_ref = ref::conv2d_backward(ref::values(u), ref::values(x), ref::values(w), s);
    {
      NoGrad off;
      check_close(channels_first(patch_conv2d_channels_last(channels_last(x), w, b)),
                  ref::to_tensor(u.shape(), y_ref), 1e-5, 1e-5, "forward");
    }
    const auto f = [](const std::vector<Tensor>& in) { return patch_conv2d_channels_last(in[0], in[1], in[2]); };
    for (const Transport& t : {Transport::gradient(), Transport::pullback(), Transport::soft_pullback()}) {
      INFO("transport ", to_string(t.kind));
      const std::vector<Tensor> g = vjp(f, {channels_last(x), w, b}, channels_last(u), t);
      check_close(channels_first(g[0]), ref::to_tensor(x.shape(), g_ref.dx), 1e-5, 1e-5, "input cotangent");
      check_close(g[1], ref::to_tensor(w.shape(), g_ref.dw), 1e-4, 1e-4, "weight cotangent");
      check_close(g[2], ref::to_tensor(b.shape(), g_ref.dbias), 1e-4, 1e-4, "bias cotangent");
    }
  }
}

TEST_CASE("patch conv: gradients agree with finite differences; bad shapes are named") {
  const Tensor x = random_tensor({2, 5, 4, 3}, 31), w = random_tensor({4, 3, 2, 2}, 32), b = random_tensor({4}, 33);
  check_gradients([](const Args& a) { return patch_conv2d_channels_last(a[0], a[1], a[2]); }, {x, w, b});
  check_gradients([](const Args& a) { return patch_conv2d_channels_last(a[0], a[1]); }, {x, w});
  CHECK_THROWS_WITH_AS(patch_conv2d_channels_last(x, random_tensor({4, 2, 2, 2}, 1)),
                       doctest::Contains("weight must be (O, 3, r, r)"), Error);
  CHECK_THROWS_WITH_AS(patch_conv2d_channels_last(x, random_tensor({4, 3, 5, 5}, 1)),
                       doctest::Contains("a 5×4 map is smaller than its 5×5 patches"), Error);
}
