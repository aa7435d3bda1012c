// Elementwise arithmetic and smooth unary functions.
//
// Binary ops require equal shapes: broadcasting is never implicit, so a shape bug
// cannot silently turn into a broadcast. Broadcast explicitly with broadcast_to
// (ops/layout.h); its adjoint sum_to folds the cotangent back.
//
// Every op here is smooth (or piecewise linear with the kink's gate held as is), so
// Gradient, Pullback and SoftPullback share one rule: u ↦ f'(x)·u (docs/methods.md §1.2).
// abs and clamp transport through their gates sign(x) and 1{lo < x < hi}; at the kinks
// themselves they follow PyTorch (abs'(0) = 0, clamp passes u at x == lo or x == hi).
#pragma once
#include "engine/tensor.h"

namespace adjoint {

// a ∘ b for tensors of the same shape.
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);

Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor pow(const Tensor& x, float exponent);
Tensor clamp(const Tensor& x, float lo, float hi);
Tensor add_scalar(const Tensor& x, float c);
Tensor mul_scalar(const Tensor& x, float c);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator+(const Tensor& a, float c);
Tensor operator-(const Tensor& a, float c);
Tensor operator*(const Tensor& a, float c);
Tensor operator/(const Tensor& a, float c);
Tensor operator+(float c, const Tensor& a);
Tensor operator-(float c, const Tensor& a);
Tensor operator*(float c, const Tensor& a);
Tensor operator/(float c, const Tensor& a);
Tensor operator-(const Tensor& x);

}  // namespace adjoint
