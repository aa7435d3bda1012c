#include "analysis/similarity/tensor_similarity.h"

#include <cmath>

#include "engine/error.h"

namespace adjoint {

namespace {

// h = W x + b: the linear maps met so far, composed.
struct Affine {
  Matrix64 weight;  // (width, d)
  Matrix64 bias;    // (width, 1)
};

// [l0 + l·b, l·W] for every row l = (l0, l) of a factor: the factor read on the network's input.
Matrix64 fold_into_factor(const Matrix64& factor, const Affine& before) {
  const Matrix64 x_part = columns(factor, 1, factor.cols);
  const Matrix64 on_x = matmul(x_part, before.weight);
  const Matrix64 shift = matmul(x_part, before.bias);
  Matrix64 out(factor.rows, on_x.cols + 1);
  for (int64_t r = 0; r < factor.rows; ++r) {
    out(r, 0) = factor(r, 0) + shift(r, 0);
    for (int64_t c = 0; c < on_x.cols; ++c) out(r, c + 1) = on_x(r, c);
  }
  return out;
}

// The factors restricted to what the metric compares: all of x̃, or x alone.
Matrix64 used_columns(const Matrix64& factor, bool bias) { return bias ? factor : columns(factor, 1, factor.cols); }

// Σ_k P[o,k] Q[o,k] for every row o.
std::vector<double> row_dots(const Matrix64& p, const Matrix64& q) {
  std::vector<double> out(size_t(p.rows), 0.0);
  for (int64_t o = 0; o < p.rows; ++o)
    for (int64_t k = 0; k < p.cols; ++k) out[size_t(o)] += p(o, k) * q(o, k);
  return out;
}

// D · v for a per-hidden-unit vector v.
std::vector<double> down_times(const Matrix64& down, const std::vector<double>& v) {
  std::vector<double> out(size_t(down.rows), 0.0);
  for (int64_t o = 0; o < down.rows; ++o)
    for (int64_t h = 0; h < down.cols; ++h) out[size_t(o)] += down(o, h) * v[size_t(h)];
  return out;
}

std::vector<double> identity_slices(const BilinearForm& a, const BilinearForm& b, bool bias) {
  const Matrix64 la = used_columns(a.left, bias), ra = used_columns(a.right, bias);
  const Matrix64 lb = used_columns(b.left, bias), rb = used_columns(b.right, bias);
  Matrix64 core = hadamard(matmul(la, lb, false, true), matmul(ra, rb, false, true));
  const Matrix64 cross = hadamard(matmul(la, rb, false, true), matmul(ra, lb, false, true));
  for (size_t i = 0; i < core.data.size(); ++i) core.data[i] = 0.5 * (core.data[i] + cross.data[i]);
  // Σ_{h,k} core[h,k] D_a[o,h] D_b[o,k] = Σ_k (D_a core)[o,k] D_b[o,k].
  return row_dots(matmul(a.down, core), b.down);
}

// t[h] = l_h·r_h over the compared coordinates (the trace of l_h r_hᵀ).
std::vector<double> traces(const Matrix64& left, const Matrix64& right) {
  std::vector<double> t(size_t(left.rows), 0.0);
  for (int64_t h = 0; h < left.rows; ++h)
    for (int64_t c = 0; c < left.cols; ++c) t[size_t(h)] += left(h, c) * right(h, c);
  return t;
}

std::vector<double> gaussian_slices(const BilinearForm& a, const BilinearForm& b, bool bias) {
  std::vector<double> out = identity_slices(a, b, bias);
  const std::vector<double> ta = down_times(a.down, traces(used_columns(a.left, bias), used_columns(a.right, bias)));
  const std::vector<double> tb = down_times(b.down, traces(used_columns(b.left, bias), used_columns(b.right, bias)));
  std::vector<double> ma(ta.size(), 0.0), mb(tb.size(), 0.0);
  if (bias) {  // the constant coordinate has mean 1 and no variance: Isserlis' correction
    std::vector<double> la0(size_t(a.hidden())), lb0(size_t(b.hidden()));
    for (int64_t h = 0; h < a.hidden(); ++h) la0[size_t(h)] = a.left(h, 0) * a.right(h, 0);
    for (int64_t h = 0; h < b.hidden(); ++h) lb0[size_t(h)] = b.left(h, 0) * b.right(h, 0);
    ma = down_times(a.down, la0), mb = down_times(b.down, lb0);
  }
  for (size_t o = 0; o < out.size(); ++o) out[o] = ta[o] * tb[o] + 2 * out[o] - 2 * ma[o] * mb[o];
  return out;
}

const std::vector<SimilarityMetric> kMetrics = {
    {"identity", "the symmetrised tensors' Frobenius inner product ⟨A^s|B^s⟩", identity_slices},
    {"gaussian", "E[A(x)·B(x)] for x ~ N(0, I): the functions' inner product under Gaussian inputs", gaussian_slices},
};

double cosine(double ab, double aa, double bb) { return ab / std::sqrt(aa * bb); }

}  // namespace

BilinearForm bilinear_form(const PolynomialView& view) {
  check(view.positions == 1, view.arch, " reads ", view.positions,
        " positions; a sequence model is compared by the second-moment recursion, not one layer's closed form");
  Affine before{Matrix64::identity(view.input_dim), Matrix64(view.input_dim, 1)};
  BilinearForm form;
  bool seen = false;
  for (const PolynomialStep& s : view.steps) {
    if (s.kind != PolynomialStep::Kind::Linear) {
      check(s.kind == PolynomialStep::Kind::Bilinear && !s.residual && !seen, view.arch, ": layer '", s.name,
            "' makes this more than one bilinear layer; compare it with the second-moment recursion (--deep)");
      seen = true;
      form.left = fold_into_factor(to_matrix64(s.left), before);
      form.right = fold_into_factor(to_matrix64(s.right), before);
      form.down = s.down.defined() ? to_matrix64(s.down) : Matrix64::identity(s.left.size(0));
      continue;
    }
    const Matrix64 w = to_matrix64(s.weight);
    if (!seen) {
      before.weight = matmul(w, before.weight);
      before.bias = matmul(w, before.bias);
      if (s.bias.defined()) {
        const Matrix64 b = to_matrix64(s.bias);
        for (int64_t r = 0; r < w.rows; ++r) before.bias(r, 0) += b.data[size_t(r)];
      }
      continue;
    }
    form.down = matmul(w, form.down);
    if (s.bias.defined()) {
      // A constant output c is one more hidden unit, (e0·x̃)(e0·x̃) = 1, with D's column c.
      const Matrix64 b = to_matrix64(s.bias);
      const int64_t H = form.hidden(), d1 = form.left.cols;
      Matrix64 left(H + 1, d1), right(H + 1, d1), down(form.outputs(), H + 1);
      for (int64_t h = 0; h < H; ++h)
        for (int64_t c = 0; c < d1; ++c) left(h, c) = form.left(h, c), right(h, c) = form.right(h, c);
      left(H, 0) = right(H, 0) = 1.0;
      for (int64_t o = 0; o < form.outputs(); ++o) {
        for (int64_t h = 0; h < H; ++h) down(o, h) = form.down(o, h);
        down(o, H) = b.data[size_t(o)];
      }
      form = {left, right, down};
    }
  }
  check(seen, view.arch, " has no bilinear layer to compare");
  return form;
}

BilinearForm difference(const BilinearForm& a, const BilinearForm& a0) {
  check(a.left.cols == a0.left.cols && a.outputs() == a0.outputs(), "tensor difference: layers of ", a.inputs(), "→",
        a.outputs(), " and ", a0.inputs(), "→", a0.outputs(), " differ in shape");
  const int64_t H = a.hidden(), H0 = a0.hidden(), d1 = a.left.cols;
  BilinearForm out{Matrix64(H + H0, d1), Matrix64(H + H0, d1), Matrix64(a.outputs(), H + H0)};
  for (int64_t c = 0; c < d1; ++c) {
    for (int64_t h = 0; h < H; ++h) out.left(h, c) = a.left(h, c), out.right(h, c) = a.right(h, c);
    for (int64_t h = 0; h < H0; ++h) out.left(H + h, c) = a0.left(h, c), out.right(H + h, c) = a0.right(h, c);
  }
  for (int64_t o = 0; o < a.outputs(); ++o) {
    for (int64_t h = 0; h < H; ++h) out.down(o, h) = a.down(o, h);
    for (int64_t h = 0; h < H0; ++h) out.down(o, H + h) = -a0.down(o, h);
  }
  return out;
}

Matrix64 symmetric_slice(const BilinearForm& form, int64_t o) {
  const int64_t n = form.left.cols;
  Matrix64 s(n, n);
  for (int64_t h = 0; h < form.hidden(); ++h)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < n; ++j)
        s(i, j) += 0.5 * form.down(o, h) * (form.left(h, i) * form.right(h, j) + form.left(h, j) * form.right(h, i));
  return s;
}

const std::vector<SimilarityMetric>& similarity_metrics() { return kMetrics; }

const SimilarityMetric& similarity_metric(const std::string& name) {
  std::string names;
  for (const SimilarityMetric& m : kMetrics) {
    if (name == m.name) return m;
    names += cat(names.empty() ? "" : ", ", m.name);
  }
  throw UsageError(cat("--metric: unknown metric '", name, "' (", names, ")"));
}

std::vector<double> slice_inner(const SimilarityMetric& metric, const BilinearForm& a, const BilinearForm& b, bool bias) {
  check(a.left.cols == b.left.cols && a.outputs() == b.outputs(), "tensor similarity: layers of ", a.inputs(), "→",
        a.outputs(), " and ", b.inputs(), "→", b.outputs(), " cannot be compared (input and output sizes must match)");
  return metric.slice_inner(a, b, bias);
}

Similarity tensor_similarity(const SimilarityMetric& metric, const BilinearForm& a, const BilinearForm& b, bool bias) {
  const std::vector<double> ab = slice_inner(metric, a, b, bias);
  const std::vector<double> aa = slice_inner(metric, a, a, bias);
  const std::vector<double> bb = slice_inner(metric, b, b, bias);
  Similarity s;
  double sab = 0, saa = 0, sbb = 0;
  for (size_t o = 0; o < ab.size(); ++o) {
    s.slices.push_back(cosine(ab[o], aa[o], bb[o]));
    sab += ab[o], saa += aa[o], sbb += bb[o];
  }
  s.total = cosine(sab, saa, sbb);
  return s;
}

}  // namespace adjoint
