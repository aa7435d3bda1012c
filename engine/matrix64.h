// Dense row-major matrices of doubles: what the closed forms of tensor similarity and the
// polynomial evaluation of bilinear models compute in, so that sums of many products of
// float weights lose nothing to rounding. Products go to OpenBLAS's dgemm.
#pragma once
#include <cstdint>
#include <vector>

#include "engine/tensor.h"

namespace adjoint {

struct Matrix64 {
  int64_t rows = 0, cols = 0;
  std::vector<double> data;

  Matrix64() = default;
  Matrix64(int64_t r, int64_t c, double fill = 0.0) : rows(r), cols(c), data(size_t(r * c), fill) {}
  double& operator()(int64_t r, int64_t c) { return data[size_t(r * cols + c)]; }
  double operator()(int64_t r, int64_t c) const { return data[size_t(r * cols + c)]; }
  static Matrix64 identity(int64_t n);
};

// A read-only window on a matrix's entries, `rows`×`cols` row-major from `data`: lets a product
// read a block of rows, or the same entries as another shape, without copying them. It does not
// own the entries: use it while the matrix it views lives.
struct MatrixView {
  const double* data = nullptr;
  int64_t rows = 0, cols = 0;
  MatrixView() = default;
  MatrixView(const double* d, int64_t r, int64_t c) : data(d), rows(r), cols(c) {}
  MatrixView(const Matrix64& m) : data(m.data.data()), rows(m.rows), cols(m.cols) {}  // NOLINT: the whole matrix
};
// The rows [first, first + count) of m; m's entries read as rows×cols.
MatrixView row_block(const Matrix64& m, int64_t first, int64_t count);
MatrixView reshaped(const Matrix64& m, int64_t rows, int64_t cols);

// A 1-D or 2-D float tensor as a matrix (a vector becomes one row... of its length as columns
// when `as_column` is false, or a column otherwise).
Matrix64 to_matrix64(const Tensor& t, bool as_column = false);

// op(A)·op(B), op = transpose when the flag is set.
Matrix64 matmul(const Matrix64& a, const Matrix64& b, bool trans_a = false, bool trans_b = false);
Matrix64 matmul(MatrixView a, MatrixView b, bool trans_a = false, bool trans_b = false);
Matrix64 transpose(const Matrix64& a);
// Elementwise product and sum of elementwise products (⟨A, B⟩_F).
Matrix64 hadamard(const Matrix64& a, const Matrix64& b);
double frobenius_inner(const Matrix64& a, const Matrix64& b);
double frobenius_inner(MatrixView a, MatrixView b);
// The columns [begin, end) of a.
Matrix64 columns(const Matrix64& a, int64_t begin, int64_t end);

// The eigen-decomposition of a small symmetric matrix, s = V·diag(values)·Vᵀ, by cyclic Jacobi
// rotations (accurate to rounding, for the few-by-few matrices the analyses need): values in
// descending order, the eigenvectors as V's columns.
struct SymmetricEigen {
  std::vector<double> values;
  Matrix64 vectors;
};
SymmetricEigen symmetric_eigen(const Matrix64& s);

}  // namespace adjoint
