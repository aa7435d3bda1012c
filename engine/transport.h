// Transports: the three ways a cotangent can be carried backwards (docs/methods.md §1.2).
//
//   Gradient      the exact vector-Jacobian product Jᵀu; training always uses it.
//   Pullback      the adjoint of the input-conditioned linear map W(x)ᵀu: gates, routing,
//                 normalisation statistics and attention patterns are held fixed.
//   SoftPullback  the pullback with every hard gate softened at a per-layer-kind
//                 temperature; the forward pass is never changed.
//
// Ops whose map is affine in the input (linear, conv, BN in eval, pooling by averaging,
// add, reshape, concat...) implement one rule for all three.
//
// Two more kinds serve the attribution baselines (analysis/pullbacks/explain.h). They change only
// the pointwise activations (ops/activation.h); every other op sees is_gradient() true
// and applies its exact VJP, as Captum's and the papers' implementations do:
//   Guided        Guided Backprop: ReLU passes relu(u)·1{z>0}; GELU/SiLU pass relu(u)·f'(z).
//   DeepLift      DeepLift's rescale rule. The forward must run on the batch [x; x0]
//                 (inputs, then as many baselines, along axis 0); each activation pairs
//                 row i with row i+N and multiplies the cotangent of both rows by
//                 (f(z)−f(z0))/(z−z0). Max-pool, attention and LayerNorm keep their
//                 gradient rules.
#pragma once

namespace adjoint {

enum class TransportKind { Gradient, Pullback, SoftPullback, Guided, DeepLift };

// Soft-pullback temperatures per layer kind, with the published defaults.
struct Temperatures {
  float relu = 0.6f;       // Φ(z/τ)·u
  float gelu = 1.0f;       // Φ(z/τ)·u
  float silu = 1.6f;       // σ(z/τ)·u
  float max_pool = 0.3f;   // softmax(window/τ) spread
  float attention = 1.0f;  // softmax(QKᵀ·s/τ), through V only
};

struct Transport {
  TransportKind kind = TransportKind::Gradient;
  Temperatures tau;

  static Transport gradient() { return {TransportKind::Gradient, {}}; }
  static Transport pullback() { return {TransportKind::Pullback, {}}; }
  static Transport soft_pullback(Temperatures t = {}) { return {TransportKind::SoftPullback, t}; }
  static Transport guided() { return {TransportKind::Guided, {}}; }
  static Transport deeplift() { return {TransportKind::DeepLift, {}}; }

  // True when an op outside the activations must apply its exact VJP: under Gradient,
  // and under Guided and DeepLift, which differ from it only at the activations.
  bool is_gradient() const {
    return kind == TransportKind::Gradient || kind == TransportKind::Guided || kind == TransportKind::DeepLift;
  }
  bool is_soft() const { return kind == TransportKind::SoftPullback; }
};

const char* to_string(TransportKind kind);

}  // namespace adjoint
