// A two-layer network built with the C++ API, and the three ways the engine carries a
// cotangent back to its input: the gradient, the pullback and the soft pullback
// (docs/transports.md derives each; docs/methods.md §1.2 is the table).
//
//   f(x) = W2 · relu(W1 · x + b1) + b2          x: 6 inputs, 8 hidden units, 3 logits
//
// For one input x and the class c with the largest logit, it prints ∂f_c/∂x three ways,
// side by side, then checks each against what it should be:
//   gradient       against central finite differences of f_c;
//   pullback       the ReLU gates held fixed at x: for a ReLU network this *is* the
//                  gradient, W1ᵀ diag(z > 0) W2ᵀ e_c, z = W1 x + b1;
//   soft pullback  the gates softened to Φ(z/τ), τ = 0.6: W1ᵀ diag(Φ(z/τ)) W2ᵀ e_c,
//                  computed here by hand from the weights.
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
#include "ops/matmul.h"
#include "ops/reduce.h"

using namespace adjoint;

int main(int argc, char** argv) {
  const uint64_t seed = argc > 1 ? std::stoull(argv[1]) : 7;
  const int64_t inputs = 6, hidden = 8, classes = 3;

  // The weights, drawn once. linear(x, W, b) computes x·Wᵀ + b, as torch's F.linear.
  Generator gen(seed);
  const Tensor w1 = normal({hidden, inputs}, 0.0f, 0.5f, gen), b1 = normal({hidden}, 0.0f, 0.1f, gen);
  const Tensor w2 = normal({classes, hidden}, 0.0f, 0.5f, gen), b2 = normal({classes}, 0.0f, 0.1f, gen);
  auto network = [&](const Tensor& x) { return linear(relu(linear(x, w1, b1)), w2, b2); };

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

  // The checks, by hand. z = W1 x + b1 are the ReLU's inputs.
  const Tensor z = linear(x.detach(), w1, b1);
  double fd_error = 0, pullback_error = 0, soft_error = 0;
  for (int64_t i = 0; i < inputs; ++i) {
    // Central differences of f_c along input i.
    const float h = 1e-3f;
    std::vector<float> plus = x.to_vector(), minus = x.to_vector();
    plus[size_t(i)] += h, minus[size_t(i)] -= h;
    const float up = network(Tensor::from_vector({1, inputs}, plus)).at({0, c});
    const float down = network(Tensor::from_vector({1, inputs}, minus)).at({0, c});
    fd_error = std::max(fd_error, std::abs(double(gradient.at({0, i})) - double(up - down) / (2 * h)));
    // Σ_j W1[j,i] · gate_j · W2[c,j], with the hard gate (z > 0) and the soft one Φ(z/τ).
    double hard = 0, softened = 0;
    for (int64_t j = 0; j < hidden; ++j) {
      const double zj = z.at({0, j}), path = double(w1.at({j, i})) * double(w2.at({c, j}));
      hard += path * (zj > 0 ? 1.0 : 0.0);
      softened += path * 0.5 * std::erfc(-zj / 0.6 / std::sqrt(2.0));  // Φ(z/τ), τ = 0.6
    }
    pullback_error = std::max(pullback_error, std::abs(double(pullback.at({0, i})) - hard));
    soft_error = std::max(soft_error, std::abs(double(soft.at({0, i})) - softened));
  }
  std::printf("\ngradient vs finite differences:           max |difference| %.2e\n", fd_error);
  std::printf("pullback vs W1ᵀ diag(z > 0) W2ᵀ e_c:       max |difference| %.2e\n", pullback_error);
  std::printf("soft pullback vs W1ᵀ diag(Φ(z/τ)) W2ᵀ e_c: max |difference| %.2e\n", soft_error);

  // The gradient of a loss with respect to the parameters, as a training step would take
  // it: backward() accumulates into every leaf's .grad (here the weights become leaves).
  Tensor w1_leaf = w1.clone();
  w1_leaf.requires_grad_();
  const Tensor loss = sum(linear(relu(linear(x.detach(), w1_leaf, b1)), w2, b2) * e_c);
  backward(loss);
  std::printf("backward(f_c) fills W1's .grad: shape (%lld, %lld)\n", (long long)w1_leaf.grad().size(0),
              (long long)w1_leaf.grad().size(1));
  return 0;
}
