// softmax and log_softmax along the last axis (ops/softmax.h). Smooth maps: the exact
// vector-Jacobian product under every transport (docs/methods.md §1.2; attention's frozen
// pattern is attention's rule, not softmax's).
#include <cmath>

#include "ops/reference/reference.h"

namespace adjoint::reference {

// y_j = exp(x_j − max) / Σ_k exp(x_k − max), per row.
Values softmax_forward(const Values& x, int64_t rows, int64_t n) {
  Values y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double top = x[r * n], total = 0;
    for (int64_t j = 0; j < n; ++j) top = std::max(top, x[r * n + j]);
    for (int64_t j = 0; j < n; ++j) total += std::exp(x[r * n + j] - top);
    for (int64_t j = 0; j < n; ++j) y[r * n + j] = std::exp(x[r * n + j] - top) / total;
  }
  return y;
}

// dx_j = y_j·(u_j − Σ_k u_k y_k) (docs/methods.md §1.2: smooth, the exact VJP).
Values softmax_backward(const Values& u, const Values& y, int64_t rows, int64_t n) {
  Values dx(y.size());
  for (int64_t r = 0; r < rows; ++r) {
    double dot = 0;
    for (int64_t j = 0; j < n; ++j) dot += u[r * n + j] * y[r * n + j];
    for (int64_t j = 0; j < n; ++j) dx[r * n + j] = y[r * n + j] * (u[r * n + j] - dot);
  }
  return dx;
}

// y_j = x_j − max − log Σ_k exp(x_k − max), per row.
Values log_softmax_forward(const Values& x, int64_t rows, int64_t n) {
  Values y(x.size());
  for (int64_t r = 0; r < rows; ++r) {
    double top = x[r * n], total = 0;
    for (int64_t j = 0; j < n; ++j) top = std::max(top, x[r * n + j]);
    for (int64_t j = 0; j < n; ++j) total += std::exp(x[r * n + j] - top);
    for (int64_t j = 0; j < n; ++j) y[r * n + j] = x[r * n + j] - top - std::log(total);
  }
  return y;
}

// dx_j = u_j − exp(y_j)·Σ_k u_k (docs/methods.md §1.2: smooth, the exact VJP).
Values log_softmax_backward(const Values& u, const Values& y, int64_t rows, int64_t n) {
  Values dx(y.size());
  for (int64_t r = 0; r < rows; ++r) {
    double total = 0;
    for (int64_t j = 0; j < n; ++j) total += u[r * n + j];
    for (int64_t j = 0; j < n; ++j) dx[r * n + j] = u[r * n + j] - std::exp(y[r * n + j]) * total;
  }
  return dx;
}

}  // namespace adjoint::reference
