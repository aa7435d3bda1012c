// Elementwise maps (ops/elementwise.h). Each is smooth (abs piecewise linear, its gate
// sign(x) held as is), so every transport carries u ↦ f'(x)·u (docs/methods.md §1.2).
#include <cmath>

#include "ops/reference/reference.h"

namespace adjoint::reference {

namespace {

double value(Unary f, double x) {
  switch (f) {
    case Unary::Exp: return std::exp(x);
    case Unary::Log: return std::log(x);
    case Unary::Tanh: return std::tanh(x);
    case Unary::Sigmoid: return 1.0 / (1.0 + std::exp(-x));
    case Unary::Abs: return std::fabs(x);
    case Unary::Sqrt: return std::sqrt(x);
  }
  return NAN;
}

double derivative(Unary f, double x) {
  switch (f) {
    case Unary::Exp: return std::exp(x);
    case Unary::Log: return 1.0 / x;
    case Unary::Tanh: return 1.0 - std::tanh(x) * std::tanh(x);
    case Unary::Sigmoid: return value(f, x) * (1.0 - value(f, x));
    case Unary::Abs: return x > 0 ? 1.0 : x < 0 ? -1.0 : 0.0;  // abs'(0) = 0, as PyTorch
    case Unary::Sqrt: return 0.5 / std::sqrt(x);
  }
  return NAN;
}

}  // namespace

// y_i = f(x_i).
Values unary_forward(const Values& x, Unary f) {
  Values y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = value(f, x[i]);
  return y;
}

// dx_i = f'(x_i)·u_i (docs/methods.md §1.2: smooth, one rule for every transport).
Values unary_backward(const Values& u, const Values& x, Unary f) {
  Values dx(x.size());
  for (size_t i = 0; i < x.size(); ++i) dx[i] = derivative(f, x[i]) * u[i];
  return dx;
}

// (a·b)' : da = u·b, db = u·a (docs/methods.md §1.2: bilinear, the exact VJP for every transport).
ProductGrads mul_backward(const Values& u, const Values& a, const Values& b) {
  ProductGrads g{Values(a.size()), Values(b.size())};
  for (size_t i = 0; i < a.size(); ++i) g.da[i] = u[i] * b[i], g.db[i] = u[i] * a[i];
  return g;
}

}  // namespace adjoint::reference
