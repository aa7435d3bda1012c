// Scaled dot-product attention (ops/attention.h), per head:
//   A = softmax(q kᵀ·scale [+ causal mask]) row by row,   out = A v.
// The pattern A is the op's gate: the gradient differentiates it (reaching q and k); the
// pullback holds it fixed, so the cotangent flows through v alone, dv = Aᵀu; the soft
// pullback holds fixed the pattern recomputed at a temperature, A_τ = softmax(q kᵀ·scale/τ)
// (docs/methods.md §1.2). Guided and DeepLift keep the gradient here.
#include <cmath>

#include "ops/reference/reference.h"

namespace adjoint::reference {

// A[h][i][j] = exp(z_ij) / Σ_j' exp(z_ij'), z_ij = q_i·k_j·scale/τ, keys j > i masked
// out (A = 0) when causal.
Values attention_pattern(const Values& q, const Values& k, const AttentionShape& s, double tau) {
  Values a(s.heads * s.T * s.S, 0.0);
  for (int64_t h = 0; h < s.heads; ++h)
    for (int64_t i = 0; i < s.T; ++i) {
      Values z(s.S, -INFINITY);
      double top = -INFINITY, total = 0;
      for (int64_t j = 0; j < s.S; ++j) {
        if (s.causal && j > i) continue;
        double dot = 0;
        for (int64_t c = 0; c < s.d; ++c) dot += q[(h * s.T + i) * s.d + c] * k[(h * s.S + j) * s.d + c];
        z[j] = dot * s.scale / tau;
        top = std::max(top, z[j]);
      }
      for (int64_t j = 0; j < s.S; ++j) total += std::exp(z[j] - top);  // masked: exp(−∞) = 0
      for (int64_t j = 0; j < s.S; ++j) a[(h * s.T + i) * s.S + j] = std::exp(z[j] - top) / total;
    }
  return a;
}

// out[h][i] = Σ_j A[h][i][j]·v[h][j].
Values attention_forward(const Values& q, const Values& k, const Values& v, const AttentionShape& s) {
  const Values a = attention_pattern(q, k, s);
  Values out(s.heads * s.T * s.dv, 0.0);
  for (int64_t h = 0; h < s.heads; ++h)
    for (int64_t i = 0; i < s.T; ++i)
      for (int64_t j = 0; j < s.S; ++j)
        for (int64_t c = 0; c < s.dv; ++c)
          out[(h * s.T + i) * s.dv + c] += a[(h * s.T + i) * s.S + j] * v[(h * s.S + j) * s.dv + c];
  return out;
}

// dv[h][j] = Σ_i a[h][i][j]·u[h][i].
Values pattern_transposed_times(const Values& a, const Values& u, const AttentionShape& s) {
  Values dv(s.heads * s.S * s.dv, 0.0);
  for (int64_t h = 0; h < s.heads; ++h)
    for (int64_t i = 0; i < s.T; ++i)
      for (int64_t j = 0; j < s.S; ++j)
        for (int64_t c = 0; c < s.dv; ++c)
          dv[(h * s.S + j) * s.dv + c] += a[(h * s.T + i) * s.S + j] * u[(h * s.T + i) * s.dv + c];
  return dv;
}

// Gradient: dv = Aᵀu; dA = u vᵀ; through the softmax dZ = A ⊙ (dA − Σ_j dA·A) per row;
// dq = scale·dZ k, dk = scale·dZᵀ q. Pullbacks: dv = Aᵀu (A or A_τ), dq = dk = 0
// (docs/methods.md §1.2).
AttentionGrads attention_backward(const Values& u, const Values& q, const Values& k, const Values& v,
                                  const AttentionShape& s, const Transport& t) {
  AttentionGrads g{Values(q.size(), 0.0), Values(k.size(), 0.0), Values()};
  const double tau = t.is_soft() ? t.tau.attention : 1.0;
  g.dv = pattern_transposed_times(attention_pattern(q, k, s, tau), u, s);
  if (!t.is_gradient()) return g;
  const Values a = attention_pattern(q, k, s);
  for (int64_t h = 0; h < s.heads; ++h)
    for (int64_t i = 0; i < s.T; ++i) {
      Values da(s.S, 0.0);  // dA[i][j] = u_i·v_j
      double dot = 0;       // Σ_j dA[i][j]·A[i][j]
      for (int64_t j = 0; j < s.S; ++j) {
        for (int64_t c = 0; c < s.dv; ++c) da[j] += u[(h * s.T + i) * s.dv + c] * v[(h * s.S + j) * s.dv + c];
        dot += da[j] * a[(h * s.T + i) * s.S + j];
      }
      for (int64_t j = 0; j < s.S; ++j) {
        const double dz = a[(h * s.T + i) * s.S + j] * (da[j] - dot);
        for (int64_t c = 0; c < s.d; ++c) {
          g.dq[(h * s.T + i) * s.d + c] += s.scale * dz * k[(h * s.S + j) * s.d + c];
          g.dk[(h * s.S + j) * s.d + c] += s.scale * dz * q[(h * s.T + i) * s.d + c];
        }
      }
    }
  return g;
}

}  // namespace adjoint::reference
