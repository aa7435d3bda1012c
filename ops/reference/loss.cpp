// Losses (ops/loss.h): scalar means over a batch, where a backward pass starts. Smooth in
// their inputs: the exact VJP under every transport (docs/methods.md §1.2).
#include "ops/reference/reference.h"

namespace adjoint::reference {

// mean_i [ −(1 − ε)·log p_i[label_i] − (ε/C)·Σ_c log p_i[c] ], p_i = softmax(logits_i).
double cross_entropy_forward(const Values& logits, const std::vector<int64_t>& labels, int64_t N, int64_t C,
                             double smoothing) {
  const Values log_p = log_softmax_forward(logits, N, C);
  double loss = 0;
  for (int64_t i = 0; i < N; ++i) {
    loss -= (1 - smoothing) * log_p[i * C + labels[i]];
    for (int64_t c = 0; c < C; ++c) loss -= smoothing / double(C) * log_p[i * C + c];
  }
  return loss / double(N);
}

// u·(p_i − target_i)/N, target = (1 − ε)·onehot(label) + ε/C (docs/methods.md §1.2: the exact VJP).
Values cross_entropy_backward(double u, const Values& logits, const std::vector<int64_t>& labels, int64_t N,
                              int64_t C, double smoothing) {
  Values d = softmax_forward(logits, N, C);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c) {
      const double target = (c == labels[i] ? 1 - smoothing : 0.0) + smoothing / double(C);
      d[i * C + c] = u * (d[i * C + c] - target) / double(N);
    }
  return d;
}

// mean((a − b)²).
double mse_forward(const Values& a, const Values& b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += (a[i] - b[i]) * (a[i] - b[i]);
  return sum / double(a.size());
}

// da = u·2(a − b)/n, db = −da (docs/methods.md §1.2: the exact VJP).
ProductGrads mse_backward(double u, const Values& a, const Values& b) {
  ProductGrads g{Values(a.size()), Values(b.size())};
  for (size_t i = 0; i < a.size(); ++i) {
    g.da[i] = u * 2 * (a[i] - b[i]) / double(a.size());
    g.db[i] = -g.da[i];
  }
  return g;
}

}  // namespace adjoint::reference
