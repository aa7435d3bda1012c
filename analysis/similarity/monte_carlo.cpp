#include "analysis/similarity/monte_carlo.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>

#include "analysis/similarity/polynomial_moments.h"
#include "analysis/similarity/radial_quadrature.h"
#include "engine/error.h"
#include "engine/matrix64.h"
#include "engine/random.h"

namespace adjoint {

namespace {

// The smallest and largest of a series.
struct Extremes {
  double low = INFINITY, high = -INFINITY;
  void add(double x) { low = std::min(low, x), high = std::max(high, x); }
};

// Running sums of the three per-sample products and of their pairwise products.
struct CosineSums {
  double ab = 0, aa = 0, bb = 0, ab_ab = 0, aa_aa = 0, bb_bb = 0, ab_aa = 0, ab_bb = 0, aa_bb = 0;
  Extremes ab_range, aa_range, bb_range;
  void add(double x, double y, double z) {
    ab += x, aa += y, bb += z;
    ab_ab += x * x, aa_aa += y * y, bb_bb += z * z, ab_aa += x * y, ab_bb += x * z, aa_bb += y * z;
    ab_range.add(x), aa_range.add(y), bb_range.add(z);
  }
  // The largest draw's share of the sum of squared deviations from the mean, the largest over
  // the three products: about 2·ln(N)/N for draws with light tails, and a sizeable fraction,
  // however many draws, when a few huge draws carry the variance (the sample variance then
  // understates the error).
  double tail_share(int64_t n) const {
    auto share = [n](double sum, double sum_sq, const Extremes& e) {
      const double N = double(n), mean = sum / N, squares = sum_sq - N * mean * mean;
      const double largest = std::max((e.high - mean) * (e.high - mean), (e.low - mean) * (e.low - mean));
      return squares > 0 ? std::min(largest / squares, 1.0) : 0.0;
    };
    return std::max({share(ab, ab_ab, ab_range), share(aa, aa_aa, aa_range), share(bb, bb_bb, bb_range)});
  }
  // The cosine mean(ab)/sqrt(mean(aa)·mean(bb)) and its delta-method standard error.
  std::pair<double, double> cosine(int64_t n) const {
    const double N = double(n), x = ab / N, y = aa / N, z = bb / N;
    const double c = x / std::sqrt(y * z);
    const double gx = 1 / std::sqrt(y * z), gy = -c / (2 * y), gz = -c / (2 * z);
    auto cov = [&](double sum_uv, double u, double v) { return (sum_uv / N - u * v) * N / (N - 1); };
    const double var = gx * gx * cov(ab_ab, x, x) + gy * gy * cov(aa_aa, y, y) + gz * gz * cov(bb_bb, z, z) +
                       2 * gx * gy * cov(ab_aa, x, y) + 2 * gx * gz * cov(ab_bb, x, z) + 2 * gy * gz * cov(aa_bb, y, z);
    return {c, std::sqrt(std::max(var, 0.0) / N)};
  }
  // The standard error of one of the three means.
  double mean_se(double sum, double sum_sq, int64_t n) const {
    const double N = double(n), m = sum / N;
    return std::sqrt(std::max(sum_sq / N - m * m, 0.0) / (N - 1));
  }
};

void check_views(const PolynomialView& a, const PolynomialView& b, const PolynomialView* reference, double input_std) {
  check(a.input_dim == b.input_dim && a.positions == b.positions && a.output_dim() == b.output_dim(),
        "monte carlo similarity: ", a.arch, " and ", b.arch, " differ in their input or output sizes");
  check(!reference || (reference->input_dim == a.input_dim && reference->positions == a.positions &&
                       reference->output_dim() == a.output_dim()),
        "monte carlo similarity: the reference differs from the model in its input or output sizes");
  check(input_std > 0 && std::isfinite(input_std), "monte carlo similarity: the input's standard deviation must be positive, got ",
        input_std);
}

// n inputs x ~ N(0, input_std²·I), as rows.
std::vector<double> draw_inputs(const PolynomialView& v, int64_t n, double input_std, Generator& gen) {
  const std::vector<float> draw = normal({n, v.positions * v.input_dim}, 0.0f, float(input_std), gen).to_vector();
  return std::vector<double>(draw.begin(), draw.end());
}

// a − reference on the inputs (reference optional), (n, T·outputs).
std::vector<double> outputs(const PolynomialView& a, const PolynomialView* reference, const std::vector<double>& x, int64_t n) {
  std::vector<double> f = evaluate_polynomial(a, x, n);
  if (reference) {
    const std::vector<double> fr = evaluate_polynomial(*reference, x, n);
    for (size_t i = 0; i < f.size(); ++i) f[i] -= fr[i];
  }
  return f;
}

// Per input row: f_a·f_b, |f_a|², |f_b|² summed over every output coordinate.
struct Products {
  std::vector<double> ab, aa, bb;
};
Products products(const std::vector<double>& fa, const std::vector<double>& fb, int64_t n) {
  const size_t per = fa.size() / size_t(n);
  Products p{std::vector<double>(size_t(n)), std::vector<double>(size_t(n)), std::vector<double>(size_t(n))};
  for (size_t s = 0; s < size_t(n); ++s)
    for (size_t k = s * per; k < (s + 1) * per; ++k)
      p.ab[s] += fa[k] * fb[k], p.aa[s] += fa[k] * fa[k], p.bb[s] += fb[k] * fb[k];
  return p;
}

// A draw is `weights.size()` consecutive input rows averaged with those weights: one row of
// weight 1 when sampling plainly, a direction's points on the radial rule otherwise.
Products per_draw(const Products& rows, const std::vector<double>& weights) {
  const size_t k = weights.size(), draws = rows.ab.size() / k;
  Products d{std::vector<double>(draws), std::vector<double>(draws), std::vector<double>(draws)};
  for (size_t s = 0; s < draws; ++s)
    for (size_t i = 0; i < k; ++i) {
      const size_t row = s * k + i;
      d.ab[s] += weights[i] * rows.ab[row], d.aa[s] += weights[i] * rows.aa[row], d.bb[s] += weights[i] * rows.bb[row];
    }
  return d;
}

// The per-class sums of one batch's draws into the slices' running sums.
void add_slices(const std::vector<double>& fa, const std::vector<double>& fb, int64_t draws,
                const std::vector<double>& weights, int64_t T, int64_t classes, std::vector<CosineSums>& slice) {
  const size_t C = size_t(classes), k = weights.size();
  std::vector<double> ab(C), aa(C), bb(C);
  for (int64_t s = 0; s < draws; ++s) {
    std::fill(ab.begin(), ab.end(), 0.0), std::fill(aa.begin(), aa.end(), 0.0), std::fill(bb.begin(), bb.end(), 0.0);
    for (size_t i = 0; i < k; ++i)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < classes; ++o) {
          const size_t j = size_t(((s * int64_t(k) + int64_t(i)) * T + t) * classes + o);
          const double w = weights[i];
          ab[size_t(o)] += w * fa[j] * fb[j], aa[size_t(o)] += w * fa[j] * fa[j], bb[size_t(o)] += w * fb[j] * fb[j];
        }
    for (size_t o = 0; o < C; ++o) slice[o].add(ab[o], aa[o], bb[o]);
  }
}

// The view with its residual branches dropped: the linear map from input to output. Null when
// a step is neither linear nor residual (the output has no direct path).
std::optional<PolynomialView> direct_path(const PolynomialView& v) {
  PolynomialView d = v;
  d.steps.clear();
  for (const PolynomialStep& s : v.steps) {
    if (s.kind == PolynomialStep::Kind::Linear) d.steps.push_back(s);
    else if (!s.residual) return std::nullopt;
  }
  return d;
}

// ℓ = c + M x read off at x = 0 and at every basis vector: rows (c, M's columns), (n + 1, outputs).
std::vector<double> affine_rows(const PolynomialView& d, const PolynomialView* dr) {
  const int64_t n = d.positions * d.input_dim;
  std::vector<double> x(size_t((n + 1) * n), 0.0);
  for (int64_t i = 0; i < n; ++i) x[size_t((i + 1) * n + i)] = 1;
  std::vector<double> rows = outputs(d, dr, x, n + 1);
  const size_t out = rows.size() / size_t(n + 1);
  for (size_t r = 1; r <= size_t(n); ++r)
    for (size_t k = 0; k < out; ++k) rows[r * out + k] -= rows[k];
  return rows;
}

// E[ℓ_a·ℓ_b] summed over outputs: c_a·c_b + σ²·Σ_i M_a[:, i]·M_b[:, i].
double direct_inner(const std::vector<double>& ra, const std::vector<double>& rb, int64_t n, double input_std) {
  const size_t out = ra.size() / size_t(n + 1);
  double constant = 0, linear = 0;
  for (size_t k = 0; k < out; ++k) constant += ra[k] * rb[k];
  for (size_t k = out; k < ra.size(); ++k) linear += ra[k] * rb[k];
  return constant + input_std * input_std * linear;
}

// cov(q, g)/var(g) over a batch: the control variate's coefficient (0 when g does not vary).
double coefficient(const std::vector<double>& q, const std::vector<double>& g) {
  const double n = double(q.size());
  double mq = 0, mg = 0;
  for (size_t i = 0; i < q.size(); ++i) mq += q[i] / n, mg += g[i] / n;
  double cov = 0, var = 0;
  for (size_t i = 0; i < q.size(); ++i) cov += (q[i] - mq) * (g[i] - mg), var += (g[i] - mg) * (g[i] - mg);
  return var > 0 ? cov / var : 0.0;
}

MonteCarloSimilarity finish(const CosineSums& total, const std::vector<CosineSums>& slice, int64_t samples) {
  MonteCarloSimilarity r;
  r.samples = samples;
  std::tie(r.similarity, r.similarity_se) = total.cosine(samples);
  const double N = double(samples);
  r.inner_ab = total.ab / N, r.inner_aa = total.aa / N, r.inner_bb = total.bb / N;
  r.inner_ab_se = total.mean_se(total.ab, total.ab_ab, samples);
  r.inner_aa_se = total.mean_se(total.aa, total.aa_aa, samples);
  r.inner_bb_se = total.mean_se(total.bb, total.bb_bb, samples);
  for (const CosineSums& s : slice) {
    const auto [c, se] = s.cosine(samples);
    r.slices.push_back(c), r.slice_se.push_back(se);
  }
  return r;
}

}  // namespace

MonteCarloSimilarity monte_carlo_estimate(const PolynomialView& a, const PolynomialView& b, int64_t samples,
                                          uint64_t seed, double input_std, const PolynomialView* reference) {
  check_views(a, b, reference, input_std);
  check(samples >= 2, "monte carlo similarity: needs at least 2 samples, got ", samples);
  Generator gen(seed);
  const int64_t T = a.positions, classes = a.output_dim(), chunk = 4096;
  CosineSums total;
  std::vector<CosineSums> slice(static_cast<size_t>(classes));
  for (int64_t done = 0; done < samples; done += chunk) {
    const int64_t n = std::min(chunk, samples - done);
    const std::vector<double> x = draw_inputs(a, n, input_std, gen);
    const std::vector<double> fa = outputs(a, reference, x, n), fb = evaluate_polynomial(b, x, n);
    const Products p = products(fa, fb, n);
    for (int64_t s = 0; s < n; ++s) total.add(p.ab[size_t(s)], p.aa[size_t(s)], p.bb[size_t(s)]);
    add_slices(fa, fb, n, {1.0}, T, classes, slice);
  }
  return finish(total, slice, samples);
}

namespace {

// The view reading y = Qᵀx in place of x: its first (linear) step's weight W becomes W·Q (in
// float, as the weights are held: a change of the function by rounding, far below any
// sampling error).
PolynomialView read_through(PolynomialView v, const Matrix64& basis) {
  const Matrix64 w = matmul(to_matrix64(v.steps.front().weight), basis);
  v.steps.front().weight = Tensor::from_vector({w.rows, w.cols}, std::vector<float>(w.data.begin(), w.data.end()));
  v.input_dim = basis.cols;
  return v;
}

}  // namespace

MonteCarloSimilarity monte_carlo_sized(const PolynomialView& a_in, const PolynomialView& b_in, const MonteCarloPlan& plan,
                                       const PolynomialView* reference_in) {
  check_views(a_in, b_in, reference_in, plan.input_std);
  // Networks that begin with an embedding read x only through its rows: x ~ N(0, σ²I) is
  // sampled in the span of the rows (Qᵀx ~ N(0, σ²I_r), r at most the widths summed), the same
  // distribution of every output, at a fraction of the draws.
  std::vector<const PolynomialView*> views = {&a_in, &b_in};
  if (reference_in) views.push_back(reference_in);
  const Matrix64 basis = plan.embedding_span ? shared_input_basis(views) : Matrix64();
  const PolynomialView a = basis.cols ? read_through(a_in, basis) : a_in, b = basis.cols ? read_through(b_in, basis) : b_in;
  const PolynomialView read_reference = basis.cols && reference_in ? read_through(*reference_in, basis) : PolynomialView{};
  const PolynomialView* reference = reference_in ? (basis.cols ? &read_reference : reference_in) : nullptr;
  check(plan.tolerance > 0 && std::isfinite(plan.tolerance), "monte carlo similarity: the tolerance must be positive, got ",
        plan.tolerance);
  // The draws: a direction and the radial rule's points along it, or one input each.
  const int64_t features = a.positions * a.input_dim;
  const int degree = std::max(polynomial_degree(a), reference ? polynomial_degree(*reference) : 0) + polynomial_degree(b);
  const RadialRule rule = plan.radial ? radial_rule(features, radial_points_for(degree)) : RadialRule{};
  const std::vector<double> weights = plan.radial ? rule.weights : std::vector<double>{1.0};
  const int64_t per_draw_rows = int64_t(weights.size());
  Generator gen(plan.seed);
  auto draw = [&](int64_t draws) {
    if (!plan.radial) return draw_inputs(a, draws, plan.input_std, gen);
    std::vector<double> u = draw_inputs(a, draws, 1.0, gen), x(size_t(draws * per_draw_rows * features));
    for (int64_t s = 0; s < draws; ++s) {
      const double* us = u.data() + s * features;
      double norm = 0;
      for (int64_t f = 0; f < features; ++f) norm += us[f] * us[f];
      norm = std::sqrt(norm);
      for (int64_t i = 0; i < per_draw_rows; ++i) {
        const double scale = plan.input_std * rule.nodes[size_t(i)] / norm;
        double* row = x.data() + (s * per_draw_rows + i) * features;
        for (int64_t f = 0; f < features; ++f) row[f] = scale * us[f];
      }
    }
    return x;
  };
  const int64_t T = a.positions, classes = a.output_dim(), chunk = std::max<int64_t>(4096 / per_draw_rows, 64);
  const int64_t minimum = std::max(2 * chunk, plan.min_draws);
  // The direct paths, when every network has one: the control variate.
  std::optional<PolynomialView> da, db, dr;
  if (plan.control_variate) {
    da = direct_path(a), db = direct_path(b);
    if (reference) dr = direct_path(*reference);
  }
  const bool cv = da && db && (!reference || dr);
  const PolynomialView* dref = cv && reference ? &*dr : nullptr;
  double mean_ab = 0, mean_aa = 0, mean_bb = 0, beta_ab = 0, beta_aa = 0, beta_bb = 0;
  auto direct = [&](const std::vector<double>& x, int64_t rows) {
    const std::vector<double> la = outputs(*da, dref, x, rows), lb = evaluate_polynomial(*db, x, rows);
    return per_draw(products(la, lb, rows), weights);
  };
  const int64_t pilot = cv ? std::max<int64_t>(plan.pilot / per_draw_rows, 16) : 0;
  if (cv) {
    const std::vector<double> ra = affine_rows(*da, dref), rb = affine_rows(*db, nullptr);
    mean_ab = direct_inner(ra, rb, features, plan.input_std), mean_aa = direct_inner(ra, ra, features, plan.input_std),
    mean_bb = direct_inner(rb, rb, features, plan.input_std);
    // The pilot: fits β, then is set aside.
    const int64_t rows = pilot * per_draw_rows;
    const std::vector<double> x = draw(pilot);
    const Products q = per_draw(products(outputs(a, reference, x, rows), evaluate_polynomial(b, x, rows), rows), weights);
    const Products g = direct(x, rows);
    beta_ab = coefficient(q.ab, g.ab), beta_aa = coefficient(q.aa, g.aa), beta_bb = coefficient(q.bb, g.bb);
  }
  CosineSums total;
  std::vector<CosineSums> slice(static_cast<size_t>(classes));
  int64_t done = 0;
  for (;;) {
    const int64_t n = std::min(chunk, plan.max_samples - done), rows = n * per_draw_rows;
    const std::vector<double> x = draw(n);
    const std::vector<double> fa = outputs(a, reference, x, rows), fb = evaluate_polynomial(b, x, rows);
    Products q = per_draw(products(fa, fb, rows), weights);
    if (cv) {
      const Products g = direct(x, rows);
      for (size_t s = 0; s < size_t(n); ++s)
        q.ab[s] -= beta_ab * (g.ab[s] - mean_ab), q.aa[s] -= beta_aa * (g.aa[s] - mean_aa), q.bb[s] -= beta_bb * (g.bb[s] - mean_bb);
    }
    for (size_t s = 0; s < size_t(n); ++s) total.add(q.ab[s], q.aa[s], q.bb[s]);
    add_slices(fa, fb, n, weights, T, classes, slice);
    done += n;
    const double se = total.cosine(done).second;
    check(std::isfinite(se) && std::isfinite(total.aa) && std::isfinite(total.bb), "monte carlo similarity: after ", done,
          " draws the products of ", a.arch, "'s and ", b.arch, "'s outputs are out of range (",
          "outputs this heavy-tailed at input scale ", plan.input_std, " have no usable sample mean; a smaller --input-std, ",
          "e.g. 1/sqrt(vocab) for one-hot tokens)");
    const double ratio = se / plan.tolerance;
    const int64_t needed = std::max(done, int64_t(double(done) * ratio * ratio));
    if (plan.progress) plan.progress(done, std::min(needed, plan.max_samples), se);
    if ((done >= minimum && se <= plan.tolerance) || done >= plan.max_samples) break;
  }
  MonteCarloSimilarity r = finish(total, slice, done);
  r.control_variate = cv;
  r.pilot_samples = pilot;
  r.radial_points = plan.radial ? int(per_draw_rows) : 0;
  r.evaluations = (done + pilot) * per_draw_rows;
  r.tail_share = total.tail_share(done);
  r.reliable = r.tail_share <= plan.tail_share_limit;
  return r;
}

}  // namespace adjoint
