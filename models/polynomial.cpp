#include "models/polynomial.h"

#include <cmath>

#include "engine/error.h"
#include "engine/matrix64.h"

namespace adjoint {

int64_t PolynomialView::width_after(size_t step) const {
  check(step < steps.size(), "polynomial view: step ", step, " of ", steps.size());
  for (size_t i = step + 1; i-- > 0;) {
    const PolynomialStep& s = steps[i];
    if (s.kind == PolynomialStep::Kind::Linear) return s.weight.size(0);
    if (s.kind == PolynomialStep::Kind::Bilinear && !s.residual) return s.down.defined() ? s.down.size(0) : s.left.size(0);
    // Residual steps keep the width: look further back.
  }
  return input_dim;
}

namespace {

// (1, h) for every row of h: the padded input x̃ of a bilinear form.
Matrix64 with_constant(const Matrix64& h) {
  Matrix64 out(h.rows, h.cols + 1);
  for (int64_t r = 0; r < h.rows; ++r) {
    out(r, 0) = 1.0;
    for (int64_t c = 0; c < h.cols; ++c) out(r, c + 1) = h(r, c);
  }
  return out;
}

void add_scaled(Matrix64& h, const Matrix64& y, double scale) {
  check(h.rows == y.rows && h.cols == y.cols, "polynomial: a residual step changes the width from ", h.cols, " to ",
        y.cols);
  for (size_t i = 0; i < h.data.size(); ++i) h.data[i] += scale * y.data[i];
}

// Rows are (example, position) pairs; position = row % T.
Matrix64 linear_rows(const PolynomialStep& s, const Matrix64& h, int64_t T) {
  Matrix64 y = matmul(h, to_matrix64(s.weight), false, true);
  if (s.bias.defined()) {
    const Matrix64 b = to_matrix64(s.bias);  // (1, out) or (T, out)
    for (int64_t r = 0; r < y.rows; ++r)
      for (int64_t c = 0; c < y.cols; ++c) y(r, c) += b(b.rows == 1 ? 0 : r % T, c);
  }
  return y;
}

Matrix64 bilinear_rows(const PolynomialStep& s, const Matrix64& h) {
  const Matrix64 x = with_constant(h);
  Matrix64 y = hadamard(matmul(x, to_matrix64(s.left), false, true), matmul(x, to_matrix64(s.right), false, true));
  return s.down.defined() ? matmul(y, to_matrix64(s.down), false, true) : y;
}

// Rotary positions on one head's vector x (d_head values) at position t: the pairs (j, j + d/2)
// turned by the angle t·base^(−2j/d), the first half taking −x_{j+d/2}·sin, the second +x_j·sin.
void rotate(double* x, int64_t d, int64_t t) {
  const int64_t half = d / 2;
  for (int64_t j = 0; j < half; ++j) {
    const double angle = double(t) / std::pow(10000.0, double(2 * j) / double(d));
    const double c = std::cos(angle), sn = std::sin(angle), a = x[j], b = x[j + half];
    x[j] = a * c - b * sn, x[j + half] = b * c + a * sn;
  }
}

Matrix64 attention_rows(const PolynomialStep& s, const Matrix64& h, int64_t T) {
  const int64_t n = h.rows / T, dim = h.cols, dh = dim / s.heads;
  Matrix64 parts = matmul(h, to_matrix64(s.qkv), false, true);  // (n·T, 5·dim): q1 k1 q2 k2 v
  if (s.qk_bias.defined()) {
    const std::vector<float> b = s.qk_bias.contiguous().to_vector();
    for (int64_t r = 0; r < parts.rows; ++r)
      for (int64_t c = 0; c < 4 * dim; ++c) parts(r, c) += b[size_t(c)];
  }
  if (s.rotary)
    for (int64_t r = 0; r < parts.rows; ++r)
      for (int64_t part = 0; part < 4; ++part)
        for (int64_t head = 0; head < s.heads; ++head) rotate(&parts(r, part * dim + head * dh), dh, r % T);
  Matrix64 o(h.rows, dim);
  auto at = [&](int64_t example, int64_t t, int64_t part, int64_t head, int64_t j) {
    return parts(example * T + t, part * dim + head * dh + j);
  };
  for (int64_t e = 0; e < n; ++e)
    for (int64_t head = 0; head < s.heads; ++head)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t u = 0; u <= t; ++u) {
          double s1 = 0, s2 = 0;
          for (int64_t j = 0; j < dh; ++j) s1 += at(e, t, 0, head, j) * at(e, u, 1, head, j);
          for (int64_t j = 0; j < dh; ++j) s2 += at(e, t, 2, head, j) * at(e, u, 3, head, j);
          const double score = s1 * s2 / double(dh * dh);
          for (int64_t j = 0; j < dh; ++j) o(e * T + t, head * dh + j) += score * at(e, u, 4, head, j);
        }
  return matmul(o, to_matrix64(s.proj), false, true);
}

}  // namespace

std::vector<double> evaluate_polynomial(const PolynomialView& view, const std::vector<double>& x, int64_t n) {
  const int64_t T = view.positions;
  check(int64_t(x.size()) == n * T * view.input_dim, "polynomial: ", n, " inputs of ", T, "×", view.input_dim,
        " values need ", n * T * view.input_dim, ", got ", x.size());
  Matrix64 h(n * T, view.input_dim);
  h.data = x;
  for (const PolynomialStep& s : view.steps) {
    switch (s.kind) {
      case PolynomialStep::Kind::Linear: h = linear_rows(s, h, T); break;
      case PolynomialStep::Kind::Bilinear:
        if (s.residual) add_scaled(h, bilinear_rows(s, h), s.scale);
        else h = bilinear_rows(s, h);
        break;
      case PolynomialStep::Kind::Attention: add_scaled(h, attention_rows(s, h, T), s.scale); break;
    }
  }
  return h.data;
}

}  // namespace adjoint
