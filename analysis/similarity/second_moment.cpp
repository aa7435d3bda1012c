#include "analysis/similarity/second_moment.h"

#include <cmath>

#include "analysis/similarity/attention_moments.h"
#include "analysis/similarity/monte_carlo.h"
#include "engine/error.h"
#include "engine/matrix64.h"

namespace adjoint {

namespace {

// Every linear and bilinear layer is lowered to one map of the whole state z (constant
// coordinate first, then each position's features):
//   z' = A z + D((L z) ⊙ (R z))
// with A's row 0 keeping the constant (D's row 0 is zero). One moment update serves both
// kinds; the attention, a product of five legs, has its own (attention_moments.h).
struct QuadraticMap {
  Matrix64 linear;       // A (n', n)
  Matrix64 left, right;  // L, R (H, n): the legs of H products
  Matrix64 down;         // D (n', H)
  int64_t units() const { return left.rows; }
};

// The coordinate of feature i at position t in a state of `width` features per position.
int64_t coordinate(int64_t t, int64_t i, int64_t width) { return 1 + t * width + i; }

// A that keeps the first `kept` coordinates of a state of n in a state of n'.
Matrix64 keep_first(int64_t n_out, int64_t n_in, int64_t kept) {
  Matrix64 a(n_out, n_in);
  for (int64_t i = 0; i < kept; ++i) a(i, i) = 1.0;
  return a;
}

QuadraticMap lower_linear(const PolynomialStep& s, int64_t T) {
  const Matrix64 w = to_matrix64(s.weight);
  const Matrix64 b = s.bias.defined() ? to_matrix64(s.bias) : Matrix64();
  QuadraticMap m{Matrix64(1 + T * w.rows, 1 + T * w.cols), Matrix64(0, 1 + T * w.cols), Matrix64(0, 1 + T * w.cols),
                 Matrix64(1 + T * w.rows, 0)};
  m.linear(0, 0) = 1.0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < w.rows; ++o) {
      if (s.bias.defined()) m.linear(coordinate(t, o, w.rows), 0) = b(b.rows == 1 ? 0 : t, o);
      for (int64_t i = 0; i < w.cols; ++i) m.linear(coordinate(t, o, w.rows), coordinate(t, i, w.cols)) = w(o, i);
    }
  return m;
}

// h_t ← [h_t +] s·D((L h̃_t) ⊙ (R h̃_t)) at every position: units (t, h).
QuadraticMap lower_bilinear(const PolynomialStep& s, int64_t T, int64_t width) {
  const Matrix64 l = to_matrix64(s.left), r = to_matrix64(s.right);
  const Matrix64 d = s.down.defined() ? to_matrix64(s.down) : Matrix64::identity(l.rows);
  const int64_t H = l.rows, out = d.rows, n = 1 + T * width, n_out = 1 + T * out;
  const double scale = s.residual ? s.scale : 1.0;
  QuadraticMap m{s.residual ? Matrix64::identity(n) : keep_first(n_out, n, 1), Matrix64(T * H, n), Matrix64(T * H, n),
                 Matrix64(n_out, T * H)};
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t unit = t * H + h;
      m.left(unit, 0) = l(h, 0), m.right(unit, 0) = r(h, 0);
      for (int64_t i = 0; i < width; ++i)
        m.left(unit, coordinate(t, i, width)) = l(h, i + 1), m.right(unit, coordinate(t, i, width)) = r(h, i + 1);
      for (int64_t o = 0; o < out; ++o) m.down(coordinate(t, o, out), unit) = scale * d(o, h);
    }
  return m;
}

QuadraticMap lower(const PolynomialStep& s, int64_t T, int64_t width) {
  check(s.kind != PolynomialStep::Kind::Attention, "lower: attention is not one quadratic map (attention_moments.h)");
  return s.kind == PolynomialStep::Kind::Linear ? lower_linear(s, T) : lower_bilinear(s, T, width);
}

// What the Isserlis sums need of one map's legs under moments Σ_xx: the means Lμ and Rμ
// (μ = E[z] = Σ_xx's constant column) and diag(L Σ_xx Rᵀ).
struct Legs {
  const QuadraticMap& map;
  std::vector<double> l_mean, r_mean, l_sigma_r;
};

Legs legs_of(const QuadraticMap& m, const Matrix64& sigma_xx) {
  Legs legs{m, {}, {}, {}};
  const Matrix64 mean = columns(sigma_xx, 0, 1);
  const Matrix64 lm = matmul(m.left, mean), rm = matmul(m.right, mean), ls = matmul(m.left, sigma_xx);
  for (int64_t h = 0; h < m.units(); ++h) {
    double d = 0;
    for (int64_t c = 0; c < ls.cols; ++c) d += ls(h, c) * m.right(h, c);
    legs.l_mean.push_back(lm(h, 0)), legs.r_mean.push_back(rm(h, 0)), legs.l_sigma_r.push_back(d);
  }
  return legs;
}

// E[z_x y_yᵀ] for y = D((L z_y) ⊙ (R z_y)): three legs, E[w1 w2 w3] = M12 m3 + M13 m2 + M23 m1 − 2 m1 m2 m3.
Matrix64 state_times_output(const Matrix64& sigma_xy, const Matrix64& mean_x, const Legs& y) {
  const Matrix64 sl = matmul(sigma_xy, y.map.left, false, true), sr = matmul(sigma_xy, y.map.right, false, true);
  Matrix64 x(sl.rows, sl.cols);
  for (int64_t i = 0; i < x.rows; ++i)
    for (int64_t h = 0; h < x.cols; ++h) {
      const double lm = y.l_mean[size_t(h)], rm = y.r_mean[size_t(h)];
      x(i, h) = sl(i, h) * rm + sr(i, h) * lm + mean_x(i, 0) * (y.l_sigma_r[size_t(h)] - 2 * lm * rm);
    }
  return matmul(x, y.map.down, false, true);
}

// E[y_x y_yᵀ]: four legs, E = M13 M24 + M14 M23 + M12 M34 − 2 m1 m2 m3 m4.
Matrix64 output_times_output(const Matrix64& sigma_xy, const Legs& x, const Legs& y) {
  const Matrix64 ls = matmul(x.map.left, sigma_xy), rs = matmul(x.map.right, sigma_xy);
  Matrix64 c = hadamard(matmul(ls, y.map.left, false, true), matmul(rs, y.map.right, false, true));
  const Matrix64 cross = hadamard(matmul(ls, y.map.right, false, true), matmul(rs, y.map.left, false, true));
  for (size_t i = 0; i < c.data.size(); ++i) c.data[i] += cross.data[i];
  // The rank-one terms: (D_x p_x)(D_y p_y)ᵀ − 2 (D_x m_x)(D_y m_y)ᵀ, p = diag(LΣR ᵀ), m = Lμ ⊙ Rμ.
  const int64_t hx = x.map.units(), hy = y.map.units();
  Matrix64 px(hx, 2), py(hy, 2);
  for (int64_t h = 0; h < hx; ++h) px(h, 0) = x.l_sigma_r[size_t(h)], px(h, 1) = x.l_mean[size_t(h)] * x.r_mean[size_t(h)];
  for (int64_t k = 0; k < hy; ++k)
    py(k, 0) = y.l_sigma_r[size_t(k)], py(k, 1) = -2 * y.l_mean[size_t(k)] * y.r_mean[size_t(k)];
  Matrix64 inner = matmul(px, py, false, true);  // p_x p_yᵀ − 2 m_x m_yᵀ
  for (size_t i = 0; i < inner.data.size(); ++i) inner.data[i] += c.data[i];
  return matmul(matmul(x.map.down, inner), y.map.down, false, true);
}

// Σ'_xy = A_x Σ_xy A_yᵀ + A_x E[z_x y_yᵀ] + E[y_x z_yᵀ] A_yᵀ + E[y_x y_yᵀ].
Matrix64 next_moments(const QuadraticMap& mx, const QuadraticMap& my, const Matrix64& sigma_xy, const Matrix64& sigma_xx,
                      const Matrix64& sigma_yy) {
  Matrix64 out = matmul(matmul(mx.linear, sigma_xy), my.linear, false, true);
  if (mx.units() == 0 && my.units() == 0) return out;
  const Legs lx = legs_of(mx, sigma_xx), ly = legs_of(my, sigma_yy);
  const Matrix64 zy = matmul(mx.linear, state_times_output(sigma_xy, columns(sigma_xx, 0, 1), ly));
  const Matrix64 yz = matmul(state_times_output(transpose(sigma_xy), columns(sigma_yy, 0, 1), lx), my.linear, true, true);
  const Matrix64 yy = output_times_output(sigma_xy, lx, ly);
  for (size_t i = 0; i < out.data.size(); ++i) out.data[i] += zy.data[i] + yz.data[i] + yy.data[i];
  return out;
}

const char* kind_name(PolynomialStep::Kind k) {
  switch (k) {
    case PolynomialStep::Kind::Linear: return "linear";
    case PolynomialStep::Kind::Bilinear: return "bilinear";
    case PolynomialStep::Kind::Attention: return "bilinear attention";
  }
  return "?";
}

double trace_without_constant(const Matrix64& m) {
  double t = 0;
  for (int64_t i = 1; i < m.rows; ++i) t += m(i, i);
  return t;
}

// Σ'_xy after one layer of each network, from Σ_xy and each network's own moments before it
// (x reads wx features per position, y reads wy).
Matrix64 layer_moments(const PolynomialStep& sx, const PolynomialStep& sy, int64_t T, int64_t wx, int64_t wy,
                       const Matrix64& xy, const Matrix64& xx, const Matrix64& yy) {
  if (sx.kind == PolynomialStep::Kind::Attention) {
    check(plain_attention(sx) && plain_attention(sy), "second-moment recursion: attention '", sx.name,
          "' has QK biases or rotary positions, which the recursion does not take");
    return attention_next_moments(sx, sy, T, xy, xx, yy);
  }
  return next_moments(lower(sx, T, wx), lower(sy, T, wy), xy, xx, yy);
}

}  // namespace

namespace {

// E[x̃ x̃ᵀ] for x̃ = (1, x), x ~ N(0, input_std²·I).
Matrix64 input_moments(int64_t n, double input_std) {
  check(input_std > 0 && std::isfinite(input_std), "tensor similarity: the input's standard deviation must be positive, got ",
        input_std);
  Matrix64 m(n, n);
  m(0, 0) = 1.0;
  for (int64_t i = 1; i < n; ++i) m(i, i) = input_std * input_std;
  return m;
}

}  // namespace

MomentTrace self_moments(const PolynomialView& v, double input_std) {
  MomentTrace trace{v.arch, input_std, {input_moments(1 + v.positions * v.input_dim, input_std)}};
  int64_t width = v.input_dim;
  for (size_t i = 0; i < v.steps.size(); ++i) {
    const Matrix64& s = trace.sigma.back();
    trace.sigma.push_back(layer_moments(v.steps[i], v.steps[i], v.positions, width, width, s, s, s));
    check(std::isfinite(trace_without_constant(trace.sigma.back())), "tensor similarity: ", v.arch,
          "'s second moments overflow after layer '", v.steps[i].name, "'");
    width = v.width_after(i);
  }
  return trace;
}

DeepSimilarity deep_similarity(const PolynomialView& a, const PolynomialView& b, double input_std) {
  return deep_similarity(a, b, self_moments(a, input_std), self_moments(b, input_std));
}

DeepSimilarity deep_similarity(const PolynomialView& a, const PolynomialView& b, const MomentTrace& ta,
                               const MomentTrace& tb) {
  check(a.input_dim == b.input_dim && a.positions == b.positions, "tensor similarity: ", a.arch, " reads ",
        a.positions, "×", a.input_dim, " inputs and ", b.arch, " reads ", b.positions, "×", b.input_dim);
  check(a.steps.size() == b.steps.size(), "tensor similarity: ", a.arch, " has ", a.steps.size(), " layers and ",
        b.arch, " has ", b.steps.size(), "; the recursion compares networks layer by layer");
  check(a.output_dim() == b.output_dim(), "tensor similarity: outputs of ", a.output_dim(), " and ", b.output_dim(),
        " values cannot be compared");
  check(ta.sigma.size() == a.steps.size() + 1 && tb.sigma.size() == b.steps.size() + 1 && ta.input_std == tb.input_std,
        "tensor similarity: moment traces that do not belong to these networks");
  const int64_t T = a.positions;
  Matrix64 ab = input_moments(1 + T * a.input_dim, ta.input_std);
  int64_t wa = a.input_dim, wb = b.input_dim;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    const PolynomialStep &sa = a.steps[i], &sb = b.steps[i];
    check(sa.kind == sb.kind && sa.residual == sb.residual && sa.heads == sb.heads, "tensor similarity: layer ", i,
          " is ", kind_name(sa.kind), " '", sa.name, "' in one network and ", kind_name(sb.kind), " '", sb.name,
          "' in the other");
    ab = layer_moments(sa, sb, T, wa, wb, ab, ta.sigma[i], tb.sigma[i]);
    wa = a.width_after(i), wb = b.width_after(i);
  }
  const Matrix64 &aa = ta.sigma.back(), &bb = tb.sigma.back();
  DeepSimilarity r;
  r.inner_ab = trace_without_constant(ab);
  r.inner_aa = trace_without_constant(aa);
  r.inner_bb = trace_without_constant(bb);
  r.similarity = r.inner_ab / std::sqrt(r.inner_aa * r.inner_bb);
  const int64_t outputs = a.output_dim();
  for (int64_t o = 0; o < outputs; ++o) {
    double xy = 0, xx = 0, yy = 0;
    for (int64_t t = 0; t < T; ++t) {
      const int64_t i = 1 + t * outputs + o;
      xy += ab(i, i), xx += aa(i, i), yy += bb(i, i);
    }
    r.slices.push_back(xy / std::sqrt(xx * yy));
  }
  return r;
}

DeepSimilarity monte_carlo_similarity(const PolynomialView& a, const PolynomialView& b, int64_t samples, uint64_t seed,
                                      double input_std) {
  const MonteCarloSimilarity mc = monte_carlo_estimate(a, b, samples, seed, input_std);
  DeepSimilarity r;
  r.similarity = mc.similarity;
  r.inner_ab = mc.inner_ab, r.inner_aa = mc.inner_aa, r.inner_bb = mc.inner_bb;
  r.slices = mc.slices;
  return r;
}

}  // namespace adjoint
