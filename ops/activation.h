// Pointwise activations and their three transports (METHODS.md §1.2).
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
#pragma once
#include "engine/tensor.h"

namespace adjoint {

enum class Activation { Relu, Gelu, Silu };

const char* to_string(Activation kind);

// max(z, 0).
Tensor relu(const Tensor& x);
// z·Φ(z), the exact (erf) form, not the tanh approximation.
Tensor gelu(const Tensor& x);
// z·σ(z).
Tensor silu(const Tensor& x);
// The activation chosen at run time (model configurations name it).
Tensor activation(const Tensor& x, Activation kind);

}  // namespace adjoint
