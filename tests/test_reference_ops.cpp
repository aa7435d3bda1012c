// The fast kernels of ops/ against the readable reference ops of ops/reference/, for every
// op family and every transport (docs/methods.md §1.2); and the references' own gradients
// against finite differences, so that the yardstick is itself measured.
#include <doctest/doctest.h>

#include <cmath>
#include <functional>
#include <set>
#include <string>

#include "engine/autograd.h"
#include "engine/random.h"
#include "engine/vectorize.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/bilinear.h"
#include "ops/conv.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/loss.h"
#include "ops/matmul.h"
#include "ops/norm.h"
#include "ops/pool.h"
#include "ops/reduce.h"
#include "ops/reference/reference.h"
#include "ops/softmax.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;
namespace ref = adjoint::reference;
using ref::Values;

namespace {

// Every transport, the soft pullback at temperatures other than the defaults (so that a
// rule reading the wrong temperature, or none, shows).
std::vector<Transport> all_transports() {
  Temperatures t;
  t.relu = 0.4f, t.gelu = 0.7f, t.silu = 1.3f, t.max_pool = 0.5f, t.attention = 2.0f;
  return {Transport::gradient(), Transport::pullback(), Transport::soft_pullback(t), Transport::guided(),
          Transport::deeplift()};
}

// The fast op's input cotangents of u under t: the engine's vjp at fresh leaves.
std::vector<Tensor> fast_vjp(const Fn& f, const std::vector<Tensor>& inputs, const Tensor& u, const Transport& t) {
  return vjp(f, inputs, u, t);
}

// CHECKs a fast result against the reference's values.
void check_matches(const Tensor& fast, const Values& expected, double tol, const std::string& what) {
  check_close(fast, ref::to_tensor(fast.shape(), expected), tol, tol, what);
}

// Checks a reference's gradient of ⟨u, f(x)⟩ against central differences in double, and
// that it is not identically zero (a rule that lost its input would pass a zero check).
void check_reference_gradient(const std::function<Values(const Values&)>& f, Values x, const Values& u,
                              const Values& analytic, const std::string& what) {
  INFO(what);
  REQUIRE(analytic.size() == x.size());
  const double eps = 1e-6;
  double worst = 0, largest = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double saved = x[i];
    auto inner = [&](double xi) {
      x[i] = xi;
      const Values y = f(x);
      double s = 0;
      for (size_t j = 0; j < y.size(); ++j) s += u[j] * y[j];
      return s;
    };
    const double numeric = (inner(saved + eps) - inner(saved - eps)) / (2 * eps);
    x[i] = saved;
    // Central differences in double with this step are good to about 1e-9 absolute here.
    worst = std::max(worst, std::fabs(numeric - analytic[i]) / (1e-4 + std::fabs(numeric)));
    largest = std::max(largest, std::fabs(analytic[i]));
  }
  CHECK(worst < 1e-5);
  CHECK(largest > 1e-3);
}

// Random values in [lo, hi).
Values random_values(size_t n, uint64_t seed, double lo = -1, double hi = 1) {
  return ref::values(random_tensor({int64_t(n)}, seed, float(lo), float(hi)));
}

// The same values, rounded to float: the inputs both sides see.
Tensor as_tensor(const Shape& shape, const Values& v) { return ref::to_tensor(shape, v); }

// ---------------------------------------------------------------------------------------
// conv2d

struct ConvCase {
  const char* what;
  Shape x, w;
  Conv2dOptions options;
  ConvAlgorithm algorithm;  // the forward algorithm this shape selects where AVX-512 runs
};

ref::ConvShape conv_shape(const ConvCase& c) {
  return {c.x[0], c.x[1], c.x[2], c.x[3], c.w[0], c.w[2], c.w[3], c.options};
}

}  // namespace

TEST_CASE("reference ops: conv2d by every algorithm and transport matches the reference") {
  using A = ConvAlgorithm;
  const std::vector<ConvCase> cases = {
      {"im2col, 3x3 padded, few channels", {2, 3, 7, 6}, {4, 3, 3, 3}, Conv2dOptions::square(1, 1), A::Im2col},
      {"im2col, strided, dilated, grouped", {2, 4, 9, 8}, {6, 2, 3, 2}, {2, 1, 1, 2, 2, 1, 2}, A::Im2col},
      {"im2col, 1x1 read in place", {2, 8, 9, 9}, {5, 8, 1, 1}, {}, A::Im2col},
      {"im2col, 1x1 images gathered", {3, 8, 4, 4}, {6, 8, 1, 1}, {}, A::Im2col},
      {"winograd, 48 channels", {2, 48, 10, 9}, {48, 48, 3, 3}, Conv2dOptions::square(1, 1), A::Winograd},
      {"winograd, no padding, odd map", {1, 24, 7, 11}, {40, 24, 3, 3}, {}, A::Winograd},
      {"winograd F(4x4), clipped edge tiles", {2, 40, 30, 29}, {36, 40, 3, 3}, Conv2dOptions::square(1, 1),
       A::WinogradF4},
      {"direct by rows, 16 channels", {2, 16, 14, 14}, {16, 16, 3, 3}, Conv2dOptions::square(1, 1), A::Direct},
      {"direct by channels, small map", {2, 32, 6, 6}, {32, 32, 3, 3}, Conv2dOptions::square(1, 1), A::Direct},
      {"direct by channels, strided", {2, 16, 12, 12}, {32, 16, 3, 3}, Conv2dOptions::square(2, 1), A::Direct},
  };
  const bool avx512 = vector_isa() == VectorIsa::Avx512;
  std::set<A> seen;
  uint64_t seed = 500;
  for (const ConvCase& c : cases) {
    INFO(c.what, ": x ", to_string(c.x), ", w ", to_string(c.w));
    const ref::ConvShape s = conv_shape(c);
    const Values x = random_values(size_t(numel(c.x)), seed++);
    const Values w = random_values(size_t(numel(c.w)), seed++, -0.5, 0.5), b = random_values(size_t(c.w[0]), seed++);
    const Tensor xt = as_tensor(c.x, x), wt = as_tensor(c.w, w), bt = as_tensor({c.w[0]}, b);
    const A algorithm = conv2d_algorithm(xt, wt, c.options);
    if (avx512 || c.algorithm != A::Direct)
      CHECK(algorithm == c.algorithm);
    else
      CHECK(algorithm != A::Direct);  // without AVX-512 the GEMM algorithms run these shapes
    seen.insert(algorithm);

    const Fn f = [&](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], c.options); };
    Tensor y;
    {
      NoGrad no_grad;
      y = f({xt, wt, bt});
    }
    check_matches(y, ref::conv2d_forward(x, w, b, s), 1e-4, "forward");
    const Values u = random_values(size_t(y.numel()), seed++);
    const ref::ConvGrads expected = ref::conv2d_backward(u, x, w, s);
    for (const Transport& t : all_transports()) {
      INFO("transport ", std::string(to_string(t.kind)), ", input gradient by ",
           std::string(to_string(conv2d_algorithm(xt, wt, c.options, true))));
      const auto g = fast_vjp(f, {xt, wt, bt}, as_tensor(y.shape(), u), t);
      check_matches(g[0], expected.dx, 1e-4, "input cotangent");
      check_matches(g[1], expected.dw, 2e-4, "weight cotangent");
      check_matches(g[2], expected.dbias, 1e-4, "bias cotangent");
    }
  }
  CHECK(seen.count(A::Im2col) == 1);
  CHECK(seen.count(A::Winograd) == 1);
  CHECK(seen.count(A::WinogradF4) == 1);
  if (avx512) CHECK(seen.count(A::Direct) == 1);
}

TEST_CASE("reference ops: conv2d's portable loops (vectors capped) match the reference") {
  // Winograd's transforms and the elementwise loops have portable forms that the AVX-512
  // build replaces; capping the vector width runs them. F(2×2) on a small map, F(4×4) on a
  // larger one.
  for (const ConvCase& c :
       {ConvCase{"winograd", {2, 32, 8, 8}, {32, 32, 3, 3}, Conv2dOptions::square(1, 1), ConvAlgorithm::Winograd},
        ConvCase{"winograd F(4x4)", {2, 32, 29, 30}, {32, 32, 3, 3}, Conv2dOptions::square(1, 1),
                 ConvAlgorithm::WinogradF4}}) {
    const ref::ConvShape s = conv_shape(c);
    const Values x = random_values(size_t(numel(c.x)), 41), w = random_values(size_t(numel(c.w)), 42, -0.5, 0.5),
                 b = random_values(32, 43);
    const Tensor xt = as_tensor(c.x, x), wt = as_tensor(c.w, w), bt = as_tensor({32}, b);
    const Values u = random_values(size_t(numel(c.x)), 44);
    const ref::ConvGrads expected = ref::conv2d_backward(u, x, w, s);
    for (VectorIsa isa : {VectorIsa::Avx2, VectorIsa::Baseline}) {
      INFO("vectors capped at ", static_cast<int>(isa));
      cap_vector_isa(isa);
      CHECK(conv2d_algorithm(xt, wt, c.options) == c.algorithm);
      CHECK(conv2d_algorithm(xt, wt, c.options, true) == c.algorithm);
      const Fn f = [&](const std::vector<Tensor>& in) { return conv2d(in[0], in[1], in[2], c.options); };
      const auto g = fast_vjp(f, {xt, wt, bt}, as_tensor(c.x, u), Transport::gradient());
      Tensor y;
      {
        NoGrad no_grad;
        y = f({xt, wt, bt});
      }
      check_matches(y, ref::conv2d_forward(x, w, b, s), 1e-4, "forward");
      check_matches(g[0], expected.dx, 1e-4, "input cotangent");
      check_matches(g[1], expected.dw, 2e-4, "weight cotangent");
    }
    cap_vector_isa(VectorIsa::Avx512);  // back to the CPU's widest
  }
}

TEST_CASE("reference ops: the reference conv2d's gradients match finite differences") {
  const ConvCase c{"strided, dilated, grouped", {1, 4, 6, 5}, {4, 2, 3, 2}, {2, 1, 1, 1, 1, 2, 2},
                   ConvAlgorithm::Im2col};
  const ref::ConvShape s = conv_shape(c);
  const Values x = random_values(size_t(numel(c.x)), 61), w = random_values(size_t(numel(c.w)), 62),
               b = random_values(4, 63);
  const Values u = random_values(size_t(4 * s.OH() * s.OW()), 64);
  const ref::ConvGrads g = ref::conv2d_backward(u, x, w, s);
  check_reference_gradient([&](const Values& v) { return ref::conv2d_forward(v, w, b, s); }, x, u, g.dx, "dx");
  check_reference_gradient([&](const Values& v) { return ref::conv2d_forward(x, v, b, s); }, w, u, g.dw, "dw");
  check_reference_gradient([&](const Values& v) { return ref::conv2d_forward(x, w, v, s); }, b, u, g.dbias, "dbias");
}

// ---------------------------------------------------------------------------------------
// attention

TEST_CASE("reference ops: attention under every transport matches the reference") {
  for (bool causal : {false, true}) {
    INFO("causal ", causal);
    const ref::AttentionShape s{2 * 3, 5, causal ? 5 : 7, 4, 3, 0.5, causal};
    const Values q = random_values(size_t(s.heads * s.T * s.d), 71, -2, 2),
                 k = random_values(size_t(s.heads * s.S * s.d), 72, -2, 2),
                 v = random_values(size_t(s.heads * s.S * s.dv), 73),
                 u = random_values(size_t(s.heads * s.T * s.dv), 74);
    const Tensor qt = as_tensor({2, 3, s.T, s.d}, q), kt = as_tensor({2, 3, s.S, s.d}, k),
                 vt = as_tensor({2, 3, s.S, s.dv}, v), ut = as_tensor({2, 3, s.T, s.dv}, u);
    const Fn f = [&](const std::vector<Tensor>& in) {
      return scaled_dot_product_attention(in[0], in[1], in[2], causal, float(s.scale));
    };
    Tensor y;
    {
      NoGrad no_grad;
      y = f({qt, kt, vt});
    }
    check_matches(y, ref::attention_forward(q, k, v, s), 1e-5, "forward");
    for (const Transport& t : all_transports()) {
      INFO("transport ", std::string(to_string(t.kind)));
      const auto g = fast_vjp(f, {qt, kt, vt}, ut, t);
      const ref::AttentionGrads expected = ref::attention_backward(u, q, k, v, s, t);
      check_matches(g[0], expected.dq, 1e-5, "dq");
      check_matches(g[1], expected.dk, 1e-5, "dk");
      check_matches(g[2], expected.dv, 1e-5, "dv");
    }
  }
}

TEST_CASE("reference ops: attention's softmax rows of every length against the reference, the same bits at every "
          "vector width") {
  // The softmax runs sixteen lanes at a time with the last partial vector padded: rows
  // shorter than, equal to and one past a vector, a ViT-B/16 row (197 = 12·16 + 5), and
  // the causal mask's rows of every length from 1 up.
  for (bool causal : {false, true})
    for (int64_t S : {1, 5, 16, 17, 197}) {
      INFO("causal ", causal, ", keys ", S);
      const ref::AttentionShape s{2, causal ? S : 3, S, 4, 3, 0.5, causal};
      const Values q = random_values(size_t(s.heads * s.T * s.d), 111, -3, 3),
                   k = random_values(size_t(s.heads * s.S * s.d), 112, -3, 3),
                   v = random_values(size_t(s.heads * s.S * s.dv), 113),
                   u = random_values(size_t(s.heads * s.T * s.dv), 114);
      const Tensor qt = as_tensor({2, s.T, s.d}, q), kt = as_tensor({2, s.S, s.d}, k), vt = as_tensor({2, s.S, s.dv}, v),
                   ut = as_tensor({2, s.T, s.dv}, u);
      const Fn f = [&](const std::vector<Tensor>& in) {
        return scaled_dot_product_attention(in[0], in[1], in[2], causal, float(s.scale));
      };
      const Transport soft = all_transports()[2];
      std::vector<std::vector<float>> widest;  // forward, dq, dk, dv, soft pullback's dv
      for (VectorIsa isa : {VectorIsa::Avx512, VectorIsa::Avx2, VectorIsa::Baseline}) {
        INFO("vectors capped at ", static_cast<int>(isa));
        cap_vector_isa(isa);
        Tensor y;
        {
          NoGrad no_grad;
          y = f({qt, kt, vt});
        }
        const auto g = fast_vjp(f, {qt, kt, vt}, ut, Transport::gradient());
        const auto p = fast_vjp(f, {qt, kt, vt}, ut, soft);
        check_matches(y, ref::attention_forward(q, k, v, s), 1e-5, "forward");
        const ref::AttentionGrads expected = ref::attention_backward(u, q, k, v, s, Transport::gradient());
        check_matches(g[0], expected.dq, 1e-5, "dq");
        check_matches(g[1], expected.dk, 1e-5, "dk");
        check_matches(g[2], expected.dv, 1e-5, "dv");
        check_matches(p[2], ref::attention_backward(u, q, k, v, s, soft).dv, 1e-5, "soft pullback's dv");
        const std::vector<std::vector<float>> bits = {y.to_vector(), g[0].to_vector(), g[1].to_vector(),
                                                      g[2].to_vector(), p[2].to_vector()};
        // Below AVX-512 the head products run on OpenBLAS (engine/gemm.h), whose sums of
        // many terms round differently from the engine's kernel; on short rows the two
        // agree, so there the bits show the softmax's own order of operations.
        if (widest.empty()) widest = bits;
        if (S <= 17) CHECK(bits == widest);
      }
      cap_vector_isa(VectorIsa::Avx512);  // back to the CPU's widest
    }
}

TEST_CASE("reference ops: the reference attention's gradient matches finite differences") {
  const ref::AttentionShape s{2, 4, 4, 3, 2, 0.7, true};
  const Values q = random_values(size_t(s.heads * s.T * s.d), 81, -2, 2),
               k = random_values(size_t(s.heads * s.S * s.d), 82, -2, 2),
               v = random_values(size_t(s.heads * s.S * s.dv), 83), u = random_values(size_t(s.heads * s.T * s.dv), 84);
  const ref::AttentionGrads g = ref::attention_backward(u, q, k, v, s, Transport::gradient());
  check_reference_gradient([&](const Values& p) { return ref::attention_forward(p, k, v, s); }, q, u, g.dq, "dq");
  check_reference_gradient([&](const Values& p) { return ref::attention_forward(q, p, v, s); }, k, u, g.dk, "dk");
  check_reference_gradient([&](const Values& p) { return ref::attention_forward(q, k, p, s); }, v, u, g.dv, "dv");
}

// ---------------------------------------------------------------------------------------
// linear and matmul

TEST_CASE("reference ops: linear and matmul under every transport match the reference") {
  const int64_t M = 5, in = 7, out = 4;
  const Values x = random_values(M * in, 91), w = random_values(out * in, 92), b = random_values(out, 93),
               u = random_values(M * out, 94);
  const Tensor xt = as_tensor({M, in}, x), wt = as_tensor({out, in}, w), bt = as_tensor({out}, b);
  Values w_transposed(in * out);  // matmul's right operand: (in, out)
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) w_transposed[i * out + o] = w[o * in + i];
  const Tensor wT = as_tensor({in, out}, w_transposed);
  Tensor y, z;
  {
    NoGrad no_grad;
    y = linear(xt, wt, bt);
    z = matmul(xt, wT);
  }
  check_matches(y, ref::linear_forward(x, w, b, M, in, out), 1e-5, "linear forward");
  check_matches(z, ref::matmul_forward(x, w_transposed, M, in, out), 1e-5, "matmul forward");
  const ref::LinearGrads lin = ref::linear_backward(u, x, w, M, in, out);
  const ref::MatmulGrads mm = ref::matmul_backward(u, x, w_transposed, M, in, out);
  for (const Transport& t : all_transports()) {
    INFO("transport ", std::string(to_string(t.kind)));
    const auto g = fast_vjp([](const Args& a) { return linear(a[0], a[1], a[2]); }, {xt, wt, bt},
                            as_tensor({M, out}, u), t);
    check_matches(g[0], lin.dx, 1e-5, "linear dx");
    check_matches(g[1], lin.dw, 1e-5, "linear dw");
    check_matches(g[2], lin.dbias, 1e-5, "linear dbias");
    const auto h = fast_vjp([](const Args& a) { return matmul(a[0], a[1]); }, {xt, wT}, as_tensor({M, out}, u), t);
    check_matches(h[0], mm.da, 1e-5, "matmul da");
    check_matches(h[1], mm.db, 1e-5, "matmul db");
  }
  check_reference_gradient([&](const Values& v) { return ref::linear_forward(v, w, b, M, in, out); }, x, u, lin.dx,
                           "reference linear dx");
  check_reference_gradient([&](const Values& v) { return ref::linear_forward(x, v, b, M, in, out); }, w, u, lin.dw,
                           "reference linear dw");
  check_reference_gradient([&](const Values& v) { return ref::matmul_forward(x, v, M, in, out); }, w_transposed, u,
                           mm.db, "reference matmul db");
}

// ---------------------------------------------------------------------------------------
// pooling

namespace {

// Values spaced apart in a random order: no ties, and no arg-max that a finite-difference
// step could flip.
Values distinct_values(size_t n, uint64_t seed) {
  Generator gen(seed);
  const std::vector<int64_t> order = permutation(int64_t(n), gen);
  Values v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.05 * double(order[i]) - 1.0;
  return v;
}

}  // namespace

TEST_CASE("reference ops: max- and average-pooling under every transport match the reference") {
  struct PoolCase {
    const char* what;
    ref::PoolShape s;
  };
  const std::vector<PoolCase> cases = {
      {"2x2 stride 2, windows tile the map", {2, 3, 6, 8, 2, 2, 2, 2, 0, 0}},
      {"3x3 stride 2 padding 1", {2, 2, 7, 6, 3, 3, 2, 2, 1, 1}},
      {"3x2 stride 1x2 padding 1x0", {1, 3, 6, 7, 3, 2, 1, 2, 1, 0}},
  };
  for (const PoolCase& c : cases) {
    INFO(c.what);
    const ref::PoolShape& s = c.s;
    const Shape shape{s.N, s.C, s.H, s.W}, out_shape{s.N, s.C, s.OH(), s.OW()};
    const Values x = distinct_values(size_t(numel(shape)), 101), u = random_values(size_t(numel(out_shape)), 102);
    const Tensor xt = as_tensor(shape, x), ut = as_tensor(out_shape, u);
    const Fn max_pool = [&](const Args& a) { return max_pool2d(a[0], s.kh, s.kw, s.sh, s.sw, s.ph, s.pw); };
    const Fn avg_pool = [&](const Args& a) { return avg_pool2d(a[0], s.kh, s.kw, s.sh, s.sw, s.ph, s.pw); };
    {
      NoGrad no_grad;
      check_matches(max_pool({xt}), ref::max_pool2d_forward(x, s), 1e-6, "max forward");
      check_matches(avg_pool({xt}), ref::avg_pool2d_forward(x, s), 1e-6, "avg forward");
    }
    for (const Transport& t : all_transports()) {
      INFO("transport ", std::string(to_string(t.kind)));
      check_matches(fast_vjp(max_pool, {xt}, ut, t)[0], ref::max_pool2d_backward(u, x, s, t), 1e-5, "max dx");
      check_matches(fast_vjp(avg_pool, {xt}, ut, t)[0], ref::avg_pool2d_backward(u, s), 1e-6, "avg dx");
    }
    check_reference_gradient([&](const Values& v) { return ref::max_pool2d_forward(v, s); }, x, u,
                             ref::max_pool2d_backward(u, x, s, Transport::gradient()), "reference max dx");
    check_reference_gradient([&](const Values& v) { return ref::avg_pool2d_forward(v, s); }, x, u,
                             ref::avg_pool2d_backward(u, s), "reference avg dx");
  }
}

// ---------------------------------------------------------------------------------------
// activations

TEST_CASE("reference ops: ReLU, GELU and SiLU under every transport match the reference") {
  // An even leading axis: DeepLift reads the batch [inputs; baselines].
  const Shape shape{4, 33};
  const Values z = random_values(size_t(numel(shape)), 111, -3, 3), u = random_values(size_t(numel(shape)), 112);
  const Tensor zt = as_tensor(shape, z), ut = as_tensor(shape, u);
  for (Activation kind : {Activation::Relu, Activation::Gelu, Activation::Silu}) {
    INFO(std::string(to_string(kind)));
    const Fn f = [kind](const Args& a) { return activation(a[0], kind); };
    {
      NoGrad no_grad;
      check_matches(f({zt}), ref::activation_forward(z, kind), 1e-5, "forward");
    }
    for (const Transport& t : all_transports()) {
      INFO("transport ", std::string(to_string(t.kind)));
      check_matches(fast_vjp(f, {zt}, ut, t)[0], ref::activation_backward(u, z, kind, t), 1e-5, "dz");
    }
    // The reference's gradient by finite differences (no z lies within a step of ReLU's kink).
    check_reference_gradient([kind](const Values& v) { return ref::activation_forward(v, kind); }, z, u,
                             ref::activation_backward(u, z, kind, Transport::gradient()), "reference gradient");
  }
}

// ---------------------------------------------------------------------------------------
// normalisation

TEST_CASE("reference ops: BatchNorm and LayerNorm under every transport match the reference") {
  const ref::BatchNormShape s{3, 4, 5};
  const Shape shape{s.N, s.C, s.L};
  const Values x = random_values(size_t(numel(shape)), 121, -2, 2), u = random_values(size_t(numel(shape)), 122),
               gamma = random_values(size_t(s.C), 123, 0.5, 1.5), beta = random_values(size_t(s.C), 124),
               running_mean = random_values(size_t(s.C), 125), running_var = random_values(size_t(s.C), 126, 0.5, 2);
  const Tensor xt = as_tensor(shape, x), ut = as_tensor(shape, u), gt = as_tensor({s.C}, gamma),
               bt = as_tensor({s.C}, beta), rmt = as_tensor({s.C}, running_mean), rvt = as_tensor({s.C}, running_var);
  const ref::Statistics batch = ref::batch_norm_statistics(x, s), running{running_mean, running_var};
  for (bool training : {true, false}) {
    INFO("BatchNorm, ", training ? "batch statistics" : "running statistics");
    const ref::Statistics& stats = training ? batch : running;
    const Fn f = [&, training](const Args& a) {
      return batch_norm(a[0], a[1], a[2], training ? Tensor() : rmt, training ? Tensor() : rvt, training);
    };
    {
      NoGrad no_grad;
      check_matches(f({xt, gt, bt}), ref::batch_norm_forward(x, gamma, beta, stats, s), 1e-5, "forward");
    }
    for (const Transport& t : all_transports()) {
      INFO("transport ", std::string(to_string(t.kind)));
      const auto g = fast_vjp(f, {xt, gt, bt}, ut, t);
      const ref::NormGrads expected = ref::batch_norm_backward(u, x, gamma, stats, training, s, t);
      check_matches(g[0], expected.dx, 1e-5, "dx");
      check_matches(g[1], expected.dgamma, 1e-5, "dgamma");
      check_matches(g[2], expected.dbeta, 1e-5, "dbeta");
    }
  }
  const ref::NormGrads bn = ref::batch_norm_backward(u, x, gamma, batch, true, s, Transport::gradient());
  check_reference_gradient(
      [&](const Values& v) { return ref::batch_norm_forward(v, gamma, beta, ref::batch_norm_statistics(v, s), s); }, x,
      u, bn.dx, "reference BatchNorm dx");
  check_reference_gradient([&](const Values& v) { return ref::batch_norm_forward(x, v, beta, batch, s); }, gamma, u,
                           bn.dgamma, "reference BatchNorm dgamma");

  const int64_t M = 6, D = 5;
  const Values lx = random_values(M * D, 131, -2, 2), lu = random_values(M * D, 132),
               lgamma = random_values(D, 133, 0.5, 1.5), lbeta = random_values(D, 134);
  const Tensor lxt = as_tensor({M, D}, lx), lut = as_tensor({M, D}, lu), lgt = as_tensor({D}, lgamma),
               lbt = as_tensor({D}, lbeta);
  const Fn ln = [](const Args& a) { return layer_norm(a[0], 1, a[1], a[2]); };
  {
    NoGrad no_grad;
    check_matches(ln({lxt, lgt, lbt}), ref::layer_norm_forward(lx, lgamma, lbeta, M, D), 1e-5, "LayerNorm forward");
  }
  for (const Transport& t : all_transports()) {
    INFO("LayerNorm, transport ", std::string(to_string(t.kind)));
    const auto g = fast_vjp(ln, {lxt, lgt, lbt}, lut, t);
    const ref::NormGrads expected = ref::layer_norm_backward(lu, lx, lgamma, M, D, t);
    check_matches(g[0], expected.dx, 1e-5, "dx");
    check_matches(g[1], expected.dgamma, 1e-5, "dgamma");
    check_matches(g[2], expected.dbeta, 1e-5, "dbeta");
  }
  check_reference_gradient([&](const Values& v) { return ref::layer_norm_forward(v, lgamma, lbeta, M, D); }, lx, lu,
                           ref::layer_norm_backward(lu, lx, lgamma, M, D, Transport::gradient()).dx,
                           "reference LayerNorm dx");
}

TEST_CASE("reference ops: BatchNorm with a residual and a ReLU as its tail under every transport matches the reference") {
  const ref::BatchNormShape s{4, 3, 5};  // an even batch for DeepLift's [inputs; baselines]
  const Shape shape{s.N, s.C, s.L};
  const Values x = random_values(size_t(numel(shape)), 141, -2, 2), r = random_values(size_t(numel(shape)), 142),
               u = random_values(size_t(numel(shape)), 143), gamma = random_values(size_t(s.C), 144, 0.5, 1.5),
               beta = random_values(size_t(s.C), 145), running_mean = random_values(size_t(s.C), 146),
               running_var = random_values(size_t(s.C), 147, 0.5, 2);
  const Tensor xt = as_tensor(shape, x), rt = as_tensor(shape, r), ut = as_tensor(shape, u),
               gt = as_tensor({s.C}, gamma), bt = as_tensor({s.C}, beta), rmt = as_tensor({s.C}, running_mean),
               rvt = as_tensor({s.C}, running_var);
  const ref::Statistics batch = ref::batch_norm_statistics(x, s), running{running_mean, running_var};
  for (bool training : {true, false}) {
    INFO(std::string(training ? "batch statistics" : "running statistics"));
    const ref::Statistics& stats = training ? batch : running;
    const Fn f = [&, training](const Args& a) {
      return batch_norm(a[0], a[1], a[2], training ? Tensor() : rmt, training ? Tensor() : rvt, training, 0.1f, 1e-5f,
                        {a[3], true});
    };
    {
      NoGrad no_grad;
      check_matches(f({xt, gt, bt, rt}), ref::batch_norm_tail_forward(x, gamma, beta, stats, r, true, s), 1e-5,
                    "forward");
    }
    for (const Transport& t : all_transports()) {
      INFO("transport ", std::string(to_string(t.kind)));
      const auto g = fast_vjp(f, {xt, gt, bt, rt}, ut, t);
      const ref::BatchNormTailGrads expected =
          ref::batch_norm_tail_backward(u, x, gamma, beta, stats, r, true, training, s, t);
      check_matches(g[0], expected.norm.dx, 1e-5, "dx");
      check_matches(g[1], expected.norm.dgamma, 1e-5, "dgamma");
      check_matches(g[2], expected.norm.dbeta, 1e-5, "dbeta");
      check_matches(g[3], expected.dresidual, 1e-5, "dresidual");
    }
  }
  // The reference's gradient by finite differences, in x and in the residual.
  const ref::BatchNormTailGrads exact =
      ref::batch_norm_tail_backward(u, x, gamma, beta, batch, r, true, true, s, Transport::gradient());
  check_reference_gradient(
      [&](const Values& v) { return ref::batch_norm_tail_forward(v, gamma, beta, ref::batch_norm_statistics(v, s), r, true, s); },
      x, u, exact.norm.dx, "reference tail dx");
  check_reference_gradient([&](const Values& v) { return ref::batch_norm_tail_forward(x, gamma, beta, batch, v, true, s); },
                           r, u, exact.dresidual, "reference tail dresidual");
}

// ---------------------------------------------------------------------------------------
// softmax, elementwise, bilinear, embedding, losses

TEST_CASE("reference ops: softmax, log_softmax and elementwise maps under every transport match the reference") {
  const int64_t rows = 4, n = 9;
  const Values x = random_values(rows * n, 141, -3, 3), u = random_values(rows * n, 142);
  const Tensor xt = as_tensor({rows, n}, x), ut = as_tensor({rows, n}, u);
  const Values y = ref::softmax_forward(x, rows, n), ly = ref::log_softmax_forward(x, rows, n);
  const Values positive = random_values(rows * n, 143, 0.2, 2), b = random_values(rows * n, 144);
  const Tensor pt = as_tensor({rows, n}, positive), bt = as_tensor({rows, n}, b);
  struct UnaryCase {
    ref::Unary kind;
    Tensor (*fast)(const Tensor&);
    bool positive_only;
  };
  const std::vector<UnaryCase> unaries = {{ref::Unary::Exp, exp, false},         {ref::Unary::Log, log, true},
                                          {ref::Unary::Tanh, tanh, false},       {ref::Unary::Sigmoid, sigmoid, false},
                                          {ref::Unary::Abs, abs, false},         {ref::Unary::Sqrt, sqrt, true}};
  for (const Transport& t : all_transports()) {
    INFO("transport ", std::string(to_string(t.kind)));
    check_matches(fast_vjp([](const Args& a) { return softmax(a[0], -1); }, {xt}, ut, t)[0],
                  ref::softmax_backward(u, y, rows, n), 1e-6, "softmax");
    check_matches(fast_vjp([](const Args& a) { return log_softmax(a[0], -1); }, {xt}, ut, t)[0],
                  ref::log_softmax_backward(u, ly, rows, n), 1e-5, "log_softmax");
    for (size_t i = 0; i < unaries.size(); ++i) {
      INFO("unary ", i);
      const UnaryCase& c = unaries[i];
      const Values& in = c.positive_only ? positive : x;
      const auto fast = c.fast;
      check_matches(fast_vjp([fast](const Args& a) { return fast(a[0]); }, {as_tensor({rows, n}, in)}, ut, t)[0],
                    ref::unary_backward(u, in, c.kind), 1e-4, "unary");
    }
    const auto g = fast_vjp([](const Args& a) { return mul(a[0], a[1]); }, {xt, bt}, ut, t);
    const ref::ProductGrads expected = ref::mul_backward(u, x, b);
    check_matches(g[0], expected.da, 1e-6, "mul da");
    check_matches(g[1], expected.db, 1e-6, "mul db");
  }
  {
    NoGrad no_grad;
    check_matches(softmax(xt, -1), y, 1e-6, "softmax forward");
    check_matches(log_softmax(xt, -1), ly, 1e-5, "log_softmax forward");
    for (const UnaryCase& c : unaries) {
      const Values& in = c.positive_only ? positive : x;
      check_matches(c.fast(as_tensor({rows, n}, in)), ref::unary_forward(in, c.kind), 1e-5, "unary forward");
    }
  }
  check_reference_gradient([&](const Values& v) { return ref::softmax_forward(v, rows, n); }, x, u,
                           ref::softmax_backward(u, y, rows, n), "reference softmax");
  check_reference_gradient([&](const Values& v) { return ref::log_softmax_forward(v, rows, n); }, x, u,
                           ref::log_softmax_backward(u, ly, rows, n), "reference log_softmax");
  for (const UnaryCase& c : unaries) {
    const Values& in = c.positive_only ? positive : x;
    check_reference_gradient([&](const Values& v) { return ref::unary_forward(v, c.kind); }, in, u,
                             ref::unary_backward(u, in, c.kind), "reference unary");
  }
}

TEST_CASE("reference ops: bilinear, embedding and losses under every transport match the reference") {
  const int64_t M = 5, d = 4, h = 3;
  const Values x = random_values(M * d, 151), L = random_values(h * (d + 1), 152), R = random_values(h * (d + 1), 153),
               u = random_values(M * h, 154);
  const Tensor xt = as_tensor({M, d}, x), Lt = as_tensor({h, d + 1}, L), Rt = as_tensor({h, d + 1}, R),
               ut = as_tensor({M, h}, u);
  const Fn bil = [](const Args& a) { return bilinear(a[0], a[1], a[2]); };

  const int64_t V = 6, D = 3;
  const std::vector<int64_t> indices = {4, 0, 4, 2, 5, 4, 1};  // 3 repeated: rows add up
  const Values table = random_values(V * D, 155), eu = random_values(indices.size() * D, 156);
  const Tensor tt = as_tensor({V, D}, table), eut = as_tensor({int64_t(indices.size()), D}, eu);
  const Fn emb = [&](const Args& a) { return embedding(a[0], indices, {int64_t(indices.size())}); };

  const int64_t N = 4, C = 5;
  const std::vector<int64_t> labels = {1, 4, 0, 1};
  const Values logits = random_values(N * C, 157, -2, 2), target = random_values(N * C, 158);
  const Tensor logits_t = as_tensor({N, C}, logits), target_t = as_tensor({N, C}, target);
  const Fn ce = [&](const Args& a) { return cross_entropy(a[0], labels, 0.1f); };
  const Fn mse = [](const Args& a) { return mse_loss(a[0], a[1]); };
  const double loss_u = 1.7;
  {
    NoGrad no_grad;
    check_matches(bil({xt, Lt, Rt}), ref::bilinear_forward(x, L, R, M, d, h), 1e-5, "bilinear forward");
    check_matches(emb({tt}), ref::embedding_forward(table, indices, D), 0, "embedding forward");
    const double expected_ce = ref::cross_entropy_forward(logits, labels, N, C, 0.1);
    CHECK(ce({logits_t}).item() == doctest::Approx(expected_ce).epsilon(1e-5));
    CHECK(mse({logits_t, target_t}).item() == doctest::Approx(ref::mse_forward(logits, target)).epsilon(1e-5));
  }
  for (const Transport& t : all_transports()) {
    INFO("transport ", std::string(to_string(t.kind)));
    const auto g = fast_vjp(bil, {xt, Lt, Rt}, ut, t);
    const ref::BilinearGrads expected = ref::bilinear_backward(u, x, L, R, M, d, h, t);
    check_matches(g[0], expected.dx, 1e-5, "bilinear dx");
    check_matches(g[1], expected.dL, 1e-5, "bilinear dL");
    check_matches(g[2], expected.dR, 1e-5, "bilinear dR");
    check_matches(fast_vjp(emb, {tt}, eut, t)[0], ref::embedding_backward(eu, indices, V, D), 1e-6, "embedding");
    check_matches(fast_vjp(ce, {logits_t}, Tensor::scalar(float(loss_u)), t)[0],
                  ref::cross_entropy_backward(loss_u, logits, labels, N, C, 0.1), 1e-6, "cross-entropy");
    const auto m = fast_vjp(mse, {logits_t, target_t}, Tensor::scalar(float(loss_u)), t);
    const ref::ProductGrads mse_expected = ref::mse_backward(loss_u, logits, target);
    check_matches(m[0], mse_expected.da, 1e-6, "mse da");
    check_matches(m[1], mse_expected.db, 1e-6, "mse db");
  }
  const ref::BilinearGrads bg = ref::bilinear_backward(u, x, L, R, M, d, h, Transport::gradient());
  check_reference_gradient([&](const Values& v) { return ref::bilinear_forward(v, L, R, M, d, h); }, x, u, bg.dx,
                           "reference bilinear dx");
  check_reference_gradient([&](const Values& v) { return ref::bilinear_forward(x, v, R, M, d, h); }, L, u, bg.dL,
                           "reference bilinear dL");
  check_reference_gradient([&](const Values& v) { return ref::embedding_forward(v, indices, D); }, table, eu,
                           ref::embedding_backward(eu, indices, V, D), "reference embedding");
  check_reference_gradient(
      [&](const Values& v) { return Values{ref::cross_entropy_forward(v, labels, N, C, 0.1)}; }, logits, {loss_u},
      ref::cross_entropy_backward(loss_u, logits, labels, N, C, 0.1), "reference cross-entropy");
  check_reference_gradient([&](const Values& v) { return Values{ref::mse_forward(v, target)}; }, logits, {loss_u},
                           ref::mse_backward(loss_u, logits, target).da, "reference mse");
}

// ---------------------------------------------------------------------------------------
// reductions and adaptive pooling

TEST_CASE("reference ops: mean, var, max and adaptive pooling under every transport match the reference") {
  const int64_t rows = 6, n = 7;
  const Values x = distinct_values(size_t(rows * n), 161), u = random_values(size_t(rows), 162);
  const Tensor xt = as_tensor({rows, n}, x), ut = as_tensor({rows}, u);
  const Fn fast_mean = [](const Args& a) { return mean(a[0], {1}); };
  const Fn fast_var = [](const Args& a) { return var(a[0], {1}); };
  const Fn fast_max = [](const Args& a) { return max(a[0], {1}); };

  const int64_t N = 2, C = 3, H = 7, W = 5, OH = 3, OW = 2;
  const Values px = random_values(size_t(N * C * H * W), 163), pu = random_values(size_t(N * C * OH * OW), 164);
  const Tensor pxt = as_tensor({N, C, H, W}, px), put = as_tensor({N, C, OH, OW}, pu);
  const Fn adaptive = [&](const Args& a) { return adaptive_avg_pool2d(a[0], OH, OW); };
  {
    NoGrad no_grad;
    check_matches(fast_mean({xt}), ref::mean_forward(x, rows, n), 1e-6, "mean forward");
    check_matches(fast_var({xt}), ref::var_forward(x, rows, n), 1e-5, "var forward");
    check_matches(fast_max({xt}), ref::max_forward(x, rows, n), 0, "max forward");
    check_matches(adaptive({pxt}), ref::adaptive_avg_pool2d_forward(px, N, C, H, W, OH, OW), 1e-6, "adaptive forward");
  }
  for (const Transport& t : all_transports()) {
    INFO("transport ", std::string(to_string(t.kind)));
    check_matches(fast_vjp(fast_mean, {xt}, ut, t)[0], ref::mean_backward(u, rows, n), 1e-6, "mean");
    check_matches(fast_vjp(fast_var, {xt}, ut, t)[0], ref::var_backward(u, x, rows, n), 1e-5, "var");
    check_matches(fast_vjp(fast_max, {xt}, ut, t)[0], ref::max_backward(u, x, rows, n, t), 1e-6, "max");
    check_matches(fast_vjp(adaptive, {pxt}, put, t)[0], ref::adaptive_avg_pool2d_backward(pu, N, C, H, W, OH, OW),
                  1e-6, "adaptive");
  }
  check_reference_gradient([&](const Values& v) { return ref::var_forward(v, rows, n); }, x, u,
                           ref::var_backward(u, x, rows, n), "reference var");
  check_reference_gradient([&](const Values& v) { return ref::max_forward(v, rows, n); }, x, u,
                           ref::max_backward(u, x, rows, n, Transport::gradient()), "reference max");
  check_reference_gradient([&](const Values& v) { return ref::adaptive_avg_pool2d_forward(v, N, C, H, W, OH, OW); },
                           px, pu, ref::adaptive_avg_pool2d_backward(pu, N, C, H, W, OH, OW), "reference adaptive");
}

// ---------------------------------------------------------------------------------------
// fused paths: their reference is the composition of the ops they fuse

TEST_CASE("reference ops: conv2d_batch_norm_eval and add_relu match the composed references") {
  const ConvCase c{"winograd", {2, 16, 6, 6}, {24, 16, 3, 3}, Conv2dOptions::square(1, 1), ConvAlgorithm::Winograd};
  const ref::ConvShape s = conv_shape(c);
  const int64_t O = c.w[0], P = s.OH() * s.OW();
  const Values x = random_values(size_t(numel(c.x)), 171), w = random_values(size_t(numel(c.w)), 172, -0.5, 0.5),
               b = random_values(size_t(O), 173), gamma = random_values(size_t(O), 174, 0.5, 1.5),
               beta = random_values(size_t(O), 175), mean = random_values(size_t(O), 176),
               variance = random_values(size_t(O), 177, 0.5, 2);
  const Tensor xt = as_tensor(c.x, x), wt = as_tensor(c.w, w), bt = as_tensor({O}, b);
  const EvalBatchNorm bn{as_tensor({O}, gamma), as_tensor({O}, beta), as_tensor({O}, mean),
                         as_tensor({O}, variance)};
  const ref::BatchNormShape bs{c.x[0], O, P};
  const Values z = ref::batch_norm_forward(ref::conv2d_forward(x, w, b, s), gamma, beta, {mean, variance}, bs);
  const Values expected = ref::activation_forward(z, Activation::Relu);
  NoGrad no_grad;
  check_matches(conv2d_batch_norm_eval(xt, wt, bt, c.options, bn, true), expected, 1e-4, "fused conv, BN, ReLU");
  check_matches(conv2d_batch_norm_eval(xt, wt, bt, c.options, bn, false), z, 1e-4, "fused conv, BN");

  const Values a = random_values(40, 178), d = random_values(40, 179);
  Values sum(40);
  for (size_t i = 0; i < sum.size(); ++i) sum[i] = double(float(a[i]) + float(d[i]));  // the float add both sides make
  check_matches(add_relu(as_tensor({4, 10}, a), as_tensor({4, 10}, d)), ref::activation_forward(sum, Activation::Relu),
                0, "add_relu");
}

// ---------------------------------------------------------------------------------------
// packed attention: the heads read in place from a projection's output

namespace {

// The heads of a packed (B, T, width) projection output, at column `offset` on: (B·heads, T, dh).
Values split_heads(const Values& packed, int64_t B, int64_t T, int64_t width, int64_t offset, int64_t heads,
                   int64_t dh) {
  Values out(B * heads * T * dh);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < dh; ++c)
          out[((b * heads + h) * T + t) * dh + c] = packed[(b * T + t) * width + offset + h * dh + c];
  return out;
}

// Its adjoint: (B·heads, T, dh) back into columns [offset, offset + heads·dh) of (B, T, width).
void merge_heads(const Values& split, int64_t B, int64_t T, int64_t width, int64_t offset, int64_t heads, int64_t dh,
                 Values& packed) {
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t c = 0; c < dh; ++c)
          packed[(b * T + t) * width + offset + h * dh + c] = split[((b * heads + h) * T + t) * dh + c];
}

}  // namespace

TEST_CASE("reference ops: packed qkv and kv attention under every transport match the reference") {
  const int64_t B = 2, T = 5, heads = 3, dh = 4, D = heads * dh, Tq = 2;
  const double scale = 0.4;
  const Values qkv = random_values(size_t(B * T * 3 * D), 181, -1.5, 1.5), u = random_values(size_t(B * T * D), 182);
  const Tensor qkv_t = as_tensor({B, T, 3 * D}, qkv), ut = as_tensor({B, T, D}, u);
  const Values q = split_heads(qkv, B, T, 3 * D, 0, heads, dh), k = split_heads(qkv, B, T, 3 * D, D, heads, dh),
               v = split_heads(qkv, B, T, 3 * D, 2 * D, heads, dh), us = split_heads(u, B, T, D, 0, heads, dh);
  // The kv variant: the first Tq tokens' queries (B, Tq, D) against every token's keys and values.
  Values q_first(B * Tq * D), kv(B * T * 2 * D);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t j = 0; j < 3 * D; ++j) {
        const double e = qkv[(b * T + t) * 3 * D + j];
        if (j < D && t < Tq) q_first[(b * Tq + t) * D + j] = e;
        if (j >= D) kv[(b * T + t) * 2 * D + j - D] = e;
      }
  const Values uq = random_values(size_t(B * Tq * D), 183);
  const Tensor q_first_t = as_tensor({B, Tq, D}, q_first), kv_t = as_tensor({B, T, 2 * D}, kv),
               uq_t = as_tensor({B, Tq, D}, uq);

  for (bool causal : {false, true}) {
    INFO("causal ", causal);
    const ref::AttentionShape s{B * heads, T, T, dh, dh, scale, causal};
    const Fn f = [&](const Args& a) { return packed_qkv_attention(a[0], heads, causal, float(scale)); };
    Values expected_y(B * T * D);
    merge_heads(ref::attention_forward(q, k, v, s), B, T, D, 0, heads, dh, expected_y);
    {
      NoGrad no_grad;
      check_matches(f({qkv_t}), expected_y, 1e-5, "forward");
    }
    for (const Transport& t : all_transports()) {
      INFO("transport ", std::string(to_string(t.kind)));
      const ref::AttentionGrads g = ref::attention_backward(us, q, k, v, s, t);
      Values expected(qkv.size());
      merge_heads(g.dq, B, T, 3 * D, 0, heads, dh, expected);
      merge_heads(g.dk, B, T, 3 * D, D, heads, dh, expected);
      merge_heads(g.dv, B, T, 3 * D, 2 * D, heads, dh, expected);
      check_matches(fast_vjp(f, {qkv_t}, ut, t)[0], expected, 1e-5, "dqkv");
    }
  }

  const ref::AttentionShape s{B * heads, Tq, T, dh, dh, scale, false};
  const Values qs = split_heads(q_first, B, Tq, D, 0, heads, dh), uqs = split_heads(uq, B, Tq, D, 0, heads, dh);
  const Fn f = [&](const Args& a) { return packed_kv_attention(a[0], a[1], heads, float(scale)); };
  for (const Transport& t : all_transports()) {
    INFO("kv attention, transport ", std::string(to_string(t.kind)));
    const ref::AttentionGrads g = ref::attention_backward(uqs, qs, k, v, s, t);
    Values dq(q_first.size()), dkv(kv.size());
    merge_heads(g.dq, B, Tq, D, 0, heads, dh, dq);
    merge_heads(g.dk, B, T, 2 * D, 0, heads, dh, dkv);
    merge_heads(g.dv, B, T, 2 * D, D, heads, dh, dkv);
    const auto fast = fast_vjp(f, {q_first_t, kv_t}, uq_t, t);
    check_matches(fast[0], dq, 1e-5, "dq");
    check_matches(fast[1], dkv, 1e-5, "dkv");
  }
}
