// Reductions (ops/reduce.h) over the last axis of `rows` rows of n values. Sum, mean and
// variance are smooth: one rule for every transport. The maximum routes the cotangent
// through a hard choice, like max-pooling: to the first maximal element under the
// gradient and the pullback, spread with fixed weights softmax(row/τ) under the soft
// pullback, τ = tau.max_pool (docs/methods.md §1.2).
#include <cmath>

#include "ops/reference/reference.h"

namespace adjoint::reference {

// Σ_j x[r][j] / n.
Values mean_forward(const Values& x, int64_t rows, int64_t n) {
  Values y(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) y[r] += x[r * n + j] / double(n);
  return y;
}

// u/n to every element (docs/methods.md §1.2: linear, one rule for every transport).
Values mean_backward(const Values& u, int64_t rows, int64_t n) {
  Values dx(rows * n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) dx[r * n + j] = u[r] / double(n);
  return dx;
}

// Σ_j (x[r][j] − mean)² / (n − 1), the unbiased variance.
Values var_forward(const Values& x, int64_t rows, int64_t n) {
  const Values mean = mean_forward(x, rows, n);
  Values y(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) y[r] += (x[r * n + j] - mean[r]) * (x[r * n + j] - mean[r]) / double(n - 1);
  return y;
}

// u·2(x − mean)/(n − 1) (docs/methods.md §1.2: smooth, the exact VJP).
Values var_backward(const Values& u, const Values& x, int64_t rows, int64_t n) {
  const Values mean = mean_forward(x, rows, n);
  Values dx(rows * n);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) dx[r * n + j] = u[r] * 2 * (x[r * n + j] - mean[r]) / double(n - 1);
  return dx;
}

namespace {

// The first maximal element of row r.
int64_t argmax(const Values& x, int64_t r, int64_t n) {
  int64_t best = 0;
  for (int64_t j = 1; j < n; ++j)
    if (x[r * n + j] > x[r * n + best]) best = j;
  return best;
}

}  // namespace

// max_j x[r][j].
Values max_forward(const Values& x, int64_t rows, int64_t n) {
  Values y(rows);
  for (int64_t r = 0; r < rows; ++r) y[r] = x[r * n + argmax(x, r, n)];
  return y;
}

// u to the arg-max, or (soft pullback) u·softmax(row/τ) (docs/methods.md §1.2).
Values max_backward(const Values& u, const Values& x, int64_t rows, int64_t n, const Transport& t) {
  Values dx(rows * n, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t top = argmax(x, r, n);
    if (!t.is_soft()) {
      dx[r * n + top] = u[r];
      continue;
    }
    auto weight = [&](int64_t j) { return std::exp((x[r * n + j] - x[r * n + top]) / t.tau.max_pool); };
    double total = 0;
    for (int64_t j = 0; j < n; ++j) total += weight(j);
    for (int64_t j = 0; j < n; ++j) dx[r * n + j] = u[r] * weight(j) / total;
  }
  return dx;
}

}  // namespace adjoint::reference
