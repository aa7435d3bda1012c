// conv2d and the pools: gradients, PyTorch goldens (tests/goldens/gen_conv.py), the
// max-pool transports (docs/methods.md §1.2), the backward's skipped work, bad shapes.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "engine/autograd.h"
#include "engine/flops.h"
#include "engine/error.h"
#include "engine/random.h"
#include "engine/recording_scope.h"
#include "engine/threads.h"
#include "engine/vectorize.h"
#include "ops/activation.h"
#include "ops/conv.h"
#include "ops/conv/geometry.h"
#include "ops/conv/winograd_f4_weight_grad.h"
#include "ops/elementwise.h"
#include "ops/norm.h"
#include "ops/pool.h"
#include "ops/reference/reference.h"
#include "tests/golden_case.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

// A convolution's input and weight shapes and options.
struct ConvCase {
  Shape x, w;
  Conv2dOptions options;
};

// One case per forward path of conv2d: the direct kernels (small maps, stride 2), Winograd (3x3
// stride 1), one image per GEMM in row tiles (large images), blocks of images through a staging
// matrix (small images), 1x1 read in place.
std::vector<ConvCase> forward_path_cases() {
  return {
      {{3, 16, 12, 12}, {20, 16, 3, 3}, Conv2dOptions::square(1, 1)},
      {{2, 32, 20, 20}, {40, 32, 3, 3}, Conv2dOptions::square(1, 1)},
      {{2, 8, 41, 41}, {6, 8, 3, 3}, Conv2dOptions::square(2, 1)},
      {{5, 8, 6, 6}, {12, 8, 3, 3}, Conv2dOptions::square(2, 1)},
      {{2, 8, 10, 10}, {6, 8, 1, 1}, Conv2dOptions::square(1, 0)},
  };
}

Fn conv_with(Conv2dOptions options) {
  return [options](const std::vector<Tensor>& in) {
    return conv2d(in[0], in[1], in.size() > 2 ? in[2] : Tensor(), options);
  };
}

// Values spaced 0.05 apart in a random order: no two within a gradcheck step of each other,
// so no window's arg-max can flip under the finite differences.
Tensor distinct_values(const Shape& shape, uint64_t seed) {
  Generator gen(seed);
  const std::vector<int64_t> order = permutation(numel(shape), gen);
  std::vector<float> v(order.size());
  for (size_t i = 0; i < v.size(); ++i) v[i] = 0.05f * static_cast<float>(order[i]) - 1.0f;
  return Tensor::from_vector(shape, v);
}

Transport soft(float tau) {
  Temperatures t;
  t.max_pool = tau;
  return Transport::soft_pullback(t);
}

// Every entry within tol·(1 + |expected|), and where scale_tol is given, also within
// scale_tol times the expected values' root mean square.
void check_against(const Tensor& actual, const std::vector<double>& expected, double tol, const std::string& what,
                   double scale_tol = 0) {
  std::vector<float> e(expected.begin(), expected.end());
  double squares = 0;
  for (double v : expected) squares += v * v;
  const double rms = expected.empty() ? 0.0 : std::sqrt(squares / static_cast<double>(expected.size()));
  check_close(actual, Tensor::from_vector(actual.shape(), e), tol, tol + scale_tol * rms, what);
}

// Winograd F(4×4, 3×3)'s stated accuracy against the reference: every output and input
// gradient within this fraction of the result's root mean square. Its sums over input
// channels add transformed values several times the outputs' size, so float32 rounding
// leaves an error that grows with the channels and the outputs' scale rather than with each
// output's own size: about 7e-5 of the RMS at 264 channels of U(−1, 1) data.
constexpr double kWinogradF4Tolerance = 2e-4;

struct ThreadCount {
  int saved = num_threads();
  ~ThreadCount() { set_num_threads(saved); }
};

// A case's random input, weights and cotangent, the convolution's output, and the reference
// convolution's gradients (ops/reference/conv2d.cpp, in double: shapes too large for a fixture
// exercise the row tiles).
struct ReferenceProblem {
  Tensor x, w;
  Fn f;
  Tensor y, u;
  reference::ConvShape shape;
  reference::ConvGrads ref;
};

ReferenceProblem reference_problem(const ConvCase& c, uint64_t& seed) {
  ReferenceProblem p;
  p.x = random_tensor(c.x, seed++);
  p.w = random_tensor(c.w, seed++);
  p.f = conv_with(c.options);
  {
    NoGrad no_grad;
    p.y = p.f({p.x, p.w});
  }
  p.u = random_tensor(p.y.shape(), seed++);
  p.shape = reference::ConvShape{c.x[0], c.x[1], c.x[2], c.x[3], c.w[0], c.w[2], c.w[3], c.options};
  p.ref = reference::conv2d_backward(reference::values(p.u), reference::values(p.x), reference::values(p.w), p.shape);
  return p;
}

// Checks the conv of case `c` against the reference convolution on random x, w and u (seeds
// from `seed` on): the forward pass within `tolerance`, the input and weight cotangents of
// u under each of `transports` within `tolerance` and `weight_tolerance` (a conv is linear
// in x and in w, so every transport is its gradient).
void check_against_reference_conv(const ConvCase& c, uint64_t& seed, double tolerance, double weight_tolerance,
                                  const std::vector<Transport>& transports, double scale_tolerance = 0) {
  INFO("x ", to_string(c.x), " w ", to_string(c.w));
  const ReferenceProblem p = reference_problem(c, seed);
  check_against(p.y, reference::conv2d_forward(reference::values(p.x), reference::values(p.w), {}, p.shape), tolerance,
                "forward", scale_tolerance);
  for (const Transport& t : transports) {
    const auto g = vjp(p.f, {p.x, p.w}, p.u, t);
    check_against(g[0], p.ref.dx, tolerance, "input cotangent", scale_tolerance);
    check_against(g[1], p.ref.dw, weight_tolerance, "weight cotangent");
  }
}

// f's value and its vjp (for a cotangent drawn with `seed`) give the same bits at 1 and 2 threads.
void check_same_bits_at_one_and_two_threads(const Fn& f, const std::vector<Tensor>& inputs, uint64_t seed) {
  Tensor y1, y2;
  {
    NoGrad no_grad;
    set_num_threads(1);
    y1 = f(inputs);
    set_num_threads(2);
    y2 = f(inputs);
  }
  CHECK(y1.to_vector() == y2.to_vector());
  const Tensor u = random_tensor(y1.shape(), seed);
  set_num_threads(1);
  const auto one = vjp(f, inputs, u);
  set_num_threads(2);
  const auto two = vjp(f, inputs, u);
  REQUIRE(one.size() == two.size());
  for (size_t i = 0; i < one.size(); ++i) CHECK(one[i].to_vector() == two[i].to_vector());
}

}  // namespace

TEST_CASE("conv2d: gradients across strides, padding, dilation, groups and 1x1") {
  const std::vector<ConvCase> cases = {
      {{2, 3, 5, 5}, {4, 3, 3, 3}, Conv2dOptions::square(1, 1)},
      {{2, 2, 7, 6}, {3, 2, 3, 2}, {2, 1, 1, 2, 2, 1, 1}},  // stride 2x1, padding 1x2, dilation 2x1
      {{1, 4, 5, 5}, {6, 2, 3, 3}, Conv2dOptions::square(1, 1, 1, 2)},
      {{3, 4, 3, 3}, {5, 4, 1, 1}, {}},                                 // 1x1: images folded into one GEMM
      {{1, 2, 32, 32}, {2, 2, 1, 1}, {}},                               // 1x1: one image, no copies
      {{2, 1, 32, 32}, {2, 1, 3, 3}, Conv2dOptions::square(1, 1)},      // one image per GEMM, 2 partials
      {{2, 3, 5, 5}, {3, 1, 3, 3}, Conv2dOptions::square(2, 1, 1, 3)},  // depthwise, strided
      {{1, 16, 4, 5}, {16, 16, 3, 3}, Conv2dOptions::square(1, 1)},     // Winograd
  };
  uint64_t seed = 100;
  for (const ConvCase& c : cases) {
    INFO("x ", to_string(c.x), " w ", to_string(c.w));
    check_gradients(conv_with(c.options),
                    {random_tensor(c.x, seed++), random_tensor(c.w, seed++), random_tensor({c.w[0]}, seed++)});
  }
}

TEST_CASE("conv2d: matches PyTorch (forward, input, weight and bias gradients)") {
  check_golden_case("conv", "conv.basic", 3, conv_with(Conv2dOptions::square(1, 1)));
  check_golden_case("conv", "conv.strided", 3, conv_with({2, 1, 1, 1, 2, 1, 1}));
  check_golden_case("conv", "conv.stride2", 3, conv_with(Conv2dOptions::square(2, 1)));
  check_golden_case("conv", "conv.groups", 3, conv_with(Conv2dOptions{}.with_groups(2)));
  check_golden_case("conv", "conv.pointwise", 3, conv_with({}));
  check_golden_case("conv", "conv.pointwise_wide", 3, conv_with({}));
  check_golden_case("conv", "conv.wide", 3, conv_with(Conv2dOptions::square(1, 1)));
  check_golden_case("conv", "conv.strided_1x1", 3, conv_with(Conv2dOptions::square(2)));
  check_golden_case("conv", "conv.depthwise", 3, conv_with(Conv2dOptions::square(1, 2, 2, 3)));
  check_golden_case("conv", "conv.winograd", 3, conv_with(Conv2dOptions::square(1, 1)));
}

TEST_CASE("conv2d: row tiles and Winograd tiles match a direct convolution") {
  // Deep or large images: the column matrix of a whole image exceeds the cache budget, so
  // each image runs as several GEMMs over bands of output rows (flat and strided copies).
  const std::vector<ConvCase> cases = {
      {{3, 128, 20, 20}, {8, 128, 3, 3}, Conv2dOptions::square(1, 1)},
      {{2, 128, 41, 41}, {6, 128, 3, 3}, Conv2dOptions::square(2, 1)},
      {{2, 128, 20, 20}, {8, 64, 3, 3}, Conv2dOptions::square(1, 2, 2, 2)},
      {{2, 16, 48, 48}, {4, 16, 3, 3}, Conv2dOptions::square(1, 1)},  // large images: tiles in backward too
      {{1, 8, 81, 81}, {4, 8, 3, 3}, Conv2dOptions::square(2, 1)},
      // Winograd F(2x2, 3x3): odd sizes (clipped edge tiles), every padding, bands of tile rows.
      {{2, 16, 11, 13}, {16, 16, 3, 3}, Conv2dOptions::square(1, 1)},
      {{2, 24, 9, 8}, {20, 24, 3, 3}, Conv2dOptions::square(1, 0)},
      {{1, 16, 7, 7}, {16, 16, 3, 3}, Conv2dOptions::square(1, 2)},
      {{1, 128, 13, 13}, {128, 128, 3, 3}, Conv2dOptions::square(1, 1)},
      // The weights' transform written straight into the packed layout: two depth blocks
      // (256 + 8 channels) and a partial panel of rows (260 = 21·12 + 8), both ways round;
      // 144 tiles, over the fewest that large weights run Winograd for.
      {{4, 264, 12, 12}, {260, 264, 3, 3}, Conv2dOptions::square(1, 1)},
  };
  // Winograd F(4x4, 3x3) (maps of 14 and more), held to kWinogradF4Tolerance: clipped edge
  // tiles both ways, every padding, several images a block, bands of tile rows in one image,
  // and its weights' packed transform over two depth blocks and a partial panel. (Maps
  // wider than 32 or more than 32 channels: the direct kernels take narrower layers.)
  const std::vector<ConvCase> f4_cases = {
      {{2, 16, 29, 34}, {16, 16, 3, 3}, Conv2dOptions::square(1, 1)},
      {{1, 24, 31, 35}, {20, 24, 3, 3}, Conv2dOptions::square(1, 0)},
      {{1, 16, 28, 33}, {16, 16, 3, 3}, Conv2dOptions::square(1, 2)},
      {{3, 40, 28, 28}, {48, 40, 3, 3}, Conv2dOptions::square(1, 1)},
      {{1, 128, 40, 40}, {16, 128, 3, 3}, Conv2dOptions::square(1, 1)},
      {{1, 16, 70, 66}, {16, 16, 3, 3}, Conv2dOptions::square(1, 1)},
      {{1, 264, 28, 28}, {260, 264, 3, 3}, Conv2dOptions::square(1, 1)},
      {{3, 64, 14, 15}, {72, 64, 3, 3}, Conv2dOptions::square(1, 1)},  // four rows of tiles a vector
  };
  const auto check_all = [&] {
    uint64_t seed = 700;
    for (const ConvCase& c : cases) check_against_reference_conv(c, seed, 1e-4, 1e-3, {Transport::gradient()});
    for (const ConvCase& c : f4_cases) {
      const Tensor x = random_tensor(c.x, 0), w = random_tensor(c.w, 0);  // for their shapes
      CHECK(conv2d_algorithm(x, w, c.options) == ConvAlgorithm::WinogradF4);
      CHECK(conv2d_algorithm(x, w, c.options, true) == ConvAlgorithm::WinogradF4);
      check_against_reference_conv(c, seed, 1e-4, 1e-3, {Transport::gradient()}, kWinogradF4Tolerance);
    }
  };
  check_all();
  // Without AVX-512 (or capped below it), narrow layers run Winograd and im2col with
  // OpenBLAS's kernels instead of the direct kernels and the engine's GEMM: the same cases.
  if (cpu_vector_isa() == VectorIsa::Avx512) {
    cap_vector_isa(VectorIsa::Avx2);
    check_all();
    cap_vector_isa(VectorIsa::Avx512);  // back to the CPU's widest
  }
}

TEST_CASE("conv2d: Winograd F(4x4)'s weight gradient matches a direct convolution, finite differences and itself at 2 threads") {
  // ops/conv/winograd_f4_weight_grad.cpp, held to kWinogradF4Tolerance of the gradient's root
  // mean square (its sums add transformed values several times the result's size): several
  // image blocks added as partial sums, bands of tile rows in one image, clipped edge tiles,
  // paddings 0 and 2, four rows of tiles a vector (a 14-wide map), and O·C not a multiple of
  // 16 (the transform back to 3x3 kernels ends pair by pair). More than 32 channels: the
  // direct kernels take narrower layers.
  const std::vector<ConvCase> cases = {
      {{8, 40, 28, 28}, {36, 40, 3, 3}, Conv2dOptions::square(1, 1)},
      {{1, 40, 74, 70}, {48, 40, 3, 3}, Conv2dOptions::square(1, 1)},
      {{8, 36, 31, 35}, {37, 36, 3, 3}, Conv2dOptions::square(1, 0)},
      {{4, 41, 29, 30}, {37, 41, 3, 3}, Conv2dOptions::square(1, 2)},
      {{16, 64, 14, 15}, {72, 64, 3, 3}, Conv2dOptions::square(1, 1)},
  };
  uint64_t seed = 900;
  const auto check_case = [&](const ConvCase& c) {
    INFO("x ", to_string(c.x), " w ", to_string(c.w), ", vector isa ", int(vector_isa()));
    const ReferenceProblem p = reference_problem(c, seed);
    REQUIRE(conv2d_algorithm(p.x, p.w, c.options) == ConvAlgorithm::WinogradF4);
    REQUIRE(conv::winograd_f4_weight_gradient_applies(conv::make_geometry(p.x, p.w, Tensor(), c.options)));
    const reference::ConvGrads& ref = p.ref;
    const std::vector<float> dw = vjp(p.f, {p.x, p.w}, p.u)[1].to_vector();
    double squares = 0, worst = 0;
    for (size_t i = 0; i < ref.dw.size(); ++i) {
      squares += ref.dw[i] * ref.dw[i];
      worst = std::max(worst, std::abs(dw[i] - ref.dw[i]));
    }
    const double rms = std::sqrt(squares / static_cast<double>(ref.dw.size()));
    INFO("largest error ", worst, ", the gradient's RMS ", rms);
    CHECK(rms > 0);
    CHECK(worst <= kWinogradF4Tolerance * rms);
  };
  for (const ConvCase& c : cases) check_case(c);
  // Without AVX-512 the transforms run a tile at a time and the products on OpenBLAS.
  if (cpu_vector_isa() == VectorIsa::Avx512) {
    cap_vector_isa(VectorIsa::Avx2);
    for (const ConvCase& c : cases) check_case(c);
    cap_vector_isa(VectorIsa::Avx512);
  }
  // Below its fewest tiles a batch keeps F(2x2)'s weight gradient: 8 images of 14x14, 128 tiles.
  CHECK_FALSE(conv::winograd_f4_weight_gradient_applies(conv::make_geometry(
      random_tensor({8, 64, 14, 14}, 0), random_tensor({64, 64, 3, 3}, 0), Tensor(), Conv2dOptions::square(1, 1))));
  // Finite differences of the weights (the input's gradient is not this kernel's). The
  // convolution is linear in w, so a wide step is exact but for rounding, whose share it
  // shrinks (F(4x4)'s forward rounds to about 1e-5 of the outputs' RMS).
  GradCheckOptions linear;
  linear.eps = 0.5;
  const Tensor fd_x = random_tensor({1, 16, 64, 64}, seed++), fd_w = random_tensor({16, 16, 3, 3}, seed++);
  REQUIRE(conv::winograd_f4_weight_gradient_applies(conv::make_geometry(fd_x, fd_w, Tensor(), Conv2dOptions::square(1, 1))));
  check_gradients(conv_with(Conv2dOptions::square(1, 1)), {fd_x, fd_w}, linear, {false, true});
  // Its blocks and partial sums depend on the shape only.
  ThreadCount restore;
  for (size_t i = 0; i < 2; ++i)
    check_same_bits_at_one_and_two_threads(conv_with(cases[i].options),
                                           {random_tensor(cases[i].x, seed++), random_tensor(cases[i].w, seed++)},
                                           seed++);
}

TEST_CASE("conv2d: the direct kernels for narrow layers match a direct convolution" *
          doctest::skip(cpu_vector_isa() != VectorIsa::Avx512)) {
  // ops/conv/direct.cpp. By rows: up to 32 channels, maps 12 to 32 wide, stride 1; blocks of
  // 8 and 12 output channels (with a partial last block), one and two vectors per row, tiles
  // of 1, 2 and 3 rows, padding smaller and larger than the kernel's half, non-square kernels.
  const std::vector<ConvCase> cases = {
      {{2, 16, 28, 28}, {16, 16, 3, 3}, Conv2dOptions::square(1, 1)},
      {{3, 20, 14, 14}, {20, 20, 3, 3}, Conv2dOptions::square(1, 1)},
      {{2, 8, 12, 17}, {24, 8, 3, 3}, Conv2dOptions::square(1, 1)},
      {{2, 32, 16, 16}, {32, 32, 5, 5}, Conv2dOptions::square(1, 2)},
      {{2, 6, 20, 20}, {5, 6, 3, 3}, Conv2dOptions::square(1, 0)},
      {{1, 4, 32, 32}, {8, 4, 1, 1}, {}},
      {{2, 12, 13, 30}, {16, 12, 3, 5}, {1, 1, 1, 2, 1, 1, 1}},
      {{2, 16, 14, 14}, {16, 16, 3, 3}, Conv2dOptions::square(1, 1)},  // 8 channels × 3 rows of one vector
      // By channels (32 per tile): strided layers, and small maps in tiles of 1 to 3 rows
      // of 1 to 14 positions.
      {{2, 16, 28, 28}, {32, 16, 3, 3}, Conv2dOptions::square(2, 1)},
      {{2, 32, 13, 13}, {64, 32, 3, 3}, Conv2dOptions::square(2, 1)},
      {{2, 8, 9, 11}, {32, 8, 3, 3}, Conv2dOptions::square(2, 0)},
      {{3, 64, 7, 7}, {64, 64, 3, 3}, Conv2dOptions::square(1, 1)},
      {{2, 128, 4, 4}, {32, 128, 3, 3}, Conv2dOptions::square(1, 1)},
      {{2, 32, 6, 5}, {64, 32, 3, 3}, Conv2dOptions::square(1, 1)},
      {{2, 32, 3, 3}, {32, 32, 3, 3}, Conv2dOptions::square(1, 1)},
      {{2, 32, 8, 8}, {32, 32, 5, 5}, Conv2dOptions::square(1, 2)},
  };
  uint64_t seed = 900;
  for (const ConvCase& c : cases) check_against_reference_conv(c, seed, 1e-4, 1e-3, {Transport::gradient()});
  // The same bits at 1 and 2 threads.
  ThreadCount restore;
  const Tensor x = random_tensor({4, 16, 28, 28}, 950), w = random_tensor({16, 16, 3, 3}, 951);
  set_num_threads(1);
  const std::vector<float> one = conv2d(x, w, {}, Conv2dOptions::square(1, 1)).to_vector();
  set_num_threads(2);
  CHECK(conv2d(x, w, {}, Conv2dOptions::square(1, 1)).to_vector() == one);
}

TEST_CASE("conv2d: kernel taps that meet only padding are cut, and their weight gradient is zero") {
  // A 3×3 conv over a 1×1 map is its centre tap; a 5×5 conv padded by 2 over 2×2 maps
  // reads only its middle 3×3; with stride 2 too. Against the direct convolution, and by
  // central differences.
  const std::vector<ConvCase> cases = {
      {{4, 16, 1, 1}, {8, 16, 3, 3}, Conv2dOptions::square(1, 1)},  // Winograd-sized channels
      {{2, 3, 1, 1}, {4, 3, 3, 3}, Conv2dOptions::square(1, 1)},
      {{2, 3, 2, 2}, {4, 3, 5, 5}, Conv2dOptions::square(1, 2)},
      {{2, 3, 1, 3}, {4, 3, 3, 3}, Conv2dOptions::square(2, 1)},  // rows cut, columns kept
  };
  uint64_t seed = 900;
  for (const ConvCase& c : cases) {
    check_against_reference_conv(c, seed, 1e-5, 1e-5,
                              {Transport::gradient(), Transport::pullback(), Transport::soft_pullback()});
    check_gradients(conv_with(c.options), {random_tensor(c.x, seed++), random_tensor(c.w, seed++),
                                           random_tensor({c.w[0]}, seed++)});
  }
  // The cut taps' gradient is exactly zero (the corner taps of the 1×1 case).
  const Tensor x = random_tensor({2, 3, 1, 1}, 950), w = random_tensor({4, 3, 3, 3}, 951);
  const Tensor dw = vjp(conv_with(Conv2dOptions::square(1, 1)), {x, w}, random_tensor({2, 4, 1, 1}, 952))[1].contiguous();
  double corners = 0, centre = 0;
  for (int64_t i = 0; i < dw.numel(); ++i) (i % 9 == 4 ? centre : corners) += std::abs(dw.data()[i]);
  CHECK(corners == 0.0);
  CHECK(centre > 0.0);
  // And it runs as the centre tap alone: 2·N·O·C operations, not nine times as many.
  FlopCount count;
  {
    NoGrad off;
    conv2d(x, w, Tensor(), Conv2dOptions::square(1, 1));
  }
  CHECK(count.total() == 2 * 2 * 4 * 3);
}

TEST_CASE("conv2d: a batch's gradients equal the sums of its images' gradients") {
  // 20 images of 32x32: one image per GEMM, the weight gradient summed in chunks of blocks.
  const Tensor x = random_tensor({20, 2, 32, 32}, 200), w = random_tensor({3, 2, 3, 3}, 201),
               b = random_tensor({3}, 202), u = random_tensor({20, 3, 32, 32}, 203);
  const Fn f = conv_with(Conv2dOptions::square(1, 1));
  const auto whole = vjp(f, {x, w, b}, u);
  std::vector<double> dw(size_t(w.numel()), 0.0);
  for (int64_t n = 0; n < 20; ++n) {
    const Shape one_x{1, 2, 32, 32}, one_u{1, 3, 32, 32};
    const Tensor xn = x.view_as_strided(one_x, x.strides(), n * 2 * 1024).contiguous();
    const Tensor un = u.view_as_strided(one_u, u.strides(), n * 3 * 1024).contiguous();
    const auto part = vjp(f, {xn, w, b}, un);
    const Tensor dxn = whole[0].view_as_strided(one_x, whole[0].strides(), n * 2 * 1024);
    check_close(dxn, part[0], 1e-5, 1e-6, "input gradient of image " + std::to_string(n));
    const std::vector<float> p = part[1].to_vector();
    for (size_t i = 0; i < dw.size(); ++i) dw[i] += p[i];
  }
  std::vector<float> dwf(dw.begin(), dw.end());
  check_close(whole[1], Tensor::from_vector(w.shape(), dwf), 1e-4, 1e-4, "weight gradient");
}

TEST_CASE("conv2d: the same bits at 1 and 2 threads") {
  ThreadCount restore;
  // Winograd (3x3, stride 1) and im2col (stride 2), with enough images for parallel blocks;
  // and Winograd over two small maps, one image block whose 16 products run side by side;
  // F(4x4) on 16x16 and 28x28 maps, in parallel blocks and in one block (its 36 products
  // side by side).
  struct Case {
    Shape x;
    Conv2dOptions options;
  };
  for (const Case& c : {Case{{8, 32, 16, 16}, Conv2dOptions::square(1, 1)}, Case{{8, 32, 16, 16}, Conv2dOptions::square(2, 1)},
                        Case{{2, 32, 8, 8}, Conv2dOptions::square(1, 1)}, Case{{8, 32, 28, 28}, Conv2dOptions::square(1, 1)},
                        Case{{1, 32, 28, 28}, Conv2dOptions::square(1, 1)}}) {
    const Conv2dOptions& options = c.options;
    const Tensor x = random_tensor(c.x, 300), w = random_tensor({48, 32, 3, 3}, 301), b = random_tensor({48}, 302);
    if (options.stride_h == 1)
      CHECK(conv2d_algorithm(x, w, options) == (c.x[2] >= 14 ? ConvAlgorithm::WinogradF4 : ConvAlgorithm::Winograd));
    check_same_bits_at_one_and_two_threads(conv_with(options), {x, w, b}, 303);
  }
}

TEST_CASE("conv2d: a 1x1 layer on a small map in balanced image blocks, the same bits at 1 and 2 threads") {
  // 8 images of a 7x7 map with 1024 input channels: blocks of 4 and 4 (not 6 and 2).
  ThreadCount restore;
  const Tensor x = random_tensor({8, 1024, 7, 7}, 310), w = random_tensor({16, 1024, 1, 1}, 311),
               b = random_tensor({16}, 312);
  check_same_bits_at_one_and_two_threads(conv_with({}), {x, w, b}, 313);
  uint64_t seed = 314;
  check_against_reference_conv({{8, 1024, 7, 7}, {16, 1024, 1, 1}, {}}, seed, 1e-4, 1e-3, {Transport::gradient()});
}

TEST_CASE("conv2d: a strided 1x1 layer's input gradient is written whole, zero between the strides") {
  // Its col2im writes every entry of dx (no zero-filled tensor first): strides 2 and 3,
  // maps that the stride divides and that it does not (the last rows and columns read by
  // no output), one image per GEMM in row tiles and blocks of images, against the
  // reference, at 1 and 2 threads. The allocator is first handed blocks full of NaN, so
  // that an entry left unwritten shows.
  ThreadCount restore;
  const std::vector<ConvCase> cases = {
      {{2, 16, 56, 56}, {32, 16, 1, 1}, Conv2dOptions::square(2, 0)},
      {{8, 64, 14, 14}, {128, 64, 1, 1}, Conv2dOptions::square(2, 0)},
      {{3, 8, 13, 11}, {4, 8, 1, 1}, Conv2dOptions::square(3, 0)},
      {{2, 8, 7, 9}, {6, 8, 1, 1}, Conv2dOptions{2, 3, 0, 0, 1, 1, 1}},
  };
  uint64_t seed = 340;
  for (const ConvCase& c : cases) {
    REQUIRE(conv2d_algorithm(Tensor::empty(c.x), Tensor::empty(c.w), c.options, true) == ConvAlgorithm::Im2col);
    for (int repeat = 0; repeat < 4; ++repeat) Tensor::full(c.x, std::nanf(""));
    check_against_reference_conv(c, seed, 1e-4, 1e-3, {Transport::gradient()});
    check_same_bits_at_one_and_two_threads(conv_with(c.options),
                                           {random_tensor(c.x, seed++), random_tensor(c.w, seed++)}, seed++);
  }
}

TEST_CASE("conv2d: image blocks are equal to within an image and even in number where there are several") {
  // (images, block asked for) -> images a block.
  CHECK(conv::balanced_block(8, 6) == 4);  // 2 blocks: 4 + 4, not 6 + 2
  CHECK(conv::balanced_block(8, 3) == 2);  // 4 blocks of 2, not 3 + 3 + 2
  CHECK(conv::balanced_block(8, 5) == 4);
  CHECK(conv::balanced_block(8, 8) == 8);  // one block
  CHECK(conv::balanced_block(8, 1) == 1);
  CHECK(conv::balanced_block(3, 1) == 1);  // 3 blocks of 1 image: no fewer images a block than 1
  CHECK(conv::balanced_block(7, 3) == 2);  // 4 blocks: 2 + 2 + 2 + 1
  // A 1x1 stride-2 layer whose 400 output positions asked for blocks of 3 of its 8 images
  // (ResNet-50's 512->1024 downsample at 28x28 asks the same): now 4 blocks of 2, with the
  // reference's values and the same bits at 1 and 2 threads.
  ThreadCount restore;
  const Conv2dOptions stride2 = Conv2dOptions::square(2, 0);
  const Tensor x = random_tensor({8, 16, 40, 40}, 320), w = random_tensor({16, 16, 1, 1}, 321), b = random_tensor({16}, 322);
  check_same_bits_at_one_and_two_threads(conv_with(stride2), {x, w, b}, 323);
  uint64_t seed = 324;
  check_against_reference_conv({{8, 16, 40, 40}, {16, 16, 1, 1}, stride2}, seed, 1e-4, 1e-3, {Transport::gradient()});
}

TEST_CASE("conv2d: a deep strided layer by the direct kernels, its weights packed in parallel" *
          doctest::skip(cpu_vector_isa() != VectorIsa::Avx512)) {
  // 256 output channels: 8 blocks of 32, each a task of its own when the weights are packed.
  ThreadCount restore;
  const ConvCase c{{2, 128, 14, 14}, {256, 128, 3, 3}, Conv2dOptions::square(2, 1)};
  const Tensor x = random_tensor(c.x, 330), w = random_tensor(c.w, 331), b = random_tensor({256}, 332);
  CHECK(conv2d_algorithm(x, w, c.options) == ConvAlgorithm::Direct);
  check_same_bits_at_one_and_two_threads(conv_with(c.options), {x, w, b}, 333);
  uint64_t seed = 334;
  check_against_reference_conv(c, seed, 1e-4, 1e-3, {Transport::gradient()});
}

TEST_CASE("conv2d: a strided layer with weights beyond the L2 cache runs by im2col, one just within by the direct kernels" *
          doctest::skip(cpu_vector_isa() != VectorIsa::Avx512)) {
  // 512 x 512 x 3 x 3 floats are 9.4 MB, above the direct kernels' 8 MiB; 480 x 480 are 8.3 MB.
  ThreadCount restore;
  uint64_t seed = 340;
  for (const int64_t channels : {512, 480}) {
    CAPTURE(channels);
    const ConvCase c{{2, channels, 8, 8}, {channels, channels, 3, 3}, Conv2dOptions::square(2, 1)};
    const Tensor x = random_tensor(c.x, seed++), w = random_tensor(c.w, seed++), b = random_tensor({channels}, seed++);
    CHECK(conv2d_algorithm(x, w, c.options) == (channels == 512 ? ConvAlgorithm::Im2col : ConvAlgorithm::Direct));
    check_same_bits_at_one_and_two_threads(conv_with(c.options), {x, w, b}, seed++);
    check_against_reference_conv(c, seed, 1e-4, 1e-3, {Transport::gradient()});
  }
}

TEST_CASE("conv2d: backward skips the gradients nobody needs") {
  const Tensor x = golden("conv", "conv.basic.in0"), w = golden("conv", "conv.basic.in1").detach(),
               b = golden("conv", "conv.basic.in2");
  const Tensor wl = w.clone().requires_grad_(), xl = x.clone().requires_grad_();
  const Tensor u = golden("conv", "conv.basic.u");
  // First layer of a network: the input needs no gradient; the weight's still matches PyTorch.
  Tensor y = conv2d(x, wl, b, Conv2dOptions::square(1, 1));
  const auto g = grad(y, {wl}, u);
  check_close(g[0], golden("conv", "conv.basic.grad1"), 1e-4, 1e-5, "weight gradient alone");
  y.grad_fn()->needs = {false, true, false};
  {
    NoGrad no_grad;
    const auto c = y.grad_fn()->vjp(u, Transport::gradient());
    CHECK_FALSE(c[0].defined());
    CHECK(c[1].defined());
    CHECK_FALSE(c[2].defined());
  }
  // Explanations: frozen weights, only the input's cotangent.
  Tensor y2 = conv2d(xl, w, b, Conv2dOptions::square(1, 1));
  y2.grad_fn()->needs = {true, false, false};
  NoGrad no_grad;
  const auto c2 = y2.grad_fn()->vjp(u, Transport::pullback());
  CHECK_FALSE(c2[1].defined());
  check_close(c2[0], golden("conv", "conv.basic.grad0"), 1e-4, 1e-5, "input cotangent alone");
}

TEST_CASE("conv2d: one rule for every transport") {
  const std::vector<Tensor> in = golden_inputs("conv", "conv.groups", 3);
  const Tensor u = golden("conv", "conv.groups.u");
  const Fn f = conv_with(Conv2dOptions{}.with_groups(2));
  const auto g = vjp(f, in, u, Transport::gradient());
  for (const Transport& t : {Transport::pullback(), soft(0.1f)}) {
    const auto p = vjp(f, in, u, t);
    for (size_t i = 0; i < 3; ++i) CHECK(p[i].to_vector() == g[i].to_vector());
  }
}

TEST_CASE("conv2d_batch_norm_eval: the fused inference pass has the separate ops' bits, with a residual too") {
  // Every forward path: the direct kernels, Winograd (3x3 stride 1; a residual is added
  // after it), one image per GEMM in row tiles (large images), blocks of images through a
  // staging matrix (small images), 1x1 read in place, and 1x1 with so many outputs that
  // the product runs in column pieces. At every vector width the CPU has: the epilogues
  // run in the widest vectors, the separate ops too.
  std::vector<ConvCase> cases = forward_path_cases();
  cases.push_back({{1, 4, 20, 20}, {600, 4, 1, 1}, Conv2dOptions::square(1, 0)});
  cases.push_back({{4, 16, 5, 5}, {24, 16, 1, 1}, Conv2dOptions::square(1, 0)});  // 1x1 in blocks, staged
  for (const VectorIsa isa : {VectorIsa::Baseline, VectorIsa::Avx2, VectorIsa::Avx512}) {
    if (isa > cpu_vector_isa()) continue;
    cap_vector_isa(isa);
    uint64_t seed = 900;
    for (const ConvCase& c : cases)
      for (const bool with_bias : {false, true})
        for (const bool then_relu : {false, true})
          for (const bool with_residual : {false, true}) {
            INFO("isa ", int(isa), " x ", to_string(c.x), " w ", to_string(c.w), " bias ", with_bias, " relu ", then_relu,
                 " residual ", with_residual, " ",
                 std::string(to_string(conv2d_algorithm(Tensor::empty(c.x), Tensor::empty(c.w), c.options))));
            const int64_t O = c.w[0];
            const Tensor x = random_tensor(c.x, seed++), w = random_tensor(c.w, seed++);
            const Tensor b = with_bias ? random_tensor({O}, seed++) : Tensor();
            const EvalBatchNorm bn{random_tensor({O}, seed++), random_tensor({O}, seed++), random_tensor({O}, seed++),
                                   random_tensor({O}, seed++, 0.2f, 2.0f), 1e-5f};
            NoGrad off;
            Tensor separate = batch_norm(conv2d(x, w, b, c.options), bn.weight, bn.bias, bn.running_mean,
                                         bn.running_var, false, 0.1f, bn.eps);
            const Tensor residual = with_residual ? random_tensor(separate.shape(), seed++) : Tensor();
            const Tensor fused = conv2d_batch_norm_eval(x, w, b, c.options, bn, then_relu, residual);
            if (with_residual) separate = add(separate, residual);
            if (then_relu) separate = relu(separate);
            const std::vector<float> values = fused.to_vector();
            CHECK(values == separate.to_vector());
            if (then_relu) CHECK(std::count(values.begin(), values.end(), 0.0f) > 0);  // some ReLUs closed
          }
  }
  cap_vector_isa(VectorIsa::Avx512);  // back to the CPU's widest
}

TEST_CASE("conv2d_add: the residual added as the output is written is the separate ops (bits, every transport)") {
  // Every forward path: direct (small maps, stride 2), Winograd (which adds after it),
  // im2col in row tiles of one image, blocks of images staged, 1x1 read in place.
  std::vector<ConvCase> cases = forward_path_cases();
  cases.push_back({{2, 16, 40, 40}, {24, 16, 1, 1}, Conv2dOptions::square(1, 0)});
  uint64_t seed = 1900;
  for (const ConvCase& c : cases)
    for (const bool with_bias : {false, true}) {
      INFO("x ", to_string(c.x), " w ", to_string(c.w), " bias ", with_bias, " ",
           std::string(to_string(conv2d_algorithm(Tensor::empty(c.x), Tensor::empty(c.w), c.options))));
      const int64_t O = c.w[0];
      // x, w, the residual, and the bias when there is one.
      Args in = {random_tensor(c.x, seed++), random_tensor(c.w, seed++)};
      Tensor out_shape;
      {
        NoGrad off;
        out_shape = conv2d(in[0], in[1], Tensor(), c.options);
      }
      in.push_back(random_tensor(out_shape.shape(), seed++));
      if (with_bias) in.push_back(random_tensor({O}, seed++));
      const auto bias = [](const Args& a) { return a.size() > 3 ? a[3] : Tensor(); };
      const Fn fused = [&](const Args& a) { return conv2d_add(a[0], a[1], bias(a), c.options, a[2]); };
      const Fn separate = [&](const Args& a) { return add(conv2d(a[0], a[1], bias(a), c.options), a[2]); };
      {
        NoGrad off;
        CHECK(fused(in).to_vector() == separate(in).to_vector());
      }
      const Tensor u = random_tensor(out_shape.shape(), seed++);
      for (const Transport& t : {Transport::gradient(), Transport::pullback(), soft(0.1f)}) {
        const auto a = vjp(fused, in, u, t), b = vjp(separate, in, u, t);
        for (size_t i = 0; i < in.size(); ++i) {
          CAPTURE(i);
          CHECK(a[i].to_vector() == b[i].to_vector());
        }
        CHECK(a[2].to_vector() == u.to_vector());
      }
    }
  // Finite differences, every input perturbed, on a direct and an im2col layer.
  for (const ConvCase& c : {ConvCase{{2, 3, 6, 6}, {4, 3, 3, 3}, Conv2dOptions::square(2, 1)},
                            ConvCase{{2, 3, 5, 5}, {4, 3, 1, 1}, Conv2dOptions::square(1, 0)}}) {
    const Fn fused = [&](const Args& a) { return conv2d_add(a[0], a[1], a[2], c.options, a[3]); };
    Tensor y;
    {
      NoGrad off;
      y = conv2d(Tensor::empty(c.x), Tensor::empty(c.w), Tensor(), c.options);
    }
    check_gradients(fused, {random_tensor(c.x, 1990), random_tensor(c.w, 1991), random_tensor({c.w[0]}, 1992),
                            random_tensor(y.shape(), 1993)});
  }
}

TEST_CASE("conv2d_batch_norm_eval: recorded, the fold is the separate ops (every input's gradient, every transport)") {
  // The BatchNorm folds into the convolution even when the parameters take part in the
  // graph: the convolution's weight and bias and BatchNorm's γ and β get their gradients
  // back through the fold. Against the separate ops up to rounding (the products are scaled
  // before summing), under every transport, with a residual and without; and against
  // finite differences, every input perturbed.
  const Tensor mean = random_tensor({4}, 953), var = random_tensor({4}, 954, 0.5f, 2.0f);
  for (const bool with_residual : {false, true}) {
    CAPTURE(with_residual);
    const auto residual = [&](const Args& in) { return with_residual ? in[5] : Tensor(); };
    const Fn fused = [&](const Args& in) {
      return conv2d_batch_norm_eval(in[0], in[1], in[2], Conv2dOptions::square(1, 1),
                                    {in[3], in[4], mean, var, 1e-5f}, true, residual(in));
    };
    const Fn separate = [&](const Args& in) {
      Tensor z = batch_norm(conv2d(in[0], in[1], in[2], Conv2dOptions::square(1, 1)), in[3], in[4], mean, var, false);
      if (with_residual) z = add(z, in[5]);
      return relu(z);
    };
    Args in = {random_tensor({2, 3, 6, 6}, 955), random_tensor({4, 3, 3, 3}, 956), random_tensor({4}, 957),
               random_tensor({4}, 951), random_tensor({4}, 952)};
    if (with_residual) in.push_back(random_tensor({2, 4, 6, 6}, 959));
    // Finite differences: every input without the ReLU (a step in γ or β moves a whole
    // channel across the ReLU's kink), the input, weight, bias and residual with it.
    const Fn affine = [&](const Args& a) {
      return conv2d_batch_norm_eval(a[0], a[1], a[2], Conv2dOptions::square(1, 1), {a[3], a[4], mean, var, 1e-5f},
                                    false, residual(a));
    };
    check_gradients(affine, in);
    std::vector<bool> past_the_kink(in.size(), true);
    past_the_kink[3] = past_the_kink[4] = false;
    check_gradients(fused, in, {}, past_the_kink);
    const Tensor u = random_tensor({2, 4, 6, 6}, 958);
    Temperatures soft_relu;
    soft_relu.relu = 0.5f;
    for (const Transport& t : {Transport::gradient(), Transport::pullback(), Transport::soft_pullback(soft_relu)}) {
      const auto a = vjp(fused, in, u, t), b = vjp(separate, in, u, t);
      for (size_t i = 0; i < in.size(); ++i) {
        CAPTURE(i);
        check_close(a[i], b[i], 1e-4, 1e-4, "cotangent");
        CHECK(max_abs(b[i]) > 0.1);
      }
    }
    NoGrad no_grad;
    check_close(fused(in), separate(in), 1e-5, 1e-5, "forward");
  }
}

TEST_CASE("conv2d_batch_norm_eval: with frozen weights the BatchNorm folds into the convolution") {
  // Only the input in the graph: the same map as the separate ops, up to rounding, under
  // every transport (the soft ReLU gates read the folded pre-activations), and every
  // kernel path (a direct layer, 4 channels at 14×14; a Winograd one, 16 at 8×8).
  for (const auto& [channels, size] : std::vector<std::pair<int64_t, int64_t>>{{4, 14}, {16, 8}}) {
    CAPTURE(channels);
    const Tensor bn_w = random_tensor({channels}, 961), bn_b = random_tensor({channels}, 962),
                 mean = random_tensor({channels}, 963), var = random_tensor({channels}, 964, 0.5f, 2.0f);
    const Tensor w = random_tensor({channels, 16, 3, 3}, 965), bias = random_tensor({channels}, 966);
    const Fn fused = [&](const Args& in) {
      return conv2d_batch_norm_eval(in[0], w, bias, Conv2dOptions::square(1, 1), {bn_w, bn_b, mean, var, 1e-5f},
                                    true);
    };
    const Fn separate = [&](const Args& in) {
      return relu(batch_norm(conv2d(in[0], w, bias, Conv2dOptions::square(1, 1)), bn_w, bn_b, mean, var, false));
    };
    const Args in = {random_tensor({2, 16, size, size}, 967)};
    const Tensor u = random_tensor({2, channels, size, size}, 968);
    Temperatures soft_relu;
    soft_relu.relu = 0.5f;
    for (const Transport& t : {Transport::gradient(), Transport::pullback(), Transport::soft_pullback(soft_relu)}) {
      const Tensor a = vjp(fused, in, u, t)[0], b = vjp(separate, in, u, t)[0];
      check_close(a, b, 1e-4, 1e-4, "input cotangent");
      CHECK(max_abs(b) > 0.1);
    }
    NoGrad no_grad;
    check_close(fused(in), separate(in), 1e-4, 1e-4, "forward");
  }
}

TEST_CASE("conv2d: bad shapes") {
  CHECK_THROWS_WITH_AS(
      conv2d(Tensor::zeros({8, 4, 32, 32}), Tensor::zeros({64, 3, 3, 3})),
      doctest::Contains("conv2d: weight [64, 3, 3, 3] expects 3 input channels, input is [8, 4, 32, 32]"), Error);
  CHECK_THROWS_WITH_AS(conv2d(Tensor::zeros({4, 32, 32}), Tensor::zeros({8, 4, 3, 3})),
                       doctest::Contains("conv2d: input must be (N, C, H, W), got [4, 32, 32]"), Error);
  CHECK_THROWS_WITH_AS(
      conv2d(Tensor::zeros({1, 4, 8, 8}), Tensor::zeros({6, 2, 3, 3}), {}, Conv2dOptions{}.with_groups(3)),
      doctest::Contains("conv2d: groups 3 must divide"), Error);
  CHECK_THROWS_WITH_AS(conv2d(Tensor::zeros({1, 4, 8, 8}), Tensor::zeros({6, 4, 3, 3}), Tensor::zeros({5})),
                       doctest::Contains("conv2d: bias [5] does not match weight [6, 4, 3, 3]"), Error);
  CHECK_THROWS_WITH_AS(conv2d(Tensor::zeros({1, 4, 2, 2}), Tensor::zeros({6, 4, 3, 3})),
                       doctest::Contains("conv2d: kernel 3x3 (dilation 1x1) does not fit input [1, 4, 2, 2]"), Error);
  CHECK_THROWS_WITH_AS(conv2d(Tensor::zeros({1, 4, 8, 8}), Tensor::zeros({6, 4, 3, 3}), {}, Conv2dOptions::square(0)),
                       doctest::Contains("conv2d: invalid options stride 0x0"), Error);
}

TEST_CASE("pool: gradients of max, average and adaptive average pooling") {
  GradCheckOptions options;
  options.eps = 5e-3;
  check_gradients([](const std::vector<Tensor>& in) { return max_pool2d(in[0], 3, 2, 1); },
                  {distinct_values({2, 2, 7, 7}, 400)}, options);
  check_gradients([](const std::vector<Tensor>& in) { return max_pool2d(in[0], 2, 3, 1, 2, 0, 1); },
                  {distinct_values({1, 2, 6, 5}, 401)}, options);
  check_gradients([](const std::vector<Tensor>& in) { return avg_pool2d(in[0], 3, 2, 1); },
                  {random_tensor({2, 2, 7, 6}, 402)});
  check_gradients([](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], 3, 2); },
                  {random_tensor({2, 2, 7, 5}, 403)});
}

TEST_CASE("pool: matches PyTorch") {
  check_golden_case("conv", "maxpool.k3s2p1", 1,
                    [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 3, 2, 1); });
  check_golden_case("conv", "maxpool.k2s1", 1, [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 2, 1); });
  // Ties: the first maximum in row-major window order takes the whole cotangent.
  check_golden_case("conv", "maxpool.ties", 1,
                    [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 3, 1, 1); });
  check_golden_case("conv", "avgpool.k3s2p1", 1,
                    [](const std::vector<Tensor>& in) { return avg_pool2d(in[0], 3, 2, 1); });
  check_golden_case("conv", "avgpool.k2s2", 1, [](const std::vector<Tensor>& in) { return avg_pool2d(in[0], 2, 2); });
  check_golden_case("conv", "adaptive.7x5to3x2", 1,
                    [](const std::vector<Tensor>& in) { return adaptive_avg_pool2d(in[0], 3, 2); });
}

TEST_CASE("pool: the 2x2 stride-2 max-pool (its own loop) picks the first maximum, NaN winning") {
  // Odd sizes (the last row and column are dropped), ties, a NaN, and a window of -inf.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  Tensor x = random_tensor({2, 3, 7, 9}, 510);
  x.data()[0] = x.data()[1] = x.data()[9] = x.data()[10] = 0.5f;              // a tie in window (0, 0)
  x.data()[2 * 9 + 3] = nan;                                                  // window (1, 1)
  x.data()[4] = x.data()[5] = x.data()[9 + 4] = x.data()[9 + 5] = -inf;       // window (0, 2)
  const Tensor y = max_pool2d(x, 2, 2);
  REQUIRE(y.shape() == Shape{2, 3, 3, 4});
  // Brute force over each window in row-major order; the cotangent goes to that element.
  Tensor u = Tensor::ones(y.shape());
  const std::vector<float> dx = vjp([](const std::vector<Tensor>& in) { return max_pool2d(in[0], 2, 2); }, {x}, u)[0]
                                    .to_vector();
  std::vector<float> want_dx(dx.size(), 0.0f);
  int bad = 0;
  for (int64_t p = 0; p < 6; ++p)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 4; ++j) {
        float best = -inf;
        int64_t at = p * 63 + 2 * i * 9 + 2 * j;
        for (int64_t a = 0; a < 2; ++a)
          for (int64_t b = 0; b < 2; ++b) {
            const int64_t k = p * 63 + (2 * i + a) * 9 + 2 * j + b;
            const float v = x.data()[k];
            if (v > best || std::isnan(v)) best = v, at = k;
          }
        const float got = y.data()[(p * 3 + i) * 4 + j];
        bad += !(got == best || (std::isnan(got) && std::isnan(best)));
        want_dx[size_t(at)] += 1.0f;
      }
  CHECK(bad == 0);
  CHECK(dx == want_dx);
  CHECK(std::isnan(y.at({0, 0, 1, 1})));
  CHECK(y.at({0, 0, 0, 2}) == -inf);
}

TEST_CASE("pool: padded and strided max-pools (tap by tap along rows) pick the first maximum, NaN winning") {
  // Ties, a NaN, windows of -inf and windows cut by the padding, against a brute force over
  // each window in row-major order; the cotangent goes to the element it picks.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Window {
    int64_t kh, kw, sh, sw, ph, pw;
  };
  for (const Window k : {Window{3, 3, 2, 2, 1, 1}, Window{3, 2, 1, 2, 1, 0}, Window{2, 3, 2, 1, 0, 1}}) {
    INFO("kernel ", k.kh, "x", k.kw, " stride ", k.sh, "x", k.sw, " padding ", k.ph, "x", k.pw);
    const int64_t H = 7, W = 9;
    Tensor x = random_tensor({2, 3, H, W}, 511);
    x.data()[0] = x.data()[1] = x.data()[W] = x.data()[W + 1] = 0.5f;  // ties at the corner
    x.data()[3 * W + 4] = nan;
    for (int64_t h = 0; h < 3; ++h)
      for (int64_t w = 5; w < 9; ++w) x.data()[63 + h * W + w] = -inf;  // whole windows of -inf in plane 1
    const auto pool = [k](const std::vector<Tensor>& in) { return max_pool2d(in[0], k.kh, k.kw, k.sh, k.sw, k.ph, k.pw); };
    const Tensor y = pool({x});
    const int64_t OH = y.size(2), OW = y.size(3);
    const std::vector<float> dx = vjp(pool, {x}, Tensor::ones(y.shape()))[0].to_vector();
    std::vector<float> want_dx(dx.size(), 0.0f);
    int bad = 0;
    for (int64_t p = 0; p < 6; ++p)
      for (int64_t i = 0; i < OH; ++i)
        for (int64_t j = 0; j < OW; ++j) {
          float best = -inf;
          int64_t at = -1;
          for (int64_t a = 0; a < k.kh; ++a)
            for (int64_t b = 0; b < k.kw; ++b) {
              const int64_t h = i * k.sh - k.ph + a, w = j * k.sw - k.pw + b;
              if (h < 0 || h >= H || w < 0 || w >= W) continue;
              const int64_t e = p * H * W + h * W + w;
              if (at < 0) at = e;
              if (x.data()[e] > best || std::isnan(x.data()[e])) best = x.data()[e], at = e;
            }
          const float got = y.data()[(p * OH + i) * OW + j];
          bad += !(got == best || (std::isnan(got) && std::isnan(best)));
          want_dx[size_t(at)] += 1.0f;
        }
    CHECK(bad == 0);
    CHECK(dx == want_dx);
  }
}

TEST_CASE("pool: max-pool's values are the same in inference (no arg-maxes kept) and recorded, at every vector width") {
  // ResNet's 3x3 stride-2 padded stem pool, the 2x2 stride-2 pool's own loop and a
  // rectangular strided window; ties, NaNs and windows of -inf, against a brute force over
  // each window in row-major order.
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  struct Window {
    int64_t kh, kw, sh, sw, ph, pw;
  };
  const int64_t H = 13, W = 37;  // rows of more than one vector of outputs
  Tensor x = random_tensor({2, 3, H, W}, 512);
  x.data()[0] = x.data()[1] = x.data()[W] = x.data()[W + 1] = 0.5f;
  x.data()[3 * W + 20] = nan;
  x.data()[2 * H * W + 5 * W + 33] = nan;
  for (int64_t h = 0; h < 4; ++h)
    for (int64_t w = 10; w < 16; ++w) x.data()[H * W + h * W + w] = -inf;
  for (const Window k : {Window{3, 3, 2, 2, 1, 1}, Window{2, 2, 2, 2, 0, 0}, Window{3, 2, 1, 2, 1, 0}}) {
    const auto pool = [k](const Tensor& in) { return max_pool2d(in, k.kh, k.kw, k.sh, k.sw, k.ph, k.pw); };
    std::vector<float> want;
    {
      const Tensor y = pool(x);
      const int64_t OH = y.size(2), OW = y.size(3);
      for (int64_t p = 0; p < 6; ++p)
        for (int64_t i = 0; i < OH; ++i)
          for (int64_t j = 0; j < OW; ++j) {
            float best = -inf;
            for (int64_t a = 0; a < k.kh; ++a)
              for (int64_t b = 0; b < k.kw; ++b) {
                const int64_t h = i * k.sh - k.ph + a, w = j * k.sw - k.pw + b;
                if (h < 0 || h >= H || w < 0 || w >= W) continue;
                const float v = x.data()[p * H * W + h * W + w];
                if (v > best || std::isnan(v)) best = v;
              }
            want.push_back(best);
          }
    }
    for (const VectorIsa isa : {VectorIsa::Baseline, VectorIsa::Avx2, VectorIsa::Avx512}) {
      if (isa > cpu_vector_isa()) continue;
      cap_vector_isa(isa);
      for (const bool record : {false, true}) {
        INFO("kernel ", k.kh, "x", k.kw, " stride ", k.sh, "x", k.sw, " isa ", int(isa), " recorded ", record);
        Tensor input = x.detach();
        if (record) input.requires_grad_();
        const std::vector<float> got = pool(input).to_vector();
        REQUIRE(got.size() == want.size());
        int bad = 0, nans = 0;
        for (size_t e = 0; e < got.size(); ++e) {
          bad += !(got[e] == want[e] || (std::isnan(got[e]) && std::isnan(want[e])));
          nans += std::isnan(got[e]);
        }
        CHECK(bad == 0);
        CHECK(nans > 0);
      }
    }
    cap_vector_isa(VectorIsa::Avx512);  // back to the CPU's widest
  }
}

TEST_CASE("pool: max-pool pullback routes like the gradient") {
  const Tensor x = golden("conv", "maxpool.ties.in0"), u = golden("conv", "maxpool.ties.u");
  const Fn f = [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 3, 1, 1); };
  CHECK(vjp(f, {x}, u, Transport::pullback())[0].to_vector() == vjp(f, {x}, u, Transport::gradient())[0].to_vector());
}

TEST_CASE("pool: soft max-pool pullback matches the PyTorch reference (unfold, detached softmax, fold)") {
  struct Case {
    const char* name;
    int64_t k, s, p;
    float tau;
  };
  for (const Case& c :
       {Case{"k3s2p1_t03", 3, 2, 1, 0.3f}, Case{"k3s2p1_t1", 3, 2, 1, 1.0f}, Case{"k2s1_t03", 2, 1, 0, 0.3f}}) {
    const std::string name = std::string("softmax_pool.") + c.name;
    const Tensor x = golden("conv", name + ".in0"), u = golden("conv", name + ".u");
    const Fn f = [c](const std::vector<Tensor>& in) { return max_pool2d(in[0], c.k, c.s, c.p); };
    check_close(vjp(f, {x}, u, soft(c.tau))[0], golden("conv", name + ".grad0"), 1e-4, 1e-6, name);
  }
  // The default temperature is docs/methods.md's 0.3.
  const Tensor x = golden("conv", "softmax_pool.k3s2p1_t03.in0"), u = golden("conv", "softmax_pool.k3s2p1_t03.u");
  const Fn f = [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 3, 2, 1); };
  check_close(vjp(f, {x}, u, Transport::soft_pullback())[0], golden("conv", "softmax_pool.k3s2p1_t03.grad0"), 1e-4,
              1e-6, "default temperature");
}

TEST_CASE("pool: soft max-pool pullback over tiling windows matches its definition") {
  // Windows that tile the input exactly take their own loops (2x2 stride 2, with the width
  // a constant; 3x3 stride 3); 3x2 stride 3x2 leaving a row and a column uncovered takes
  // the general ones: dx = u(window) · softmax(window / tau), computed here in double, a
  // window at a time.
  struct Case {
    int64_t kh, kw;
    Shape in;
  };
  for (const Case& c : {Case{2, 2, {2, 3, 8, 10}}, Case{3, 3, {2, 2, 9, 6}}, Case{3, 2, {1, 2, 10, 7}}}) {
    const Tensor x = random_tensor(c.in, 510);
    const Fn f = [c](const std::vector<Tensor>& in) { return max_pool2d(in[0], c.kh, c.kw, c.kh, c.kw, 0, 0); };
    const int64_t OH = c.in[2] / c.kh, OW = c.in[3] / c.kw;
    const Tensor u = random_tensor({c.in[0], c.in[1], OH, OW}, 511);
    const float tau = 0.3f;
    const Tensor dx = vjp(f, {x}, u, soft(tau))[0];
    Tensor want = Tensor::zeros(c.in);
    for (int64_t n = 0; n < c.in[0]; ++n)
      for (int64_t ch = 0; ch < c.in[1]; ++ch)
        for (int64_t oh = 0; oh < OH; ++oh)
          for (int64_t ow = 0; ow < OW; ++ow) {
            double top = -1e30, total = 0;
            for (int64_t i = 0; i < c.kh; ++i)
              for (int64_t j = 0; j < c.kw; ++j) top = std::max<double>(top, x.at({n, ch, oh * c.kh + i, ow * c.kw + j}));
            for (int64_t i = 0; i < c.kh; ++i)
              for (int64_t j = 0; j < c.kw; ++j) total += std::exp((x.at({n, ch, oh * c.kh + i, ow * c.kw + j}) - top) / tau);
            for (int64_t i = 0; i < c.kh; ++i)
              for (int64_t j = 0; j < c.kw; ++j) {
                const double weight = std::exp((x.at({n, ch, oh * c.kh + i, ow * c.kw + j}) - top) / tau) / total;
                want.data()[((n * c.in[1] + ch) * c.in[2] + oh * c.kh + i) * c.in[3] + ow * c.kw + j] =
                    static_cast<float>(weight * u.at({n, ch, oh, ow}));
              }
          }
    check_close(dx, want, 1e-5, 1e-6, "soft max-pool over tiling windows");
    CHECK(max_abs(dx) > 0.01);
  }
}

TEST_CASE("pool: soft max-pool weights sum to one and harden as tau -> 0") {
  // Non-overlapping 2x2 windows: each window's cotangents add up to its u.
  const Tensor x = random_tensor({2, 3, 6, 8}, 500), u = random_tensor({2, 3, 3, 4}, 501);
  const Fn f = [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 2, 2); };
  const Tensor dx = vjp(f, {x}, u, soft(0.3f))[0];
  int bad = 0;
  for (int64_t n = 0; n < 2; ++n)
    for (int64_t c = 0; c < 3; ++c)
      for (int64_t i = 0; i < 3; ++i)
        for (int64_t j = 0; j < 4; ++j) {
          const float s = dx.at({n, c, 2 * i, 2 * j}) + dx.at({n, c, 2 * i, 2 * j + 1}) +
                          dx.at({n, c, 2 * i + 1, 2 * j}) + dx.at({n, c, 2 * i + 1, 2 * j + 1});
          bad += std::abs(s - u.at({n, c, i, j})) > 1e-5f;
        }
  CHECK(bad == 0);
  // Overlapping, padded windows of well-separated values: τ = 1e-3 is the hard routing.
  const Tensor xd = distinct_values({2, 2, 7, 7}, 502), ud = random_tensor({2, 2, 4, 4}, 503);
  const Fn g = [](const std::vector<Tensor>& in) { return max_pool2d(in[0], 3, 2, 1); };
  check_close(vjp(g, {xd}, ud, soft(1e-3f))[0], vjp(g, {xd}, ud, Transport::gradient())[0], 1e-6, 1e-7,
              "soft pullback at tau 1e-3");
}

TEST_CASE("pool: average pooling has one rule for every transport") {
  const Tensor x = random_tensor({1, 2, 5, 5}, 600), u = random_tensor({1, 2, 3, 3}, 601);
  const Fn f = [](const std::vector<Tensor>& in) { return avg_pool2d(in[0], 3, 2, 1); };
  const std::vector<float> g = vjp(f, {x}, u, Transport::gradient())[0].to_vector();
  CHECK(vjp(f, {x}, u, Transport::pullback())[0].to_vector() == g);
  CHECK(vjp(f, {x}, u, soft(0.1f))[0].to_vector() == g);
}

TEST_CASE("pool: bad shapes") {
  CHECK_THROWS_WITH_AS(max_pool2d(Tensor::zeros({3, 8, 8}), 2, 2),
                       doctest::Contains("max_pool2d: input must be (N, C, H, W), got [3, 8, 8]"), Error);
  CHECK_THROWS_WITH_AS(max_pool2d(Tensor::zeros({1, 3, 8, 8}), 3, 2, 2),
                       doctest::Contains("max_pool2d: padding 2x2 must be at most half the kernel 3x3"), Error);
  CHECK_THROWS_WITH_AS(avg_pool2d(Tensor::zeros({1, 3, 2, 2}), 3, 1),
                       doctest::Contains("avg_pool2d: kernel 3x3 does not fit input [1, 3, 2, 2]"), Error);
  CHECK_THROWS_WITH_AS(avg_pool2d(Tensor::zeros({1, 3, 8, 8}), 2, 0),
                       doctest::Contains("avg_pool2d: invalid kernel 2x2, stride 0x0"), Error);
  CHECK_THROWS_WITH_AS(adaptive_avg_pool2d(Tensor::zeros({1, 3, 8, 8}), 0, 2),
                       doctest::Contains("adaptive_avg_pool2d: output size must be positive, got 0x2"), Error);
}

TEST_CASE("conv2d recorded for its input alone keeps no input and gives the same input cotangent") {
  // Only the weight's gradient reads a convolution's input: recorded for the input's
  // cotangent alone (the weights constants), the node keeps none, and the input's
  // cotangent is the one of the full recording, bit for bit, on each algorithm's shapes.
  Generator gen(29);
  Conv2dOptions o;
  o.pad_h = o.pad_w = 1;
  for (const int64_t side : {4, 9, 20}) {  // direct or im2col, Winograd F(2×2), F(4×4)
    CAPTURE(side);
    const Tensor w = normal({16, 8, 3, 3}, 0.0f, 0.2f, gen).requires_grad_();
    const Tensor bias = normal({16}, 0.0f, 0.2f, gen).requires_grad_();
    const Tensor x0 = normal({2, 8, side, side}, 0.0f, 1.0f, gen);
    const Tensor u = normal({2, 16, side, side}, 0.0f, 1.0f, gen);
    const int64_t input_bytes = x0.numel() * int64_t(sizeof(float));
    // h = x + 1 keeps nothing for its own vjp, so only the convolution can keep h alive.
    const auto held_by_graph = [&](const Tensor& leaf, Tensor& y) {
      const int64_t before = memory_stats().current_bytes;
      Tensor h = add_scalar(leaf, 1.0f);
      y = conv2d(h, w, bias, o);
      h = Tensor();
      return memory_stats().current_bytes - before - y.numel() * int64_t(sizeof(float));
    };
    Tensor full_leaf = x0.clone().requires_grad_(), y_full;
    const int64_t full_kept = held_by_graph(full_leaf, y_full);
    const std::vector<Tensor> full = grad(y_full, {full_leaf, w}, u);
    Tensor leaf = x0.clone().requires_grad_(), y;
    int64_t kept = 0;
    {
      const RecordingFor input_only(leaf);
      kept = held_by_graph(leaf, y);
    }
    CHECK(full_kept >= input_bytes);
    CHECK(kept < input_bytes);
    const std::vector<Tensor> only = grad(y, {leaf, w}, u);
    CHECK(only[0].to_vector() == full[0].to_vector());
    CHECK(max_abs(only[0]) > 0.0f);
    // The weights were constants of that recording: no cotangent reaches them.
    CHECK(max_abs(only[1]) == 0.0f);
    CHECK(max_abs(full[1]) > 0.0f);
  }
}
