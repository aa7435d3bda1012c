// The soft pullback's gates are expected hard gates under noise on what the gate reads
// (docs/methods.md §1.2, "Where the soft gates come from"). Each claim of that derivation
// is checked here by Monte Carlo against the engine's own transport: the estimate must lie
// within four standard errors of the engine's gate.
//   ReLU      E[1{z + τε > 0}], ε ~ N(0, 1)       = Φ(z/τ), the engine's ReLU soft gate
//   GELU      the same at τ = 1                    = Φ(z), GELU's own frozen gate
//   SiLU      E[1{z + τε > 0}], ε ~ logistic        = σ(z/τ), the engine's SiLU soft gate
//   max-pool  P(i wins a window w + τg), g ~ Gumbel = softmax(w/τ)_i, the soft route
//   attention the same on the scores QKᵀ·s          = softmax(QKᵀ·s/τ), the soft pattern
//   network   the mean over independent gate noise of the hard pullback W(x)ᵀu with the
//             noisy gates = the soft pullback (the expectation of a product of independent
//             factors is the product of their expectations).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/autograd.h"
#include "engine/random.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/layout.h"
#include "ops/matmul.h"
#include "ops/pool.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

constexpr int64_t kSamples = 200000;

// What an activation's soft pullback multiplies a unit cotangent by, at each z.
std::vector<float> soft_gate(Activation kind, const std::vector<float>& z, const Transport& t) {
  const Tensor x = Tensor::from_vector({int64_t(z.size())}, z);
  const Tensor ones = Tensor::from_vector({int64_t(z.size())}, std::vector<float>(z.size(), 1.0f));
  return vjp([&](const std::vector<Tensor>& in) { return activation(in[0], kind); }, {x}, ones, t)[0].to_vector();
}

// Noise samples of one law, drawn from the engine's counter-based generator.
std::vector<double> standard_normal(int64_t n, uint64_t seed) {
  Generator gen(seed);
  const std::vector<float> v = normal({n}, 0.0f, 1.0f, gen).to_vector();
  return {v.begin(), v.end()};
}
// Logistic: the inverse CDF log(U/(1−U)) of a uniform U, kept off 0 and 1.
std::vector<double> standard_logistic(int64_t n, uint64_t seed) {
  Generator gen(seed);
  std::vector<double> out;
  for (float u : uniform({n}, 0.0f, 1.0f, gen).to_vector()) {
    const double p = std::clamp(double(u), 1e-12, 1.0 - 1e-12);
    out.push_back(std::log(p / (1.0 - p)));
  }
  return out;
}
// Gumbel: the inverse CDF −log(−log U).
std::vector<double> standard_gumbel(int64_t n, uint64_t seed) {
  Generator gen(seed);
  std::vector<double> out;
  for (float u : uniform({n}, 0.0f, 1.0f, gen).to_vector())
    out.push_back(-std::log(-std::log(std::clamp(double(u), 1e-12, 1.0 - 1e-12))));
  return out;
}

// The share of samples where z + τ·ε > 0: a Monte Carlo estimate of the expected gate.
double expected_gate(double z, double tau, const std::vector<double>& noise) {
  int64_t open = 0;
  for (double e : noise) open += z + tau * e > 0 ? 1 : 0;
  return double(open) / double(noise.size());
}

// CHECKs that a Monte Carlo frequency p̂ lies within four standard errors of p.
void check_frequency(double estimate, double p, int64_t n, const char* what) {
  const double standard_error = std::sqrt(std::max(p * (1 - p), 1e-12) / double(n));
  INFO(what, ": Monte Carlo ", estimate, ", engine ", p, ", standard error ", standard_error);
  CHECK(std::abs(estimate - p) < 4 * standard_error + 1e-6);
}

// How often each position wins argmax(scores + τ·g) over independent Gumbel draws g.
std::vector<double> gumbel_max_frequencies(const std::vector<double>& scores, double tau, uint64_t seed) {
  const int64_t k = int64_t(scores.size());
  const std::vector<double> g = standard_gumbel(kSamples * k, seed);
  std::vector<double> wins(scores.size(), 0.0);
  for (int64_t s = 0; s < kSamples; ++s) {
    int64_t best = 0;
    for (int64_t i = 1; i < k; ++i)
      if (scores[size_t(i)] + tau * g[size_t(s * k + i)] > scores[size_t(best)] + tau * g[size_t(s * k + best)]) best = i;
    wins[size_t(best)] += 1.0 / double(kSamples);
  }
  return wins;
}

const std::vector<float> kPreActivations = {-1.7f, -0.6f, -0.15f, 0.0f, 0.2f, 0.45f, 1.3f};

}  // namespace

TEST_CASE("soft gates: ReLU's is the expected step under Gaussian noise of scale tau") {
  const std::vector<double> noise = standard_normal(kSamples, 1);
  for (float tau : {0.6f, 0.25f, 1.5f}) {
    Temperatures t;
    t.relu = tau;
    const std::vector<float> gate = soft_gate(Activation::Relu, kPreActivations, Transport::soft_pullback(t));
    for (size_t i = 0; i < kPreActivations.size(); ++i)
      check_frequency(expected_gate(kPreActivations[i], tau, noise), gate[i], kSamples, "relu");
  }
}

TEST_CASE("soft gates: GELU's frozen gate is the expected step under unit Gaussian noise, and its soft gate at scale tau") {
  const std::vector<double> noise = standard_normal(kSamples, 2);
  const std::vector<float> frozen = soft_gate(Activation::Gelu, kPreActivations, Transport::pullback());
  Temperatures t;
  t.gelu = 0.5f;
  const std::vector<float> soft = soft_gate(Activation::Gelu, kPreActivations, Transport::soft_pullback(t));
  for (size_t i = 0; i < kPreActivations.size(); ++i) {
    check_frequency(expected_gate(kPreActivations[i], 1.0, noise), frozen[i], kSamples, "gelu pullback");
    check_frequency(expected_gate(kPreActivations[i], 0.5, noise), soft[i], kSamples, "gelu soft pullback");
  }
}

TEST_CASE("soft gates: SiLU's is the expected step under logistic noise of scale tau") {
  const std::vector<double> noise = standard_logistic(kSamples, 3);
  const std::vector<float> frozen = soft_gate(Activation::Silu, kPreActivations, Transport::pullback());
  const std::vector<float> soft = soft_gate(Activation::Silu, kPreActivations, Transport::soft_pullback());
  for (size_t i = 0; i < kPreActivations.size(); ++i) {
    check_frequency(expected_gate(kPreActivations[i], 1.0, noise), frozen[i], kSamples, "silu pullback");
    check_frequency(expected_gate(kPreActivations[i], Temperatures{}.silu, noise), soft[i], kSamples,
                    "silu soft pullback");
  }
}

TEST_CASE("soft gates: the soft max-pool route is the Gumbel-max winner's distribution") {
  // One window of five values, pooled by a 1×5 window; a unit cotangent on the pooled value
  // comes back as the route's weights.
  const std::vector<float> window = {0.3f, -0.2f, 0.25f, 0.9f, 0.1f};
  const Tensor x = Tensor::from_vector({1, 1, 1, 5}, window);
  const Tensor one = Tensor::from_vector({1, 1, 1, 1}, {1.0f});
  const double tau = Temperatures{}.max_pool;
  const std::vector<float> route =
      vjp([](const std::vector<Tensor>& in) { return max_pool2d(in[0], 1, 5, 1, 5, 0, 0); }, {x}, one,
          Transport::soft_pullback())[0]
          .to_vector();
  const std::vector<double> wins = gumbel_max_frequencies({window.begin(), window.end()}, tau, 4);
  for (size_t i = 0; i < window.size(); ++i) check_frequency(wins[i], route[i], kSamples, "max-pool");
}

TEST_CASE("soft gates: the soft attention pattern is the Gumbel-max winner's distribution over the scores") {
  // One query, four keys; the values are the identity, so the cotangent of V under a unit
  // cotangent on the output's first column is the pattern's row, A_τ[0, :].
  const int64_t keys = 4, dim = 3;
  const Tensor q = random_tensor({1, 1, 1, dim}, 5, -1.5f, 1.5f), k = random_tensor({1, 1, keys, dim}, 6, -1.5f, 1.5f);
  std::vector<float> identity(size_t(keys * keys), 0.0f);
  for (int64_t i = 0; i < keys; ++i) identity[size_t(i * keys + i)] = 1.0f;
  const Tensor v = Tensor::from_vector({1, 1, keys, keys}, identity);
  std::vector<float> first_column(size_t(keys), 0.0f);
  first_column[0] = 1.0f;
  const Tensor u = Tensor::from_vector({1, 1, 1, keys}, first_column);
  Temperatures t;
  t.attention = 0.7f;
  const Tensor dv = vjp([](const std::vector<Tensor>& in) { return scaled_dot_product_attention(in[0], in[1], in[2]); },
                        {q, k, v}, u, Transport::soft_pullback(t))[2];
  std::vector<double> scores;
  for (int64_t j = 0; j < keys; ++j) {
    double s = 0;
    for (int64_t d = 0; d < dim; ++d) s += double(q.at({0, 0, 0, d})) * double(k.at({0, 0, j, d}));
    scores.push_back(s / std::sqrt(double(dim)));
  }
  const std::vector<double> wins = gumbel_max_frequencies(scores, t.attention, 7);
  for (int64_t j = 0; j < keys; ++j) check_frequency(wins[size_t(j)], dv.at({0, 0, j, 0}), kSamples, "attention");
}

TEST_CASE("soft gates: a ReLU network's soft pullback is its pullback averaged over independent gate noise") {
  // f(x) = W3·relu(W2·relu(W1 x + b1) + b2) + b3. The noise moves only each gate's
  // decision, 1{z + τε > 0}; the values carried forward stay those of x, as the soft
  // pullback leaves the forward pass alone.
  const int64_t in = 5, h1 = 7, h2 = 6, out = 3, c = 1;
  const Tensor w1 = random_tensor({h1, in}, 11), b1 = random_tensor({h1}, 12, -0.3f, 0.3f);
  const Tensor w2 = random_tensor({h2, h1}, 13), b2 = random_tensor({h2}, 14, -0.3f, 0.3f);
  const Tensor w3 = random_tensor({out, h2}, 15), b3 = random_tensor({out}, 16);
  const Tensor x = random_tensor({1, in}, 17);
  std::vector<float> one_hot(size_t(out), 0.0f);
  one_hot[size_t(c)] = 1.0f;
  const Tensor e_c = Tensor::from_vector({1, out}, one_hot);
  auto network = [&](const std::vector<Tensor>& a) {
    return linear(relu(linear(relu(linear(a[0], w1, b1)), w2, b2)), w3, b3);
  };
  const std::vector<float> soft = vjp(network, {x}, e_c, Transport::soft_pullback())[0].to_vector();
  const std::vector<float> hard = vjp(network, {x}, e_c, Transport::pullback())[0].to_vector();

  const Tensor z1 = linear(x, w1, b1), z2 = linear(relu(z1), w2, b2);
  const double tau = Temperatures{}.relu;
  const int64_t n = 40000;
  const std::vector<double> noise = standard_normal(n * (h1 + h2), 18);
  std::vector<double> mean(size_t(in), 0.0), square(size_t(in), 0.0);
  for (int64_t s = 0; s < n; ++s) {
    const double* e = &noise[size_t(s * (h1 + h2))];
    // Back from e_c: W3ᵀ e_c, the second layer's noisy gates, W2ᵀ, the first's, W1ᵀ.
    std::vector<double> g2(static_cast<size_t>(h2)), g1(static_cast<size_t>(h1), 0.0);
    for (int64_t j = 0; j < h2; ++j)
      g2[size_t(j)] = z2.at({0, j}) + tau * e[h1 + j] > 0 ? double(w3.at({c, j})) : 0.0;
    for (int64_t i = 0; i < h1; ++i) {
      if (!(z1.at({0, i}) + tau * e[i] > 0)) continue;
      for (int64_t j = 0; j < h2; ++j) g1[size_t(i)] += double(w2.at({j, i})) * g2[size_t(j)];
    }
    for (int64_t d = 0; d < in; ++d) {
      double v = 0;
      for (int64_t i = 0; i < h1; ++i) v += double(w1.at({i, d})) * g1[size_t(i)];
      mean[size_t(d)] += v / double(n);
      square[size_t(d)] += v * v / double(n);
    }
  }
  double largest_gap_to_hard = 0, largest_error = 0;
  for (int64_t d = 0; d < in; ++d) {
    const double standard_error = std::sqrt(std::max(square[size_t(d)] - mean[size_t(d)] * mean[size_t(d)], 0.0) / double(n));
    INFO("input ", d, ": Monte Carlo ", mean[size_t(d)], ", soft pullback ", soft[size_t(d)], ", standard error ",
         standard_error);
    CHECK(std::abs(mean[size_t(d)] - soft[size_t(d)]) < 4 * standard_error + 1e-6);
    largest_error = std::max(largest_error, standard_error);
    largest_gap_to_hard = std::max(largest_gap_to_hard, std::abs(double(soft[size_t(d)]) - double(hard[size_t(d)])));
  }
  // The check has power: the soft pullback stands far from the hard one, in standard errors.
  CHECK(largest_gap_to_hard > 20 * largest_error);
}
