// The autograd core, tested with tiny ops defined here so that it stands on its own.
#include <doctest/doctest.h>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "tests/support.h"

using namespace adjoint;

namespace {
// y = a * x elementwise (both recorded), with a transport-dependent rule so the tests
// can see which transport ran: the pullback freezes `a` (no cotangent for it).
class ScaleNode : public Node {
public:
  ScaleNode(Tensor a, Tensor x) : a_(std::move(a)), x_(std::move(x)) {}
  std::string name() const override { return "test_scale"; }
  std::vector<Tensor> vjp(const Tensor& u, const Transport& t) override {
    Tensor gx = Tensor::empty(u.shape()), ga = Tensor::empty(u.shape());
    const float *pu = u.data(), *pa = a_.data(), *px = x_.data();
    for (int64_t i = 0; i < u.numel(); ++i) gx.data()[i] = pu[i] * pa[i], ga.data()[i] = pu[i] * px[i];
    if (!t.is_gradient()) return {Tensor(), gx};
    return {ga, gx};
  }
  Tensor a_, x_;  // the values the vjp reads; the node's edges hold none
};
Tensor scale(const Tensor& a, const Tensor& x) {
  Tensor out = Tensor::empty(x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) out.data()[i] = a.data()[i] * x.data()[i];
  if (needs_grad({a, x})) attach(out, std::make_shared<ScaleNode>(a.detach(), x.detach()), {a, x});
  return out;
}
}  // namespace

TEST_CASE("tensor views share storage and contiguous() copies only when needed") {
  Tensor t = Tensor::from_vector({2, 3}, {0, 1, 2, 3, 4, 5});
  CHECK(t.is_contiguous());
  Tensor tt = t.view_as_strided({3, 2}, {1, 3}, 0);  // the transpose
  CHECK_FALSE(tt.is_contiguous());
  CHECK(tt.at({2, 1}) == 5.0f);
  CHECK(tt.to_vector() == std::vector<float>{0, 3, 1, 4, 2, 5});
  Tensor c = tt.contiguous();
  CHECK(c.is_contiguous());
  CHECK(c.impl()->storage != t.impl()->storage);
  CHECK(t.contiguous().impl() == t.impl());
  Tensor b = t.view_as_strided({4, 3}, {0, 1}, 3);  // broadcast of the second row
  CHECK(b.to_vector() == std::vector<float>{3, 4, 5, 3, 4, 5, 3, 4, 5, 3, 4, 5});
  CHECK_THROWS_WITH_AS(tt.data(), doctest::Contains("not contiguous"), Error);
  CHECK_THROWS_WITH_AS(Tensor::from_vector({2, 2}, {1, 2, 3}), doctest::Contains("[2, 2]"), Error);
  CHECK_THROWS_WITH_AS(t.at({0, 3}), doctest::Contains("out of range"), Error);
}

TEST_CASE("contiguous() of a large strided view, copied in parallel chunks, keeps every element") {
  // Runs of 300 along the transposed axis, several chunks of runs; the 3-d case starts
  // chunks in the middle of the outer index.
  Tensor t = testing::random_tensor({400, 300}, 7);
  Tensor tt = t.view_as_strided({300, 400}, {1, 300}, 0).contiguous();
  Tensor b = testing::random_tensor({6, 70, 500}, 8);
  Tensor bt = b.view_as_strided({500, 6, 70}, {1, 70 * 500, 500}, 0).contiguous();
  int bad = 0;
  for (int64_t i = 0; i < 300; ++i)
    for (int64_t j = 0; j < 400; ++j) bad += tt.data()[i * 400 + j] != t.data()[j * 300 + i];
  for (int64_t i = 0; i < 500; ++i)
    for (int64_t j = 0; j < 6; ++j)
      for (int64_t k = 0; k < 70; ++k) bad += bt.data()[(i * 6 + j) * 70 + k] != b.data()[(j * 70 + k) * 500 + i];
  CHECK(bad == 0);
}

TEST_CASE("backward accumulates over shared uses and into leaves") {
  Tensor a = Tensor::from_vector({3}, {1, 2, 3}).requires_grad_();
  Tensor x = Tensor::from_vector({3}, {4, 5, 6}).requires_grad_();
  // y = a*(a*x): dy/da = 2 a x, dy/dx = a².
  Tensor y = scale(a, scale(a, x));
  backward(y, Tensor::ones({3}));
  CHECK(a.grad().to_vector() == std::vector<float>{8, 20, 36});
  CHECK(x.grad().to_vector() == std::vector<float>{1, 4, 9});
  // backward() frees the graph: a second pass needs a new forward, and accumulates.
  CHECK_THROWS_WITH_AS(backward(y, Tensor::ones({3})), doctest::Contains("already consumed"), Error);
  y = scale(a, scale(a, x));
  backward(y, Tensor::ones({3}));
  CHECK(a.grad().to_vector() == std::vector<float>{16, 40, 72});
  a.zero_grad();
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("grad and vjp return cotangents without touching .grad, per transport") {
  Tensor a = Tensor::from_vector({2}, {2, 3}).requires_grad_();
  Tensor x = Tensor::from_vector({2}, {5, 7}).requires_grad_();
  Tensor h = scale(a, x);
  Tensor y = scale(a, h);
  auto g = grad(y, {a, x, h}, Tensor::ones({2}));
  CHECK(g[0].to_vector() == std::vector<float>{20, 42});  // 2 a x
  CHECK(g[1].to_vector() == std::vector<float>{4, 9});
  CHECK(g[2].to_vector() == std::vector<float>{2, 3});  // an intermediate tensor
  CHECK_FALSE(a.grad().defined());
  // Under the pullback `a` is a frozen gate: nothing reaches it.
  auto p = grad(y, {a, x}, Tensor::ones({2}), Transport::pullback());
  CHECK(p[0].to_vector() == std::vector<float>{0, 0});
  CHECK(p[1].to_vector() == std::vector<float>{4, 9});
  auto v = vjp([&](const std::vector<Tensor>& in) { return scale(a, in[0]); }, {x}, Tensor::ones({2}));
  CHECK(v[0].to_vector() == std::vector<float>{2, 3});
  CHECK_FALSE(a.grad().defined());
}

TEST_CASE("NoGrad stops recording; shape errors name the shapes") {
  Tensor a = Tensor::ones({2}).requires_grad_();
  {
    NoGrad off;
    CHECK_FALSE(scale(a, a).requires_grad());
  }
  CHECK(scale(a, a).requires_grad());
  CHECK_THROWS_WITH_AS(backward(scale(a, a)), doctest::Contains("needs an explicit cotangent"), Error);
  CHECK_THROWS_WITH_AS(backward(scale(a, a), Tensor::ones({3})), doctest::Contains("[3]"), Error);
}

TEST_CASE("Philox draws do not depend on the thread count") {
  set_num_threads(1);
  Generator g1(42);
  std::vector<float> one = normal({100000}, 0, 1, g1).to_vector();
  set_num_threads(2);
  Generator g2(42);
  std::vector<float> two = normal({100000}, 0, 1, g2).to_vector();
  CHECK(one == two);
  double mean = 0, sq = 0;
  for (float v : one) mean += v, sq += double(v) * v;
  mean /= one.size();
  CHECK(std::abs(mean) < 0.02);
  CHECK(std::abs(sq / one.size() - 1.0) < 0.02);
  Generator g3(43);
  CHECK(normal({4}, 0, 1, g3).to_vector() != std::vector<float>(one.begin(), one.begin() + 4));
  set_num_threads(0);
}

TEST_CASE("normal_noise: four standard normal values a Philox call, whatever the threads or the split") {
  set_num_threads(1);
  Generator g1(42);
  const std::vector<float> one = normal_noise({100001}, 0, 1, g1).to_vector();
  CHECK(g1.offset() == 25001);  // ⌈100001 / 4⌉ counters
  set_num_threads(2);
  Generator g2(42);
  CHECK(normal_noise({100001}, 0, 1, g2).to_vector() == one);
  set_num_threads(0);
  // Counter c gives values 4c..4c+3, so two draws of 8 are one draw of 16.
  Generator whole(7), split(7);
  std::vector<float> halves = normal_noise({8}, 0, 1, split).to_vector();
  const std::vector<float> second = normal_noise({8}, 0, 1, split).to_vector();
  halves.insert(halves.end(), second.begin(), second.end());
  CHECK(normal_noise({16}, 0, 1, whole).to_vector() == halves);
  // Moments of N(0, 1) (standard errors about 0.003, 0.0045, 0.03), the share beyond 2σ
  // (0.0455, s.e. 0.0007), the bound of 23-bit uniforms, and no correlation between the
  // two values of one Box–Muller pair or between pairs.
  double sum = 0, sq = 0, fourth = 0, beyond = 0, within_pair = 0, across_pairs = 0, largest = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    const double v = one[i];
    sum += v, sq += v * v, fourth += v * v * v * v, beyond += std::abs(v) > 2.0, largest = std::max(largest, std::abs(v));
    if (i % 2 == 0 && i + 1 < one.size()) within_pair += v * one[i + 1];
    if (i % 4 == 0 && i + 2 < one.size()) across_pairs += v * one[i + 2];
  }
  const double n = double(one.size());
  CHECK(std::abs(sum / n) < 0.015);
  CHECK(std::abs(sq / n - 1.0) < 0.02);
  CHECK(std::abs(fourth / n - 3.0) < 0.15);
  CHECK(std::abs(beyond / n - 0.0455) < 0.004);
  CHECK(std::abs(within_pair / (n / 2)) < 0.02);
  CHECK(std::abs(across_pairs / (n / 4)) < 0.03);
  CHECK(largest < 5.8);
  CHECK(largest > 3.5);
  // Mean and standard deviation scale the values; another seed gives other values.
  Generator g3(42), g4(43);
  const std::vector<float> scaled = normal_noise({4}, 1.5f, 0.25f, g3).to_vector();
  for (int i = 0; i < 4; ++i) CHECK(scaled[i] == doctest::Approx(1.5 + 0.25 * one[i]).epsilon(1e-6));
  CHECK(normal_noise({4}, 0, 1, g4).to_vector() != std::vector<float>(one.begin(), one.begin() + 4));
  CHECK_THROWS_WITH_AS(normal_noise({4}, 0, -1, g4), doctest::Contains("negative standard deviation"), Error);
}

TEST_CASE("a cotangent passed through unchanged is never summed into in place") {
  // contiguous() hands its cotangent on as is; t then receives a second one, and the
  // sum must not be written into the tensor already delivered for c.
  Tensor x = Tensor::from_vector({2, 2}, {1, 2, 3, 4}).requires_grad_();
  Tensor t = transpose(x, 0, 1);
  Tensor c = t.contiguous();
  Tensor o = add(t * 1.0f, c * 2.0f);
  auto g = grad(o, {c, t}, Tensor::ones({2, 2}));
  CHECK(g[0].to_vector() == std::vector<float>{2, 2, 2, 2});
  CHECK(g[1].to_vector() == std::vector<float>{3, 3, 3, 3});
}

TEST_CASE("a recorded graph keeps only the values its vjps read") {
  // add_scalar's vjp reads nothing, so each intermediate of the chain dies as soon as the
  // next op has run: the graph holds edges to its inputs, not the inputs themselves.
  const int64_t n = 1 << 18;  // 1 MiB per tensor
  Tensor x = Tensor::zeros({n}).requires_grad_();
  const int64_t before = memory_stats().current_bytes;
  Tensor y = x;
  for (int i = 0; i < 8; ++i) y = add_scalar(y, 1.0f);
  CHECK(memory_stats().current_bytes - before < 2 * n * int64_t(sizeof(float)));  // y alone, not 8 tensors
  backward(y, Tensor::ones({n}));
  CHECK(x.grad().to_vector() == std::vector<float>(size_t(n), 1.0f));
}

TEST_CASE("grad's ready hook gives each input's final cotangent once, early layers last") {
  // Four layers; w0 is used by the first layer and again by the last, so its first
  // cotangent arrives early in backward and its last one at the very end.
  Tensor x = Tensor::from_vector({3}, {1.0f, -2.0f, 0.5f});
  std::vector<Tensor> w;
  for (int i = 0; i < 3; ++i) {
    w.push_back(Tensor::from_vector({3}, {1.5f + float(i), -0.5f * float(i + 1), 0.25f + float(i)}));
    w.back().requires_grad_();
  }
  Tensor unused = Tensor::ones({2});
  unused.requires_grad_();
  Tensor out = scale(w[0], scale(w[2], scale(w[1], scale(w[0], x))));
  std::vector<size_t> ready_order;
  std::vector<std::vector<float>> ready_values(4);
  const std::vector<Tensor> wrt = {w[0], w[1], w[2], unused};
  const std::vector<Tensor> grads = grad(
      out, wrt,
      [&](size_t i, const Tensor& g) {
        ready_order.push_back(i);
        ready_values[i] = g.to_vector();
      },
      Tensor::ones({3}));
  // Backward runs the last layer (w0's second use) first, then w2, w1 and w0's first use.
  CHECK(ready_order == std::vector<size_t>{2, 1, 0, 3});
  for (size_t i = 0; i < wrt.size(); ++i) {
    INFO("input ", i);
    CHECK(ready_values[i] == grads[i].to_vector());  // the final value, not a partial sum
  }
  CHECK(grads[3].to_vector() == std::vector<float>{0.0f, 0.0f});
  const std::vector<Tensor> without_hook = grad(out, wrt, Tensor::ones({3}));
  for (size_t i = 0; i < wrt.size(); ++i) CHECK(without_hook[i].to_vector() == grads[i].to_vector());
}
