// Normalisation (ops/norm.h): y = γ·x̂ + β with x̂ = (x − μ)/σ, σ = sqrt(var + eps).
// The transports differ in whether the statistics μ, σ are differentiated (docs/methods.md
// §1.2): the gradient differentiates them (the centring terms below); the pullback and the
// soft pullback hold them fixed, which leaves the affine map x ↦ (γ/σ)·x + const; Guided
// and DeepLift change only the activations, so they take the gradient. BatchNorm in eval
// mode reads fixed running statistics and is that affine map under every transport.
#include <cmath>

#include "ops/reference/reference.h"

namespace adjoint::reference {

// Per channel c: mean and biased variance of x[n][c][l] over n and l.
Statistics batch_norm_statistics(const Values& x, const BatchNormShape& s) {
  Statistics st{Values(s.C, 0.0), Values(s.C, 0.0)};
  const double count = double(s.N * s.L);
  for (int64_t c = 0; c < s.C; ++c) {
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t l = 0; l < s.L; ++l) st.mean[c] += x[(n * s.C + c) * s.L + l] / count;
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t l = 0; l < s.L; ++l) {
        const double d = x[(n * s.C + c) * s.L + l] - st.mean[c];
        st.var[c] += d * d / count;
      }
  }
  return st;
}

// y = γ·(x − μ)/σ + β per channel (γ = 1, β = 0 where empty).
Values batch_norm_forward(const Values& x, const Values& gamma, const Values& beta, const Statistics& stats,
                          const BatchNormShape& s) {
  Values y(x.size());
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t c = 0; c < s.C; ++c)
      for (int64_t l = 0; l < s.L; ++l) {
        const int64_t i = (n * s.C + c) * s.L + l;
        const double xhat = (x[i] - stats.mean[c]) / std::sqrt(stats.var[c] + s.eps);
        y[i] = (gamma.empty() ? 1.0 : gamma[c]) * xhat + (beta.empty() ? 0.0 : beta[c]);
      }
  return y;
}

// Exact: dx = (γ/σ)·(u − mean(u) − x̂·mean(u·x̂)), means over the channel's N·L values.
// Frozen statistics: dx = (γ/σ)·u (docs/methods.md §1.2).
NormGrads batch_norm_backward(const Values& u, const Values& x, const Values& gamma, const Statistics& stats,
                              bool batch_statistics, const BatchNormShape& s, const Transport& t) {
  NormGrads g{Values(x.size()), Values(s.C, 0.0), Values(s.C, 0.0)};
  const bool exact = batch_statistics && t.is_gradient();
  const double count = double(s.N * s.L);
  for (int64_t c = 0; c < s.C; ++c) {
    const double sd = std::sqrt(stats.var[c] + s.eps), k = (gamma.empty() ? 1.0 : gamma[c]) / sd;
    auto xhat = [&](int64_t i) { return (x[i] - stats.mean[c]) / sd; };
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t l = 0; l < s.L; ++l) {
        const int64_t i = (n * s.C + c) * s.L + l;
        g.dbeta[c] += u[i];
        g.dgamma[c] += u[i] * xhat(i);
      }
    const double mean_u = g.dbeta[c] / count, mean_u_xhat = g.dgamma[c] / count;
    for (int64_t n = 0; n < s.N; ++n)
      for (int64_t l = 0; l < s.L; ++l) {
        const int64_t i = (n * s.C + c) * s.L + l;
        g.dx[i] = exact ? k * (u[i] - mean_u - xhat(i) * mean_u_xhat) : k * u[i];
      }
  }
  return g;
}

namespace {
// The ReLU's input: BatchNorm's output plus the residual.
Values batch_norm_tail_pre_activation(const Values& x, const Values& gamma, const Values& beta,
                                      const Statistics& stats, const Values& residual, const BatchNormShape& s) {
  Values z = batch_norm_forward(x, gamma, beta, stats, s);
  for (size_t i = 0; i < residual.size(); ++i) z[i] += residual[i];
  return z;
}
}  // namespace

Values batch_norm_tail_forward(const Values& x, const Values& gamma, const Values& beta, const Statistics& stats,
                               const Values& residual, bool relu, const BatchNormShape& s) {
  const Values z = batch_norm_tail_pre_activation(x, gamma, beta, stats, residual, s);
  return relu ? activation_forward(z, Activation::Relu) : z;
}

BatchNormTailGrads batch_norm_tail_backward(const Values& u, const Values& x, const Values& gamma, const Values& beta,
                                            const Statistics& stats, const Values& residual, bool relu,
                                            bool batch_statistics, const BatchNormShape& s, const Transport& t) {
  const Values z = batch_norm_tail_pre_activation(x, gamma, beta, stats, residual, s);
  const Values dz = relu ? activation_backward(u, z, Activation::Relu, t) : u;
  return {batch_norm_backward(dz, x, gamma, stats, batch_statistics, s, t), residual.empty() ? Values{} : dz};
}

namespace {

// Mean and 1/σ of row r of x (M, D).
struct RowStatistics {
  double mean, invstd;
};
RowStatistics row_statistics(const Values& x, int64_t r, int64_t D, double eps) {
  double mean = 0, var = 0;
  for (int64_t j = 0; j < D; ++j) mean += x[r * D + j] / double(D);
  for (int64_t j = 0; j < D; ++j) var += (x[r * D + j] - mean) * (x[r * D + j] - mean) / double(D);
  return {mean, 1.0 / std::sqrt(var + eps)};
}

}  // namespace

// Each row normalised over its D features, then γ·x̂ + β per feature.
Values layer_norm_forward(const Values& x, const Values& gamma, const Values& beta, int64_t M, int64_t D,
                          double eps) {
  Values y(x.size());
  for (int64_t r = 0; r < M; ++r) {
    const RowStatistics st = row_statistics(x, r, D, eps);
    for (int64_t j = 0; j < D; ++j)
      y[r * D + j] = (gamma.empty() ? 1.0 : gamma[j]) * (x[r * D + j] - st.mean) * st.invstd +
                     (beta.empty() ? 0.0 : beta[j]);
  }
  return y;
}

// With gu = γ·u: exact dx = (1/σ)·(gu − mean(gu) − x̂·mean(gu·x̂)), means over the row;
// frozen statistics: dx = gu/σ. dγ = Σ_rows u·x̂, dβ = Σ_rows u (docs/methods.md §1.2).
NormGrads layer_norm_backward(const Values& u, const Values& x, const Values& gamma, int64_t M, int64_t D,
                              const Transport& t, double eps) {
  NormGrads g{Values(x.size()), Values(D, 0.0), Values(D, 0.0)};
  for (int64_t r = 0; r < M; ++r) {
    const RowStatistics st = row_statistics(x, r, D, eps);
    auto xhat = [&](int64_t j) { return (x[r * D + j] - st.mean) * st.invstd; };
    auto gu = [&](int64_t j) { return (gamma.empty() ? 1.0 : gamma[j]) * u[r * D + j]; };
    double mean_gu = 0, mean_gu_xhat = 0;
    for (int64_t j = 0; j < D; ++j) {
      mean_gu += gu(j) / double(D);
      mean_gu_xhat += gu(j) * xhat(j) / double(D);
      g.dgamma[j] += u[r * D + j] * xhat(j);
      g.dbeta[j] += u[r * D + j];
    }
    for (int64_t j = 0; j < D; ++j)
      g.dx[r * D + j] = t.is_gradient() ? st.invstd * (gu(j) - mean_gu - xhat(j) * mean_gu_xhat) : st.invstd * gu(j);
  }
  return g;
}

}  // namespace adjoint::reference
