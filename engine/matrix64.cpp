#include "engine/matrix64.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include <cblas.h>

#include "engine/error.h"

namespace adjoint {

Matrix64 Matrix64::identity(int64_t n) {
  Matrix64 m(n, n);
  for (int64_t i = 0; i < n; ++i) m(i, i) = 1.0;
  return m;
}

Matrix64 to_matrix64(const Tensor& t, bool as_column) {
  check(t.dim() == 1 || t.dim() == 2, "to_matrix64: expects a vector or a matrix, got ", t.shape());
  const std::vector<float> v = t.to_vector();
  Matrix64 m = t.dim() == 2 ? Matrix64(t.size(0), t.size(1)) : as_column ? Matrix64(t.size(0), 1) : Matrix64(1, t.size(0));
  for (size_t i = 0; i < v.size(); ++i) m.data[i] = v[i];
  return m;
}

MatrixView row_block(const Matrix64& m, int64_t first, int64_t count) {
  check(first >= 0 && count >= 0 && first + count <= m.rows, "row_block: rows [", first, ", ", first + count, ") of a ",
        m.rows, "×", m.cols, " matrix");
  return {m.data.data() + first * m.cols, count, m.cols};
}

MatrixView reshaped(const Matrix64& m, int64_t rows, int64_t cols) {
  check(rows >= 0 && cols >= 0 && rows * cols == m.rows * m.cols, "reshaped: a ", m.rows, "×", m.cols, " matrix read as ",
        rows, "×", cols);
  return {m.data.data(), rows, cols};
}

Matrix64 matmul(MatrixView a, MatrixView b, bool trans_a, bool trans_b) {
  const int64_t M = trans_a ? a.cols : a.rows, K = trans_a ? a.rows : a.cols;
  const int64_t K2 = trans_b ? b.cols : b.rows, N = trans_b ? b.rows : b.cols;
  check(K == K2, "matmul: inner sizes differ (", a.rows, "×", a.cols, trans_a ? "ᵀ" : "", " by ", b.rows, "×", b.cols,
        trans_b ? "ᵀ" : "", ")");
  Matrix64 c(M, N);
  if (M == 0 || N == 0 || K == 0) return c;
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), 1.0, a.data, int(a.cols), b.data, int(b.cols), 0.0, c.data.data(), int(N));
  return c;
}

Matrix64 matmul(const Matrix64& a, const Matrix64& b, bool trans_a, bool trans_b) {
  return matmul(MatrixView(a), MatrixView(b), trans_a, trans_b);
}

Matrix64 transpose(const Matrix64& a) {
  Matrix64 t(a.cols, a.rows);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t c = 0; c < a.cols; ++c) t(c, r) = a(r, c);
  return t;
}

Matrix64 hadamard(const Matrix64& a, const Matrix64& b) {
  check(a.rows == b.rows && a.cols == b.cols, "hadamard: shapes differ (", a.rows, "×", a.cols, " and ", b.rows, "×",
        b.cols, ")");
  Matrix64 c(a.rows, a.cols);
  for (size_t i = 0; i < c.data.size(); ++i) c.data[i] = a.data[i] * b.data[i];
  return c;
}

double frobenius_inner(MatrixView a, MatrixView b) {
  check(a.rows == b.rows && a.cols == b.cols, "frobenius_inner: shapes differ (", a.rows, "×", a.cols, " and ", b.rows,
        "×", b.cols, ")");
  double s = 0;
  for (int64_t i = 0; i < a.rows * a.cols; ++i) s += a.data[i] * b.data[i];
  return s;
}

double frobenius_inner(const Matrix64& a, const Matrix64& b) { return frobenius_inner(MatrixView(a), MatrixView(b)); }

Matrix64 columns(const Matrix64& a, int64_t begin, int64_t end) {
  Matrix64 c(a.rows, end - begin);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t k = begin; k < end; ++k) c(r, k - begin) = a(r, k);
  return c;
}

SymmetricEigen symmetric_eigen(const Matrix64& s) {
  check(s.rows == s.cols, "symmetric_eigen: a ", s.rows, "×", s.cols, " matrix is not square");
  const int64_t n = s.rows;
  Matrix64 a = s, v = Matrix64::identity(n);
  // Each rotation zeroes a(p, q) and moves its weight onto the diagonal; sweeps until the
  // off-diagonal part is below rounding (quadratic convergence: a handful of sweeps).
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0, diagonal = 0;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = 0; q < n; ++q) (p == q ? diagonal : off) += a(p, q) * a(p, q);
    if (off <= 1e-32 * diagonal || off == 0.0) break;
    for (int64_t p = 0; p < n; ++p)
      for (int64_t q = p + 1; q < n; ++q) {
        if (a(p, q) == 0.0) continue;
        const double theta = (a(q, q) - a(p, p)) / (2 * a(p, q));
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), sn = t * c;
        for (int64_t k = 0; k < n; ++k) {  // a ← a·J
          const double akp = a(k, p), akq = a(k, q);
          a(k, p) = c * akp - sn * akq, a(k, q) = sn * akp + c * akq;
        }
        for (int64_t k = 0; k < n; ++k) {  // a ← Jᵀ·a
          const double apk = a(p, k), aqk = a(q, k);
          a(p, k) = c * apk - sn * aqk, a(q, k) = sn * apk + c * aqk;
        }
        for (int64_t k = 0; k < n; ++k) {  // v ← v·J
          const double vkp = v(k, p), vkq = v(k, q);
          v(k, p) = c * vkp - sn * vkq, v(k, q) = sn * vkp + c * vkq;
        }
      }
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t i, int64_t j) { return a(i, i) > a(j, j); });
  SymmetricEigen e{std::vector<double>(size_t(n)), Matrix64(n, n)};
  for (int64_t j = 0; j < n; ++j) {
    e.values[size_t(j)] = a(order[size_t(j)], order[size_t(j)]);
    for (int64_t k = 0; k < n; ++k) e.vectors(k, j) = v(k, order[size_t(j)]);
  }
  return e;
}

}  // namespace adjoint
