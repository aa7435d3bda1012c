// The bilinear layer (ops/bilinear.h): y = (L x̃) ⊙ (R x̃), x̃ = (1, x), the bias in column 0
// of L and R. Each output is a quadratic form in x̃, so y = ½·J(x̃)·x̃ with J the Jacobian:
// the gradient carries Jᵀu, the pullbacks the adjoint of the dynamic-linear map x̃ ↦ ½J(x̃)x̃,
// which is ½Jᵀu (no gate to soften: the soft pullback is the pullback). Guided and DeepLift
// keep the gradient. L's and R's cotangents are the same under every transport
// (docs/methods.md §1.2 and §3.1).
#include "ops/reference/reference.h"

namespace adjoint::reference {

namespace {

// (P x̃)[m][o] = P[o][0] + Σ_i P[o][1 + i]·x[m][i] for a projection P (h, d+1).
Values project(const Values& x, const Values& P, int64_t M, int64_t d, int64_t h) {
  Values out(M * h);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < h; ++o) {
      double sum = P[o * (d + 1)];
      for (int64_t i = 0; i < d; ++i) sum += P[o * (d + 1) + 1 + i] * x[m * d + i];
      out[m * h + o] = sum;
    }
  return out;
}

}  // namespace

// y = (L x̃) ⊙ (R x̃).
Values bilinear_forward(const Values& x, const Values& L, const Values& R, int64_t M, int64_t d, int64_t h) {
  const Values lx = project(x, L, M, d, h), rx = project(x, R, M, d, h);
  Values y(M * h);
  for (int64_t i = 0; i < M * h; ++i) y[i] = lx[i] * rx[i];
  return y;
}

// Gradient: dx = Lᵀ(u ⊙ Rx̃) + Rᵀ(u ⊙ Lx̃) on the x coordinates; pullbacks: half of it.
// dL = (u ⊙ Rx̃) x̃ᵀ, dR = (u ⊙ Lx̃) x̃ᵀ (docs/methods.md §1.2).
BilinearGrads bilinear_backward(const Values& u, const Values& x, const Values& L, const Values& R, int64_t M,
                                int64_t d, int64_t h, const Transport& t) {
  const Values lx = project(x, L, M, d, h), rx = project(x, R, M, d, h);
  const double half_or_one = t.is_gradient() ? 1.0 : 0.5;
  BilinearGrads g{Values(M * d, 0.0), Values(h * (d + 1), 0.0), Values(h * (d + 1), 0.0)};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < h; ++o) {
      const double u_rx = u[m * h + o] * rx[m * h + o], u_lx = u[m * h + o] * lx[m * h + o];
      g.dL[o * (d + 1)] += u_rx;  // x̃_0 = 1
      g.dR[o * (d + 1)] += u_lx;
      for (int64_t i = 0; i < d; ++i) {
        g.dx[m * d + i] += half_or_one * (u_rx * L[o * (d + 1) + 1 + i] + u_lx * R[o * (d + 1) + 1 + i]);
        g.dL[o * (d + 1) + 1 + i] += u_rx * x[m * d + i];
        g.dR[o * (d + 1) + 1 + i] += u_lx * x[m * d + i];
      }
    }
  return g;
}

}  // namespace adjoint::reference
