#include "analysis/similarity/canonical_pairing.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"

namespace adjoint {

namespace {

// Adds `v` to the orthonormal set q (vectors of equal length) unless it lies in their span.
// Twice Gram–Schmidt, so that the set stays orthogonal to rounding.
bool extend_orthonormal(std::vector<std::vector<double>>& q, std::vector<double> v, double relative_tolerance) {
  double norm0 = 0;
  for (double x : v) norm0 += x * x;
  for (int pass = 0; pass < 2; ++pass)
    for (const auto& u : q) {
      double dot = 0;
      for (size_t i = 0; i < v.size(); ++i) dot += u[i] * v[i];
      for (size_t i = 0; i < v.size(); ++i) v[i] -= dot * u[i];
    }
  double norm = 0;
  for (double x : v) norm += x * x;
  if (norm == 0.0 || norm <= relative_tolerance * norm0) return false;
  for (double& x : v) x /= std::sqrt(norm);
  q.push_back(std::move(v));
  return true;
}

Matrix64 as_columns(const std::vector<std::vector<double>>& q, int64_t length, int64_t width) {
  Matrix64 m(length, width);
  for (size_t j = 0; j < q.size(); ++j)
    for (int64_t i = 0; i < length; ++i) m(i, int64_t(j)) = q[j][size_t(i)];
  return m;
}

}  // namespace

Matrix64 orthonormal_row_basis(const std::vector<Matrix64>& maps) {
  std::vector<std::vector<double>> q;
  const int64_t n = maps.empty() ? 0 : maps.front().cols;
  for (const Matrix64& w : maps) {
    check(w.cols == n, "orthonormal_row_basis: maps of ", n, " and ", w.cols, " input features");
    for (int64_t r = 0; r < w.rows; ++r)
      extend_orthonormal(q, std::vector<double>(w.data.begin() + r * n, w.data.begin() + (r + 1) * n), 1e-20);
  }
  return as_columns(q, n, int64_t(q.size()));
}

CanonicalPairing canonical_pairing(const Matrix64& wa, const Matrix64& wb) {
  check(wa.cols == wb.cols, "canonical pairing: embeddings of ", wa.cols, " and ", wb.cols, " input features");
  const int64_t n = wa.cols;
  const Matrix64 qa = orthonormal_row_basis({wa}), qb = orthonormal_row_basis({wb});
  // At least one variable, so that even two zero embeddings give polynomials to write out.
  const int64_t ra = qa.cols, rb = qb.cols, r = std::max({ra, rb, int64_t(1)}), paired = std::min(ra, rb);
  // Q_aᵀQ_b = U·diag(ρ)·Vᵀ: V and ρ² from the eigen-decomposition of (Q_aᵀQ_b)ᵀ(Q_aᵀQ_b); then
  // ρ_i = |Q_aᵀQ_b·v_i| (accurate to rounding even where ρ is tiny, unlike √ρ²) and u_i its direction.
  const Matrix64 m = matmul(qa, qb, true, false);  // (ra, rb)
  const SymmetricEigen e = symmetric_eigen(matmul(m, m, true, false));
  const Matrix64 mv = matmul(m, e.vectors);  // (ra, rb): column i is ρ_i·u_i
  CanonicalPairing p;
  p.correlation.assign(size_t(r), 0.0);
  std::vector<std::vector<double>> u;
  for (int64_t i = 0; i < paired; ++i) {
    std::vector<double> column(static_cast<size_t>(ra));
    double norm = 0;
    for (int64_t k = 0; k < ra; ++k) column[size_t(k)] = mv(k, i), norm += mv(k, i) * mv(k, i);
    norm = std::sqrt(norm);
    // Where ρ is at rounding level its direction is noise: u_i is then any unit vector
    // orthogonal to the others (completed below) and ρ_i = 0, an error of rounding's size.
    if (norm > 1e-13 && extend_orthonormal(u, column, 1e-6)) p.correlation[size_t(i)] = std::min(norm, 1.0);
    else break;
  }
  for (int64_t k = 0; int64_t(u.size()) < ra && k < ra; ++k) {
    std::vector<double> unit(static_cast<size_t>(ra), 0.0);
    unit[size_t(k)] = 1.0;
    extend_orthonormal(u, unit, 1e-6);
  }
  check(int64_t(u.size()) == ra, "canonical pairing: could not complete a basis of ", ra, " directions");
  p.read_a = Matrix64(n, r), p.read_b = Matrix64(n, r);
  const Matrix64 pa = matmul(qa, as_columns(u, ra, ra)), pb = matmul(qb, e.vectors);
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < ra; ++j) p.read_a(i, j) = pa(i, j);
    for (int64_t j = 0; j < rb; ++j) p.read_b(i, j) = pb(i, j);
  }
  return p;
}

}  // namespace adjoint
