// Matrix products (ops/matmul.h). Both are linear in each input, so the transpose of the
// map is the vector-Jacobian product under every transport (docs/methods.md §1.2): there
// is no gate or statistic to freeze, and the transport argument is not needed.
#include "ops/reference/reference.h"

namespace adjoint::reference {

// c[i][j] = Σ_k a[i][k]·b[k][j].
Values matmul_forward(const Values& a, const Values& b, int64_t M, int64_t K, int64_t N) {
  Values c(M * N, 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) c[i * N + j] += a[i * K + k] * b[k * N + j];
  return c;
}

// da = u bᵀ, db = aᵀ u (docs/methods.md §1.2: linear, one rule for every transport).
MatmulGrads matmul_backward(const Values& u, const Values& a, const Values& b, int64_t M, int64_t K, int64_t N) {
  MatmulGrads g{Values(M * K, 0.0), Values(K * N, 0.0)};
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) {
        g.da[i * K + k] += u[i * N + j] * b[k * N + j];
        g.db[k * N + j] += a[i * K + k] * u[i * N + j];
      }
  return g;
}

// y[m][o] = bias[o] + Σ_i x[m][i]·w[o][i].
Values linear_forward(const Values& x, const Values& w, const Values& bias, int64_t M, int64_t in, int64_t out) {
  Values y(M * out, 0.0);
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < out; ++o) {
      double sum = bias.empty() ? 0.0 : bias[o];
      for (int64_t i = 0; i < in; ++i) sum += x[m * in + i] * w[o * in + i];
      y[m * out + o] = sum;
    }
  return y;
}

// dx = u w, dw = uᵀ x, dbias = Σ_m u (docs/methods.md §1.2: affine, one rule for every transport).
LinearGrads linear_backward(const Values& u, const Values& x, const Values& w, int64_t M, int64_t in, int64_t out) {
  LinearGrads g{Values(M * in, 0.0), Values(out * in, 0.0), Values(out, 0.0)};
  for (int64_t m = 0; m < M; ++m)
    for (int64_t o = 0; o < out; ++o) {
      const double du = u[m * out + o];
      g.dbias[o] += du;
      for (int64_t i = 0; i < in; ++i) {
        g.dx[m * in + i] += du * w[o * in + i];
        g.dw[o * in + i] += du * x[m * in + i];
      }
    }
  return g;
}

}  // namespace adjoint::reference
