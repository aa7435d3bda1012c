// Pointwise activations and their three transports (docs/methods.md §1.2).
//
// Each activation is z ↦ z·g(z) for a gate g (a step for ReLU, Φ for GELU, σ for SiLU),
// so the three transports differ only in the factor that multiplies the cotangent:
//
//   kind   Gradient                 Pullback (gate frozen)   SoftPullback
//   ReLU   1{z>0}                   1{z>0}                   Φ(z/τ), τ = tau.relu
//   GELU   Φ(z) + z·φ(z)            Φ(z)                     Φ(z/τ), τ = tau.gelu
//   SiLU   σ(z) + z·σ(z)(1−σ(z))    σ(z)                     σ(z/τ), τ = tau.silu
//
// Φ is the standard normal CDF, φ its density, σ the logistic function.
//
// The attribution transports (engine/transport.h) add two columns, with f the activation:
//
//   Guided     relu(u)·f'(z): Guided Backprop's ReLU rule 1{z>0}·relu(u); for GELU and
//              SiLU the same "positive cotangent only" rule on top of the gradient.
//   DeepLift   rescale rule on the batch [x; x0]: row i and row i+N (its baseline) both
//              get m·u with m = (f(z)−f(z0))/(z−z0), or their own gradient f'(·) where
//              |z−z0| < 1e-6 (Captum's rule).
//
// One rule table (a struct per activation: f, f', the frozen gate, the soft gate and its
// temperature) serves the forward pass and all five transports.
#pragma once
#include <algorithm>

#include "engine/tensor.h"
#include "engine/transport.h"

namespace adjoint {

enum class Activation { Relu, Gelu, Silu };

const char* to_string(Activation kind);

// max(z, 0).
Tensor relu(const Tensor& x);
// relu(a + b) for two tensors of one shape (a residual block's output): outside a graph in
// one pass over memory instead of two; recorded, the two ops.
Tensor add_relu(const Tensor& a, const Tensor& b);
// z·Φ(z), the exact (erf) form, not the tanh approximation.
Tensor gelu(const Tensor& x);
// z·σ(z).
Tensor silu(const Tensor& x);
// The activation chosen at run time (model configurations name it).
Tensor activation(const Tensor& x, Activation kind);

// Records y, which an op computed as activation(z, kind) by activation_values (the same
// bits), as the activation's output where z needs a gradient: the node `activation` attaches.
// For an op that applies the activation to its output rows as it finishes them (linear's
// product, ops/matmul.h) and keeps z for the transports.
void record_activation(const Tensor& z, const Tensor& y, Activation kind);

// y[i] = f(z[i]) for i < n, with the arithmetic of `activation` (the same bits); y may be z.
// For an op that applies the activation to values it has just computed, while they are in
// cache, where no graph is recorded (ops/depthwise_conv.h).
void activation_values(const float* z, float* y, int64_t n, Activation kind);

// y[i] = f(z[i]) and d[i] = f'(z[i]) for i < n, with the arithmetic of `activation` and of
// its gradient (the same bits: the gradient's cotangent of z is d[i]·u[i]); d may be z.
// For GELU and SiLU, whose gradient multiplies (throws for ReLU, whose rule selects): an op
// that applies the activation in a training step (GradientOnly) keeps d instead of z.
void activation_values_and_derivatives(const float* z, float* y, float* d, int64_t n, Activation kind);

// The ReLU's value and its gradient (and pullback) rule at one element, for the ops that
// apply a ReLU as they write their output (BatchNorm's tail, ops/norm.h) and must give the
// ReLU op's bits. max keeps NaN. The rule selects rather than multiplies: a closed gate
// passes 0 even for an infinite or NaN cotangent (as PyTorch's threshold_backward does),
// and the select, unlike 0/1 · w, vectorises.
inline float relu_value(float z) { return std::max(z, 0.0f); }
inline float relu_gate(float z, float w) { return z > 0 ? w : 0.0f; }

// The cotangent of an activation's input z for the cotangent u of its output under
// transport t: the table above, as the activation's own node applies it. For an op that
// fuses an activation into its output and keeps z.
Tensor activation_vjp(const Tensor& z, const Tensor& u, Activation kind, const Transport& t);

}  // namespace adjoint
