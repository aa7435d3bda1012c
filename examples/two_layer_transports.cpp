// A two-layer network built with the C++ API, and the three ways the engine carries a
// cotangent back to its input: the gradient, the pullback and the soft pullback
// (docs/transports.md derives each; docs/methods.md §1.2 is the table).
//
//   f(x) = W2 · maxpool(gelu(W1 · x + b1)) + b2
//
// x has 6 inputs; the 8 hidden units are pooled in pairs (units 2k and 2k+1) into 4;
// there are 3 logits. GELU and max-pool are chosen because they make the three columns
// differ. (With ReLU alone, the pullback of the network *is* its gradient: a frozen ReLU
// gate and its derivative are the same step.)
//
// For one input x and the class c with the largest logit, it prints ∂f_c/∂x three ways,
// side by side, then checks each against what it should be. With z = W1 x + b1 and
// h = gelu(z):
//   gradient       against central finite differences of f_c, and against its closed
//                  form W1ᵀ diag(Φ(z) + z·φ(z)) Rᵀ W2ᵀ e_c, where R routes each pooled
//                  unit to the winner of its pair;
//   pullback       GELU's gate Φ(z) and the pool's route held fixed:
//                  W1ᵀ diag(Φ(z)) Rᵀ W2ᵀ e_c (the derivative of the gate, z·φ(z), is left out);
//   soft pullback  the gate softened to Φ(z/τ_gelu), the route spread over each pair
//                  with the fixed weights S = softmax(h_pair/τ_pool):
//                  W1ᵀ diag(Φ(z/τ_gelu)) Sᵀ W2ᵀ e_c.
// At GELU's default τ_gelu = 1 its soft gate is its frozen gate, so with the default
// temperatures the soft pullback leaves the pullback through the max-pool alone.
//
// Usage: two_layer_transports [SEED]   (default 7)
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/random.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/matmul.h"
#include "ops/pool.h"
#include "ops/reduce.h"

using namespace adjoint;

namespace {

double normal_cdf(double z) { return 0.5 * std::erfc(-z / std::sqrt(2.0)); }
double normal_pdf(double z) { return std::exp(-0.5 * z * z) / std::sqrt(2.0 * M_PI); }

}  // namespace

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::stoull(argv[1]) : 7;
  const int64_t inputs = 6, hidden = 8, pooled = hidden / 2, classes = 3;

  // The weights, drawn once. linear(x, W, b) computes x·Wᵀ + b, as torch's F.linear.
  Generator gen(seed);
  const Tensor w1 = normal({hidden, inputs}, 0.0f, 0.5f, gen), b1 = normal({hidden}, 0.0f, 0.1f, gen);
  const Tensor w2 = normal({classes, pooled}, 0.0f, 0.5f, gen), b2 = normal({classes}, 0.0f, 0.1f, gen);
  // max_pool2d pools (N, C, H, W) maps: the hidden row is seen as a 1×8 map and pooled by
  // 1×2 windows with stride 2.
  auto pool_pairs = [&](const Tensor& h) {
    return reshape(max_pool2d(reshape(h, {1, 1, 1, hidden}), 1, 2, 1, 2, 0, 0), {1, pooled});
  };
  auto network = [&](const Tensor& x) { return linear(pool_pairs(gelu(linear(x, w1, b1))), w2, b2); };

  // One input (a batch of one row). It is a leaf that wants a cotangent, so the forward
  // pass below is recorded.
  Tensor x = normal({1, inputs}, 0.0f, 1.0f, gen);
  x.requires_grad_();
  const Tensor logits = network(x);

  // The class to explain, and the cotangent e_c that picks its logit.
  const std::vector<float> f = logits.to_vector();
  int64_t c = 0;
  for (int64_t k = 1; k < classes; ++k)
    if (f[size_t(k)] > f[size_t(c)]) c = k;
  std::vector<float> one_hot(size_t(classes), 0.0f);
  one_hot[size_t(c)] = 1.0f;
  const Tensor e_c = Tensor::from_vector({1, classes}, one_hot);

  // Three transports of the same recorded graph (grad keeps the graph for the next call).
  const Tensor gradient = grad(logits, {x}, e_c, Transport::gradient())[0];
  const Tensor pullback = grad(logits, {x}, e_c, Transport::pullback())[0];
  const Tensor soft = grad(logits, {x}, e_c, Transport::soft_pullback())[0];

  std::printf("logits:");
  for (float v : f) std::printf(" %.4f", v);
  std::printf("; explaining class %lld\n\n", (long long)c);
  std::printf("input  %12s %12s %12s\n", "gradient", "pullback", "soft pullb.");
  for (int64_t i = 0; i < inputs; ++i)
    std::printf("x[%lld]  %12.6f %12.6f %12.6f\n", (long long)i, gradient.at({0, i}), pullback.at({0, i}), soft.at({0, i}));

  // The checks, by hand, in double precision from the weights.
  const Temperatures tau;  // the soft pullback's defaults, as Transport::soft_pullback() used
  const Tensor z = linear(x.detach(), w1, b1), h = gelu(z);
  // Per hidden unit j: its route R (1 if it wins its pair: the first maximum on a tie) and
  // its soft weight S = softmax(h_pair/τ_pool), both read from the forward values.
  std::vector<double> route(static_cast<size_t>(hidden)), spread(static_cast<size_t>(hidden));
  for (int64_t k = 0; k < pooled; ++k) {
    const double a = h.at({0, 2 * k}), b = h.at({0, 2 * k + 1});
    route[size_t(2 * k)] = a >= b ? 1.0 : 0.0;
    route[size_t(2 * k + 1)] = a >= b ? 0.0 : 1.0;
    const double m = std::max(a, b), ea = std::exp((a - m) / tau.max_pool), eb = std::exp((b - m) / tau.max_pool);
    spread[size_t(2 * k)] = ea / (ea + eb);
    spread[size_t(2 * k + 1)] = eb / (ea + eb);
  }
  double fd_error = 0, gradient_error = 0, pullback_error = 0, soft_error = 0;
  double gradient_vs_pullback = 0, pullback_vs_soft = 0;
  for (int64_t i = 0; i < inputs; ++i) {
    // Central differences of f_c along input i.
    const float step = 1e-3f;
    std::vector<float> plus = x.to_vector(), minus = x.to_vector();
    plus[size_t(i)] += step, minus[size_t(i)] -= step;
    const float up = network(Tensor::from_vector({1, inputs}, plus)).at({0, c});
    const float down = network(Tensor::from_vector({1, inputs}, minus)).at({0, c});
    fd_error = std::max(fd_error, std::abs(double(gradient.at({0, i})) - double(up - down) / (2 * step)));
    // Σ_j W1[j,i] · (GELU's factor) · (the pool's factor) · W2[c, j/2].
    double exact = 0, frozen = 0, softened = 0;
    for (int64_t j = 0; j < hidden; ++j) {
      const double zj = z.at({0, j}), path = double(w1.at({j, i})) * double(w2.at({c, j / 2}));
      exact += path * (normal_cdf(zj) + zj * normal_pdf(zj)) * route[size_t(j)];
      frozen += path * normal_cdf(zj) * route[size_t(j)];
      softened += path * normal_cdf(zj / tau.gelu) * spread[size_t(j)];
    }
    gradient_error = std::max(gradient_error, std::abs(double(gradient.at({0, i})) - exact));
    pullback_error = std::max(pullback_error, std::abs(double(pullback.at({0, i})) - frozen));
    soft_error = std::max(soft_error, std::abs(double(soft.at({0, i})) - softened));
    gradient_vs_pullback = std::max(gradient_vs_pullback, std::abs(double(gradient.at({0, i}) - pullback.at({0, i}))));
    pullback_vs_soft = std::max(pullback_vs_soft, std::abs(double(pullback.at({0, i}) - soft.at({0, i}))));
  }
  std::printf("\ngradient vs finite differences:                         max |difference| %.2e\n", fd_error);
  std::printf("gradient vs W1ᵀ diag(Φ(z) + zφ(z)) Rᵀ W2ᵀ e_c:           max |difference| %.2e\n", gradient_error);
  std::printf("pullback vs W1ᵀ diag(Φ(z)) Rᵀ W2ᵀ e_c:                   max |difference| %.2e\n", pullback_error);
  std::printf("soft pullback vs W1ᵀ diag(Φ(z/τ)) Sᵀ W2ᵀ e_c:            max |difference| %.2e\n", soft_error);
  std::printf("the columns differ: max |gradient − pullback| %.4f, max |pullback − soft pullback| %.4f\n",
              gradient_vs_pullback, pullback_vs_soft);

  // The gradient of a loss with respect to the parameters, as a training step would take
  // it: backward() accumulates into every leaf's .grad (here the weights become leaves).
  Tensor w1_leaf = w1.clone();
  w1_leaf.requires_grad_();
  const Tensor loss = sum(linear(pool_pairs(gelu(linear(x.detach(), w1_leaf, b1))), w2, b2) * e_c);
  backward(loss);
  std::printf("backward(f_c) fills W1's .grad: shape (%lld, %lld)\n", (long long)w1_leaf.grad().size(0),
              (long long)w1_leaf.grad().size(1));
  return 0;
}
