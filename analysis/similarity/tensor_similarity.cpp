#include "analysis/similarity/tensor_similarity.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <tuple>

#include "engine/error.h"
#include "engine/threads.h"

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

// The factor's column 0 (the constant coordinate) read on x ~ N(μ, ·): l_0 + l·μ.
void fold_mean(Matrix64& factor, const Matrix64& mean) {
  for (int64_t r = 0; r < factor.rows; ++r)
    for (int64_t c = 1; c < factor.cols; ++c) factor(r, 0) += factor(r, c) * mean(c - 1, 0);
}

// [L; R] (2H, n) over the compared coordinates: all of x̃, or x alone.
Matrix64 stacked_factors(const Matrix64& left, const Matrix64& right, bool bias) {
  const int64_t H = left.rows, skip = bias ? 0 : 1, n = left.cols - skip;
  Matrix64 out(2 * H, n);
  for (int64_t h = 0; h < H; ++h)
    for (int64_t c = 0; c < n; ++c) out(h, c) = left(h, c + skip), out(H + h, c) = right(h, c + skip);
  return out;
}

// D · v for a per-hidden-unit vector v.
std::vector<double> down_times(const Matrix64& down, const std::vector<double>& v) {
  std::vector<double> out(size_t(down.rows), 0.0);
  for (int64_t o = 0; o < down.rows; ++o)
    for (int64_t h = 0; h < down.cols; ++h) out[size_t(o)] += down(o, h) * v[size_t(h)];
  return out;
}

const Matrix64& left_operand(const PreparedLayer& p) { return p.weighted.rows ? p.weighted : p.factors; }

// G = W_a · F_bᵀ for rows [0, rows_a) of W_a against `rows_b` rows of F starting at `b`.
void gram_into(const Matrix64& wa, const double* b, int64_t rows_b, int64_t n, std::vector<double>& g) {
  g.assign(size_t(wa.rows * rows_b), 0.0);
  if (wa.rows == 0 || rows_b == 0 || n == 0) return;
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(wa.rows), int(rows_b), int(n), 1.0, wa.data.data(), int(n), b,
              int(n), 0.0, g.data(), int(rows_b));
}

// ⟨A_o|B_o⟩ per output from G = [L_a; R_a] Σ [L_b; R_b]ᵀ (2H_a × 2H_b, rows `ld` apart).
std::vector<double> slices_from_gram(const PreparedLayer& a, const PreparedLayer& b, const double* g, int64_t ld) {
  const int64_t Ha = a.hidden, Hb = b.hidden;
  Matrix64 core(Ha, Hb);
  for (int64_t h = 0; h < Ha; ++h) {
    const double* ll = g + h * ld;
    const double* rl = g + (Ha + h) * ld;
    for (int64_t k = 0; k < Hb; ++k) core(h, k) = 0.5 * (ll[k] * rl[Hb + k] + ll[Hb + k] * rl[k]);
  }
  // Σ_{h,k} core[h,k] D_a[o,h] D_b[o,k] = Σ_k (D_a core)[o,k] D_b[o,k].
  const Matrix64 da_core = matmul(a.down, core);
  std::vector<double> out(size_t(a.outputs()), 0.0);
  for (int64_t o = 0; o < a.outputs(); ++o)
    for (int64_t k = 0; k < Hb; ++k) out[size_t(o)] += da_core(o, k) * b.down(o, k);
  if (a.metric->isserlis)
    for (size_t o = 0; o < out.size(); ++o)
      out[o] = a.trace_out[o] * b.trace_out[o] + 2 * out[o] - 2 * a.mean_out[o] * b.mean_out[o];
  return out;
}

void check_comparable(const PreparedLayer& a, const PreparedLayer& b) {
  check(a.inputs() == b.inputs() && a.outputs() == b.outputs(), "tensor similarity: layers of ", a.inputs(), "→",
        a.outputs(), " and ", b.inputs(), "→", b.outputs(),
        " cannot be compared (input and output sizes must match)");
  check(a.metric == b.metric && a.bias == b.bias, "tensor similarity: layers prepared under different metrics (", a.metric->name, ", ",
        b.metric->name, ") or bias settings");
}

// A self inner product too small to tell from rounding: the tensor is zero.
bool zero_norm(double self, double scale) { return !(self > 1e-14 * scale); }

double cosine(double ab, double aa, double bb) { return ab / std::sqrt(aa * bb); }

Similarity similarity_from(const PreparedLayer& a, const PreparedLayer& b, std::vector<double> ab) {
  double saa = 0, sbb = 0, scale_a = 0, scale_b = 0;
  for (size_t o = 0; o < ab.size(); ++o) saa += a.self[o], sbb += b.self[o], scale_a += a.scale[o], scale_b += b.scale[o];
  for (const auto& [name, self, scale] : {std::tuple{"first", saa, scale_a}, std::tuple{"second", sbb, scale_b}})
    check(!zero_norm(self, scale), "tensor similarity is undefined: the ", name, " layer's tensor has zero norm under the ",
          a.metric->name, " metric (", self, "; a zero layer, or A − A0 of equal layers)");
  Similarity s;
  for (size_t o = 0; o < ab.size(); ++o) {
    check(std::isfinite(ab[o]), "tensor similarity: the inner product of output ", o, " is not finite (", ab[o], ")");
    const bool undefined = zero_norm(a.self[o], a.scale[o]) || zero_norm(b.self[o], b.scale[o]);
    s.slices.push_back(undefined ? NAN : cosine(ab[o], a.self[o], b.self[o]));
    s.inner_ab += ab[o];
  }
  s.inner_aa = saa, s.inner_bb = sbb;
  s.total = cosine(s.inner_ab, saa, sbb);
  s.slice_ab = std::move(ab), s.slice_aa = a.self, s.slice_bb = b.self;
  return s;
}

const std::vector<SimilarityMetric> kMetrics = {
    {"identity", "the symmetrised tensors' Frobenius inner product ⟨A^s|B^s⟩", false, false},
    {"gaussian", "E[A(x)·B(x)] for x ~ N(0, I): the functions' inner product under Gaussian inputs", true, false},
    {"data", "E[A(x)·B(x)] for x ~ N(μ, Σ), the data's own mean and covariance", true, true},
};

}  // namespace

BilinearForm bilinear_form(const PolynomialView& view) {
  check(view.positions == 1, view.arch, " reads ", view.positions,
        " positions; a sequence model is compared by the second-moment recursion, not one layer's closed form");
  Affine before{Matrix64::identity(view.input_dim), Matrix64(view.input_dim, 1)};
  BilinearForm form;
  Matrix64 linear;  // a residual layer's identity path, as it reaches the output: rows (1 + x) ↦ value
  bool seen = false;
  for (const PolynomialStep& s : view.steps) {
    if (s.kind != PolynomialStep::Kind::Linear) {
      check(s.kind == PolynomialStep::Kind::Bilinear && !seen, view.arch, ": layer '", s.name,
            "' makes this more than one bilinear layer; the closed form covers one (tensorsim compares deeper "
            "networks by the second-moment recursion)");
      seen = true;
      form.left = fold_into_factor(to_matrix64(s.left), before);
      form.right = fold_into_factor(to_matrix64(s.right), before);
      form.down = s.down.defined() ? to_matrix64(s.down) : Matrix64::identity(s.left.size(0));
      if (s.residual) {  // h + s·y: y scaled, h = W x + b carried linearly
        for (double& v : form.down.data) v *= s.scale;
        linear = Matrix64(before.weight.rows, before.weight.cols + 1);
        for (int64_t r = 0; r < linear.rows; ++r) {
          linear(r, 0) = before.bias(r, 0);
          for (int64_t c = 0; c < before.weight.cols; ++c) linear(r, c + 1) = before.weight(r, c);
        }
      }
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
    if (linear.rows) linear = matmul(w, linear);
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
  if (linear.rows) {
    // Output o's linear part c_o·x̃ is the unit (c_o·x̃)(e_0·x̃) with D's column e_o.
    const int64_t H = form.hidden(), O = form.outputs(), d1 = form.left.cols;
    Matrix64 left(H + O, d1), right(H + O, d1), down(O, H + O);
    for (int64_t h = 0; h < H; ++h)
      for (int64_t c = 0; c < d1; ++c) left(h, c) = form.left(h, c), right(h, c) = form.right(h, c);
    for (int64_t o = 0; o < O; ++o) {
      for (int64_t c = 0; c < d1; ++c) left(H + o, c) = linear(o, c);
      right(H + o, 0) = 1.0;
      for (int64_t h = 0; h < H; ++h) down(o, h) = form.down(o, h);
      down(o, H + o) = 1.0;
    }
    form = {left, right, down};
  }
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

InputDistribution input_distribution(const Matrix64& samples) {
  check(samples.rows >= 2, "input distribution: ", samples.rows, " sample(s); at least two are needed");
  const int64_t n = samples.rows, d = samples.cols;
  InputDistribution out{Matrix64(d, 1), Matrix64()};
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < d; ++c) out.mean(c, 0) += samples(r, c) / double(n);
  Matrix64 centred = samples;
  for (int64_t r = 0; r < n; ++r)
    for (int64_t c = 0; c < d; ++c) centred(r, c) -= out.mean(c, 0);
  out.covariance = matmul(centred, centred, true, false);
  for (double& v : out.covariance.data) v /= double(n);
  return out;
}

PreparedLayer prepare_layer(const SimilarityMetric& metric, const BilinearForm& form, bool bias,
                            const InputDistribution* input) {
  PreparedLayer p;
  p.metric = &metric;
  p.hidden = form.hidden(), p.features = form.inputs(), p.bias = bias;
  p.down = form.down;
  Matrix64 left = form.left, right = form.right;
  if (metric.needs_data) {
    check(input != nullptr, "tensor similarity: the data metric needs the data's mean and covariance");
    check(input->mean.rows == form.inputs() && input->covariance.rows == form.inputs() &&
              input->covariance.cols == form.inputs(),
          "tensor similarity: the data's ", input->mean.rows, " input features do not match the layer's ", form.inputs());
    fold_mean(left, input->mean), fold_mean(right, input->mean);
  }
  p.factors = stacked_factors(left, right, bias);
  if (metric.needs_data) {
    // The x part times Σ: products of a weighted row with a plain one are l Σ l'ᵀ.
    const int64_t skip = bias ? 1 : 0;
    const Matrix64 weighted_x = matmul(columns(p.factors, skip, p.factors.cols), input->covariance);
    p.weighted = p.factors;
    for (int64_t r = 0; r < p.weighted.rows; ++r)
      for (int64_t c = 0; c < weighted_x.cols; ++c) p.weighted(r, c + skip) = weighted_x(r, c);
  }
  // t[h] = l_h·r_h (under Σ), m[h] = l_h0 r_h0: Isserlis' terms; and the sizes |l_h|, |r_h|.
  const Matrix64& w = left_operand(p);
  const int64_t H = p.hidden, n = p.factors.cols;
  std::vector<double> trace(size_t(H), 0.0), mean(size_t(H), 0.0), size(size_t(H), 0.0);
  for (int64_t h = 0; h < H; ++h) {
    double lr = 0, ll = 0, rr = 0;
    for (int64_t c = 0; c < n; ++c)
      lr += w(h, c) * p.factors(H + h, c), ll += w(h, c) * p.factors(h, c), rr += w(H + h, c) * p.factors(H + h, c);
    trace[size_t(h)] = lr;
    size[size_t(h)] = std::sqrt(std::max(0.0, ll) * std::max(0.0, rr));
    if (bias) mean[size_t(h)] = p.factors(h, 0) * p.factors(H + h, 0);
  }
  p.trace_out = down_times(p.down, trace);
  p.mean_out = down_times(p.down, mean);
  p.scale.assign(size_t(p.outputs()), 0.0);
  for (int64_t o = 0; o < p.outputs(); ++o) {
    for (int64_t h = 0; h < H; ++h) p.scale[size_t(o)] += std::abs(p.down(o, h)) * size[size_t(h)];
    p.scale[size_t(o)] *= p.scale[size_t(o)];
  }
  // The layer's own Gram matrix is symmetric: without Σ, half of it (dsyrk), then mirrored.
  std::vector<double> g;
  const int64_t rows = p.factors.rows;
  if (p.weighted.rows == 0 && rows > 0 && n > 0) {
    g.assign(size_t(rows * rows), 0.0);
    cblas_dsyrk(CblasRowMajor, CblasUpper, CblasNoTrans, int(rows), int(n), 1.0, p.factors.data.data(), int(n), 0.0,
                g.data(), int(rows));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < r; ++c) g[size_t(r * rows + c)] = g[size_t(c * rows + r)];
  } else {
    gram_into(w, p.factors.data.data(), rows, n, g);
  }
  p.self = slices_from_gram(p, p, g.data(), rows);
  return p;
}

std::vector<double> slice_inner(const PreparedLayer& a, const PreparedLayer& b) {
  check_comparable(a, b);
  std::vector<double> g;
  gram_into(left_operand(a), b.factors.data.data(), b.factors.rows, b.factors.cols, g);
  return slices_from_gram(a, b, g.data(), b.factors.rows);
}

std::vector<double> slice_inner(const SimilarityMetric& metric, const BilinearForm& a, const BilinearForm& b, bool bias,
                                const InputDistribution* input) {
  return slice_inner(prepare_layer(metric, a, bias, input), prepare_layer(metric, b, bias, input));
}

Similarity tensor_similarity(const PreparedLayer& a, const PreparedLayer& b) {
  return similarity_from(a, b, slice_inner(a, b));
}

Similarity tensor_similarity(const SimilarityMetric& metric, const BilinearForm& a, const BilinearForm& b, bool bias,
                             const InputDistribution* input) {
  return tensor_similarity(prepare_layer(metric, a, bias, input), prepare_layer(metric, b, bias, input));
}

std::vector<Similarity> pairwise_similarity(const std::vector<PreparedLayer>& layers,
                                            const std::vector<std::string>& names) {
  const size_t K = layers.size();
  check(names.empty() || names.size() == K, "pairwise_similarity: ", names.size(), " names for ", K, " layers");
  const auto pair_name = [&](size_t i, size_t j) {
    return names.empty() ? cat("pair (", i, ", ", j, ")") : i == j ? names[i] : cat(names[i], " vs ", names[j]);
  };
  std::vector<Similarity> out(K * K);
  if (K == 0) return out;
  // All factors stacked in order: layer j's rows start at offset[j].
  std::vector<int64_t> offset(K + 1, 0);
  for (size_t j = 0; j < K; ++j) {
    try {
      check_comparable(layers[0], layers[j]);
    } catch (const Error& e) {
      throw Error(cat(pair_name(0, j), ": ", e.what()));
    }
    offset[j + 1] = offset[j] + layers[j].factors.rows;
  }
  const int64_t n = layers[0].factors.cols;
  std::vector<double> all(size_t(offset[K] * n));
  for (size_t j = 0; j < K; ++j)
    std::copy(layers[j].factors.data.begin(), layers[j].factors.data.end(), all.begin() + offset[j] * n);
  // Row i: one product of layer i with every later layer, then each pair's slices.
  parallel_for(int64_t(K), 1, [&](int64_t begin, int64_t end) {
    std::vector<double> g;
    for (int64_t i = begin; i < end; ++i) {
      const PreparedLayer& a = layers[size_t(i)];
      const auto named = [&](size_t j, const std::vector<double>& ab) {
        try {
          return similarity_from(a, layers[j], ab);
        } catch (const Error& e) {
          throw Error(cat(pair_name(size_t(i), j), ": ", e.what()));
        }
      };
      out[size_t(i) * K + size_t(i)] = named(size_t(i), a.self);
      const int64_t first = offset[size_t(i) + 1], rows = offset[K] - first;
      gram_into(left_operand(a), all.data() + first * n, rows, n, g);
      for (size_t j = size_t(i) + 1; j < K; ++j) {
        Similarity s = named(j, slices_from_gram(a, layers[j], g.data() + (offset[j] - first), rows));
        Similarity t = s;  // the transpose: B against A
        std::swap(t.inner_aa, t.inner_bb), std::swap(t.slice_aa, t.slice_bb);
        out[size_t(i) * K + j] = std::move(s), out[j * K + size_t(i)] = std::move(t);
      }
    }
  });
  return out;
}

}  // namespace adjoint
