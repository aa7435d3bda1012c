#include "analysis/second_moment.h"

#include <cmath>

#include "engine/error.h"
#include "engine/matrix64.h"
#include "engine/random.h"

namespace adjoint {

namespace {

// One side of the comparison at one step: the layer and the width it reads.
struct Side {
  const PolynomialStep& step;
  int64_t width;  // features per position before the step
};

// Index of the constant coordinate followed by position t's features, in a state of `width`
// features per position: h̃_t = (1, h_t) as rows of z.
std::vector<int64_t> position_coordinates(int64_t t, int64_t width) {
  std::vector<int64_t> idx{0};
  for (int64_t i = 0; i < width; ++i) idx.push_back(1 + t * width + i);
  return idx;
}

Matrix64 gather(const Matrix64& m, const std::vector<int64_t>& rows, const std::vector<int64_t>& cols) {
  Matrix64 out(int64_t(rows.size()), int64_t(cols.size()));
  for (size_t r = 0; r < rows.size(); ++r)
    for (size_t c = 0; c < cols.size(); ++c) out(int64_t(r), int64_t(c)) = m(rows[r], cols[c]);
  return out;
}

std::vector<int64_t> all_coordinates(int64_t n) {
  std::vector<int64_t> idx(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) idx[size_t(i)] = i;
  return idx;
}

// W̃: the linear layer on the whole state, (1 + T·out) × (1 + T·in), keeping the constant.
Matrix64 lifted_linear(const PolynomialStep& s, int64_t T) {
  const Matrix64 w = to_matrix64(s.weight);
  const Matrix64 b = s.bias.defined() ? to_matrix64(s.bias) : Matrix64();
  Matrix64 lifted(1 + T * w.rows, 1 + T * w.cols);
  lifted(0, 0) = 1.0;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < w.rows; ++o) {
      if (s.bias.defined()) lifted(1 + t * w.rows + o, 0) = b(b.rows == 1 ? 0 : t, o);
      for (int64_t i = 0; i < w.cols; ++i) lifted(1 + t * w.rows + o, 1 + t * w.cols + i) = w(o, i);
    }
  return lifted;
}

// What the Isserlis sums need of one bilinear layer at one position t, under moments Σ_xx:
// its factors, D, and the per-unit vectors Lμ, Rμ and diag(L Σ R ᵀ).
struct BilinearLegs {
  Matrix64 left, right, down;
  std::vector<std::vector<double>> l_mean, r_mean, l_sigma_r;  // [t][h]
};

BilinearLegs bilinear_legs(const Side& x, const Matrix64& sigma_xx, int64_t T) {
  BilinearLegs legs{to_matrix64(x.step.left), to_matrix64(x.step.right),
                    x.step.down.defined() ? to_matrix64(x.step.down) : Matrix64::identity(x.step.left.size(0)), {}, {}, {}};
  const int64_t H = legs.left.rows;
  for (int64_t t = 0; t < T; ++t) {
    const std::vector<int64_t> idx = position_coordinates(t, x.width);
    const Matrix64 mean = gather(sigma_xx, idx, {0});  // E[h̃_t], the constant column
    const Matrix64 lm = matmul(legs.left, mean), rm = matmul(legs.right, mean);
    const Matrix64 lsr = matmul(matmul(legs.left, gather(sigma_xx, idx, idx)), legs.right, false, true);
    std::vector<double> l(static_cast<size_t>(H)), r(l), d(l);
    for (int64_t h = 0; h < H; ++h) l[size_t(h)] = lm(h, 0), r[size_t(h)] = rm(h, 0), d[size_t(h)] = lsr(h, h);
    legs.l_mean.push_back(l), legs.r_mean.push_back(r), legs.l_sigma_r.push_back(d);
  }
  return legs;
}

// E[z_x y_yᵀ] for y = D((L h̃_t) ⊙ (R h̃_t)) of side y at position t: three legs,
//   E[w1 w2 w3] = M12 m3 + M13 m2 + M23 m1 − 2 m1 m2 m3.
Matrix64 state_times_output(const Matrix64& sigma_xy, const Matrix64& mean_x, const BilinearLegs& y, int64_t t,
                            int64_t width_y) {
  const Matrix64 s = gather(sigma_xy, all_coordinates(sigma_xy.rows), position_coordinates(t, width_y));
  const Matrix64 sl = matmul(s, y.left, false, true), sr = matmul(s, y.right, false, true);  // (n_x, H)
  Matrix64 x(sl.rows, sl.cols);
  for (int64_t i = 0; i < x.rows; ++i)
    for (int64_t h = 0; h < x.cols; ++h) {
      const double lm = y.l_mean[size_t(t)][size_t(h)], rm = y.r_mean[size_t(t)][size_t(h)];
      x(i, h) = sl(i, h) * rm + sr(i, h) * lm + mean_x(i, 0) * (y.l_sigma_r[size_t(t)][size_t(h)] - 2 * lm * rm);
    }
  return matmul(x, y.down, false, true);
}

// E[y_x,t y_y,uᵀ]: four legs, E = M13 M24 + M14 M23 + M12 M34 − 2 m1 m2 m3 m4.
Matrix64 output_times_output(const Matrix64& sigma_xy, const BilinearLegs& x, const BilinearLegs& y, int64_t t,
                             int64_t u, int64_t width_x, int64_t width_y) {
  const Matrix64 s = gather(sigma_xy, position_coordinates(t, width_x), position_coordinates(u, width_y));
  const Matrix64 ls = matmul(x.left, s), rs = matmul(x.right, s);
  Matrix64 c = hadamard(matmul(ls, y.left, false, true), matmul(rs, y.right, false, true));
  const Matrix64 cross = hadamard(matmul(ls, y.right, false, true), matmul(rs, y.left, false, true));
  for (size_t i = 0; i < c.data.size(); ++i) c.data[i] += cross.data[i];
  Matrix64 out = matmul(matmul(x.down, c), y.down, false, true);
  std::vector<double> px(static_cast<size_t>(x.left.rows)), py(static_cast<size_t>(y.left.rows)), mx(px), my(py);
  for (size_t h = 0; h < px.size(); ++h)
    px[h] = x.l_sigma_r[size_t(t)][h], mx[h] = x.l_mean[size_t(t)][h] * x.r_mean[size_t(t)][h];
  for (size_t k = 0; k < py.size(); ++k)
    py[k] = y.l_sigma_r[size_t(u)][k], my[k] = y.l_mean[size_t(u)][k] * y.r_mean[size_t(u)][k];
  for (int64_t o = 0; o < out.rows; ++o)
    for (int64_t p = 0; p < out.cols; ++p) {
      double dp = 0, dm = 0, ep = 0, em = 0;
      for (size_t h = 0; h < px.size(); ++h) dp += x.down(o, int64_t(h)) * px[h], dm += x.down(o, int64_t(h)) * mx[h];
      for (size_t k = 0; k < py.size(); ++k) ep += y.down(p, int64_t(k)) * py[k], em += y.down(p, int64_t(k)) * my[k];
      out(o, p) += dp * ep - 2 * dm * em;
    }
  return out;
}

// Σ'_xy after a bilinear step on both sides: z' = keep(z) + s·(0, y_1, ..., y_T), where keep
// is the identity for a residual layer and keeps only the constant coordinate otherwise.
Matrix64 bilinear_cross(const Side& x, const Side& y, const Matrix64& sigma_xy, const Matrix64& sigma_xx,
                        const Matrix64& sigma_yy, int64_t T) {
  const BilinearLegs lx = bilinear_legs(x, sigma_xx, T), ly = bilinear_legs(y, sigma_yy, T);
  const int64_t ox = lx.down.rows, oy = ly.down.rows;
  const double sx = x.step.residual ? x.step.scale : 1.0, sy = y.step.residual ? y.step.scale : 1.0;
  const int64_t nx = 1 + T * ox, ny = 1 + T * oy;
  // keep(z_x)·keep(z_y)ᵀ: all of Σ_xy where both layers are residual, else its constant row or column.
  const int64_t keep_x = x.step.residual ? nx : 1, keep_y = y.step.residual ? ny : 1;
  Matrix64 out(nx, ny);
  for (int64_t i = 0; i < keep_x; ++i)
    for (int64_t j = 0; j < keep_y; ++j) out(i, j) = sigma_xy(i, j);
  const Matrix64 mean_x = gather(sigma_xx, all_coordinates(sigma_xx.rows), {0});
  const Matrix64 mean_y = gather(sigma_yy, all_coordinates(sigma_yy.rows), {0});
  const Matrix64 sigma_yx = transpose(sigma_xy);
  for (int64_t u = 0; u < T; ++u) {
    // keep(z_x) · s_y y_uᵀ: rows of keep(z_x) are all of z_x (residual) or its constant.
    const Matrix64 zy = state_times_output(sigma_xy, mean_x, ly, u, y.width);  // (n_x, oy)
    for (int64_t i = 0; i < keep_x; ++i)
      for (int64_t p = 0; p < oy; ++p) out(i, 1 + u * oy + p) += sy * zy(i, p);
  }
  for (int64_t t = 0; t < T; ++t) {
    const Matrix64 yz = state_times_output(sigma_yx, mean_y, lx, t, x.width);  // (n_y, ox)
    for (int64_t j = 0; j < keep_y; ++j)
      for (int64_t o = 0; o < ox; ++o) out(1 + t * ox + o, j) += sx * yz(j, o);
    for (int64_t u = 0; u < T; ++u) {
      const Matrix64 yy = output_times_output(sigma_xy, lx, ly, t, u, x.width, y.width);
      for (int64_t o = 0; o < ox; ++o)
        for (int64_t p = 0; p < oy; ++p) out(1 + t * ox + o, 1 + u * oy + p) += sx * sy * yy(o, p);
    }
  }
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

}  // namespace

DeepSimilarity deep_similarity(const PolynomialView& a, const PolynomialView& b) {
  check(a.input_dim == b.input_dim && a.positions == b.positions, "tensor similarity: ", a.arch, " reads ",
        a.positions, "×", a.input_dim, " inputs and ", b.arch, " reads ", b.positions, "×", b.input_dim);
  check(a.steps.size() == b.steps.size(), "tensor similarity: ", a.arch, " has ", a.steps.size(), " layers and ",
        b.arch, " has ", b.steps.size(), "; the recursion compares networks layer by layer");
  check(a.output_dim() == b.output_dim(), "tensor similarity: outputs of ", a.output_dim(), " and ", b.output_dim(),
        " values cannot be compared");
  const int64_t T = a.positions;
  const int64_t n0 = 1 + T * a.input_dim;
  Matrix64 aa = Matrix64::identity(n0), ab = aa, bb = aa;
  int64_t wa = a.input_dim, wb = b.input_dim;
  for (size_t i = 0; i < a.steps.size(); ++i) {
    const PolynomialStep &sa = a.steps[i], &sb = b.steps[i];
    check(sa.kind == sb.kind && sa.residual == sb.residual, "tensor similarity: layer ", i, " is ", kind_name(sa.kind),
          " '", sa.name, "' in one network and ", kind_name(sb.kind), " '", sb.name, "' in the other");
    if (sa.kind == PolynomialStep::Kind::Attention)
      throw Error(cat("tensor similarity: the second-moment recursion does not handle bilinear attention yet ('",
                      sa.name, "'); compare the models by --monte-carlo instead"));
    if (sa.kind == PolynomialStep::Kind::Linear) {
      const Matrix64 la = lifted_linear(sa, T), lb = lifted_linear(sb, T);
      aa = matmul(matmul(la, aa), la, false, true);
      ab = matmul(matmul(la, ab), lb, false, true);
      bb = matmul(matmul(lb, bb), lb, false, true);
    } else {
      const Side xa{sa, wa}, xb{sb, wb};
      Matrix64 next_aa = bilinear_cross(xa, xa, aa, aa, aa, T);
      Matrix64 next_ab = bilinear_cross(xa, xb, ab, aa, bb, T);
      Matrix64 next_bb = bilinear_cross(xb, xb, bb, bb, bb, T);
      aa = std::move(next_aa), ab = std::move(next_ab), bb = std::move(next_bb);
    }
    wa = a.width_after(i), wb = b.width_after(i);
    check(std::isfinite(trace_without_constant(aa)) && std::isfinite(trace_without_constant(bb)),
          "tensor similarity: the second moments overflow after layer '", sa.name, "'");
  }
  DeepSimilarity r;
  r.inner_ab = trace_without_constant(ab);
  r.inner_aa = trace_without_constant(aa);
  r.inner_bb = trace_without_constant(bb);
  r.similarity = r.inner_ab / std::sqrt(r.inner_aa * r.inner_bb);
  return r;
}

DeepSimilarity monte_carlo_similarity(const PolynomialView& a, const PolynomialView& b, int64_t samples, uint64_t seed) {
  check(a.input_dim == b.input_dim && a.positions == b.positions && a.output_dim() == b.output_dim(),
        "monte carlo similarity: the networks' input or output sizes differ");
  Generator gen(seed);
  const int64_t per = a.positions * a.input_dim, chunk = 4096;
  DeepSimilarity r;
  for (int64_t done = 0; done < samples; done += chunk) {
    const int64_t n = std::min(chunk, samples - done);
    const std::vector<float> draw = normal({n, per}, 0.0f, 1.0f, gen).to_vector();
    const std::vector<double> x(draw.begin(), draw.end());
    const std::vector<double> fa = evaluate_polynomial(a, x, n), fb = evaluate_polynomial(b, x, n);
    for (size_t i = 0; i < fa.size(); ++i)
      r.inner_ab += fa[i] * fb[i], r.inner_aa += fa[i] * fa[i], r.inner_bb += fb[i] * fb[i];
  }
  r.inner_ab /= double(samples), r.inner_aa /= double(samples), r.inner_bb /= double(samples);
  r.similarity = r.inner_ab / std::sqrt(r.inner_aa * r.inner_bb);
  return r;
}

}  // namespace adjoint
