#include "engine/matrix64.h"

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

Matrix64 matmul(const Matrix64& a, const Matrix64& b, bool trans_a, bool trans_b) {
  const int64_t M = trans_a ? a.cols : a.rows, K = trans_a ? a.rows : a.cols;
  const int64_t K2 = trans_b ? b.cols : b.rows, N = trans_b ? b.rows : b.cols;
  check(K == K2, "matmul: inner sizes differ (", a.rows, "×", a.cols, trans_a ? "ᵀ" : "", " by ", b.rows, "×", b.cols,
        trans_b ? "ᵀ" : "", ")");
  Matrix64 c(M, N);
  if (M == 0 || N == 0 || K == 0) return c;
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans, trans_b ? CblasTrans : CblasNoTrans, int(M), int(N),
              int(K), 1.0, a.data.data(), int(a.cols), b.data.data(), int(b.cols), 0.0, c.data.data(), int(N));
  return c;
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

double frobenius_inner(const Matrix64& a, const Matrix64& b) {
  check(a.rows == b.rows && a.cols == b.cols, "frobenius_inner: shapes differ (", a.rows, "×", a.cols, " and ", b.rows,
        "×", b.cols, ")");
  double s = 0;
  for (size_t i = 0; i < a.data.size(); ++i) s += a.data[i] * b.data[i];
  return s;
}

Matrix64 columns(const Matrix64& a, int64_t begin, int64_t end) {
  Matrix64 c(a.rows, end - begin);
  for (int64_t r = 0; r < a.rows; ++r)
    for (int64_t k = begin; k < end; ++k) c(r, k - begin) = a(r, k);
  return c;
}

}  // namespace adjoint
