#include "analysis/similarity/monte_carlo.h"

#include <algorithm>
#include <array>
#include <functional>
#include <cmath>
#include <optional>
#include <tuple>

#include "analysis/similarity/pareto_tail.h"
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
// weight 1 when sampling plainly, a direction's points on the radial rule otherwise; each draw
// then times its importance weight (`importance`, one a draw; empty: 1).
Products per_draw(const Products& rows, const std::vector<double>& weights, const std::vector<double>& importance = {}) {
  const size_t k = weights.size(), draws = rows.ab.size() / k;
  Products d{std::vector<double>(draws), std::vector<double>(draws), std::vector<double>(draws)};
  for (size_t s = 0; s < draws; ++s) {
    const double iw = importance.empty() ? 1.0 : importance[s];
    for (size_t i = 0; i < k; ++i) {
      const size_t row = s * k + i;
      const double w = iw * weights[i];
      d.ab[s] += w * rows.ab[row], d.aa[s] += w * rows.aa[row], d.bb[s] += w * rows.bb[row];
    }
  }
  return d;
}

// The per-class sums of one batch's draws into the slices' running sums (`importance` as in
// per_draw).
void add_slices(const std::vector<double>& fa, const std::vector<double>& fb, int64_t draws,
                const std::vector<double>& weights, int64_t T, int64_t classes, std::vector<CosineSums>& slice,
                const std::vector<double>& importance = {}) {
  const size_t C = size_t(classes), k = weights.size();
  std::vector<double> ab(C), aa(C), bb(C);
  for (int64_t s = 0; s < draws; ++s) {
    std::fill(ab.begin(), ab.end(), 0.0), std::fill(aa.begin(), aa.end(), 0.0), std::fill(bb.begin(), bb.end(), 0.0);
    for (size_t i = 0; i < k; ++i)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < classes; ++o) {
          const size_t j = size_t(((s * int64_t(k) + int64_t(i)) * T + t) * classes + o);
          const double w = (importance.empty() ? 1.0 : importance[size_t(s)]) * weights[i];
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

// The rows x = σ·r_i·u of the radial rule's points along each of the n directions u (rows of
// `features`), the points of a direction consecutive.
std::vector<double> rows_along(const std::vector<double>& u, int64_t n, int64_t features, const RadialRule& rule,
                               double input_std) {
  const int64_t points = int64_t(rule.nodes.size());
  std::vector<double> rows(size_t(n * points * features));
  for (int64_t s = 0; s < n; ++s)
    for (int64_t i = 0; i < points; ++i) {
      const double scale = input_std * rule.nodes[size_t(i)];
      double* row = rows.data() + (s * points + i) * features;
      for (int64_t f = 0; f < features; ++f) row[f] = scale * u[size_t(s * features + f)];
    }
  return rows;
}

// The draws of a sized estimate: a direction from the proposal (or one input, sampling plainly),
// the rows of the radial rule's points along it, and the draw's importance weight
// uniform/proposal (empty: 1, for uniform directions and plain inputs).
struct Draws {
  std::vector<double> directions, rows, importance;
};
Draws draw_rows(const PolynomialView& a, int64_t draws, const MonteCarloPlan& plan, const RadialRule& rule,
                const DirectionProposal& proposal, Generator& gen) {
  if (!plan.radial) return {{}, draw_inputs(a, draws, plan.input_std, gen), {}};
  Draws d;
  d.directions = proposal.sample(draws, gen);
  if (!proposal.components.empty()) {
    d.importance = proposal.density(d.directions, draws);
    for (double& w : d.importance) w = 1 / w;
  }
  d.rows = rows_along(d.directions, draws, a.positions * a.input_dim, rule, plan.input_std);
  return d;
}

// N times the squared standard error of the cosine: the variance a draw contributes.
double cosine_variance(const CosineSums& total, int64_t n) {
  const double se = total.cosine(n).second;
  return se * se * double(n);
}

// The smaller of the self terms' effective numbers of draws, (Σ x)²/Σ x² over the (positive) draws
// of |f_a|² and of |f_b|².
double self_effective_draws(const Products& all) {
  auto effective = [](const std::vector<double>& x) {
    double sum = 0, squares = 0;
    for (double v : x) sum += v, squares += v * v;
    return squares > 0 ? sum * sum / squares : double(x.size());
  };
  return std::min(effective(all.aa), effective(all.bb));
}

// What every sized run of a pair shares: the views read in the embeddings' span, the radial rule,
// the direct paths of the control variate with their exact means.
struct Setup {
  PolynomialView a, b, reference_view, da, db, dr;
  const PolynomialView* reference = nullptr;
  const PolynomialView* dref = nullptr;
  RadialRule rule;
  std::vector<double> weights;
  int64_t features = 0, per_draw_rows = 1;
  bool cv = false;
  double mean_ab = 0, mean_aa = 0, mean_bb = 0;
};

// One sized run from one proposal: the control variate's β fitted on a pilot of its own draws
// (then set aside), draws until the cosine's standard error reaches the tolerance.
struct SizedRun {
  CosineSums total;
  std::vector<CosineSums> slice;
  // Every draw before the control variate, and (runs with one) after it: its residuals. Per
  // inner product, `controlled` says which of the two the estimate averages (settle_control_variate),
  // and `total` holds their sums.
  Products all, residuals;
  std::array<bool, 3> controlled{};  // ⟨A|B⟩, ⟨A|A⟩, ⟨B|B⟩
  std::vector<double> directions;  // every draw's direction (radial runs)
  std::vector<double> raw_aa, raw_bb;  // every draw's |f_a|² and |f_b|² along its direction, unweighted
  int64_t done = 0, pilot = 0;
};
// One of the three inner products' draws, by index: ⟨A|B⟩, ⟨A|A⟩, ⟨B|B⟩.
const std::vector<double>& term(const Products& p, int t) { return t == 0 ? p.ab : t == 1 ? p.aa : p.bb; }

// What the estimate of inner product t averages: its residuals where it keeps the control variate,
// its raw draws where not.
const std::vector<double>& averaged(const SizedRun& run, int t) {
  return run.controlled[size_t(t)] ? term(run.residuals, t) : term(run.all, t);
}

// The largest Pareto tail shape of what the three estimates average: the tail diagnostic.
double averaged_pareto_shape(const SizedRun& run) {
  double shape = -INFINITY;
  for (int t = 0; t < 3; ++t) shape = std::max(shape, pareto_shape_both_tails(averaged(run, t)));
  return shape;
}

// Per inner product, keep the control variate where the tail diagnostic passes its residuals, and
// fall back to the raw draws where it marks them. Subtracting the direct paths can leave residuals
// whose variance sits in a few draws (a Pareto shape near 1 where the raw draws fit one near 0):
// their sample variance then understates their spread, and the interval built on it under-covers,
// while the raw draws, with the larger but honestly estimated variance, give an interval that holds.
// Read on the whole run at each stop; the sums are rebuilt where the choice changes.
void settle_control_variate(SizedRun& run, bool cv) {
  std::array<bool, 3> keep{};
  const double limit = pareto_shape_limit(run.done);
  for (int t = 0; t < 3; ++t) keep[size_t(t)] = cv && pareto_shape_both_tails(term(run.residuals, t)) <= limit;
  if (keep == run.controlled) return;
  run.controlled = keep;
  run.total = CosineSums();
  const std::vector<double>&ab = averaged(run, 0), &aa = averaged(run, 1), &bb = averaged(run, 2);
  for (size_t i = 0; i < size_t(run.done); ++i) run.total.add(ab[i], aa[i], bb[i]);
}

SizedRun sized_run(const Setup& s, const MonteCarloPlan& plan, const DirectionProposal& proposal, Generator& gen,
                   const std::function<bool(const SizedRun&)>& stop_early = {}) {
  SizedRun run;
  auto direct = [&](const Draws& d, int64_t rows) {
    const std::vector<double> la = outputs(s.da, s.dref, d.rows, rows), lb = evaluate_polynomial(s.db, d.rows, rows);
    return per_draw(products(la, lb, rows), s.weights, d.importance);
  };
  double beta_ab = 0, beta_aa = 0, beta_bb = 0;
  // The control variate serves uniform directions only. Under a proposal the draws are products
  // times weights that span orders of magnitude, and a β fitted on a pilot of a few dozen of them
  // is noise that a single draw can make enormous.
  const bool cv = s.cv && proposal.components.empty();
  run.controlled = {cv, cv, cv};
  run.pilot = cv ? std::max<int64_t>(plan.pilot / s.per_draw_rows, 16) : 0;
  if (cv) {
    const int64_t rows = run.pilot * s.per_draw_rows;
    const Draws d = draw_rows(s.a, run.pilot, plan, s.rule, proposal, gen);
    const Products q = per_draw(products(outputs(s.a, s.reference, d.rows, rows), evaluate_polynomial(s.b, d.rows, rows), rows),
                                s.weights, d.importance);
    const Products g = direct(d, rows);
    beta_ab = coefficient(q.ab, g.ab), beta_aa = coefficient(q.aa, g.aa), beta_bb = coefficient(q.bb, g.bb);
  }
  const int64_t T = s.a.positions, classes = s.a.output_dim(), chunk = std::max<int64_t>(4096 / s.per_draw_rows, 64);
  const int64_t minimum = std::max(2 * chunk, plan.min_draws);
  run.slice.resize(size_t(classes));
  for (;;) {
    const int64_t n = std::min(chunk, plan.max_samples - run.done), rows = n * s.per_draw_rows;
    const Draws d = draw_rows(s.a, n, plan, s.rule, proposal, gen);
    const std::vector<double> fa = outputs(s.a, s.reference, d.rows, rows), fb = evaluate_polynomial(s.b, d.rows, rows);
    const Products raw = per_draw(products(fa, fb, rows), s.weights);
    Products q = per_draw(products(fa, fb, rows), s.weights, d.importance);
    run.all.ab.insert(run.all.ab.end(), q.ab.begin(), q.ab.end()), run.all.aa.insert(run.all.aa.end(), q.aa.begin(), q.aa.end());
    run.all.bb.insert(run.all.bb.end(), q.bb.begin(), q.bb.end());
    if (cv) {
      const Products g = direct(d, rows);
      for (size_t i = 0; i < size_t(n); ++i)
        q.ab[i] -= beta_ab * (g.ab[i] - s.mean_ab), q.aa[i] -= beta_aa * (g.aa[i] - s.mean_aa), q.bb[i] -= beta_bb * (g.bb[i] - s.mean_bb);
      run.residuals.ab.insert(run.residuals.ab.end(), q.ab.begin(), q.ab.end());
      run.residuals.aa.insert(run.residuals.aa.end(), q.aa.begin(), q.aa.end());
      run.residuals.bb.insert(run.residuals.bb.end(), q.bb.begin(), q.bb.end());
    }
    const size_t first = size_t(run.done);
    for (size_t i = 0; i < size_t(n); ++i)
      run.total.add(averaged(run, 0)[first + i], averaged(run, 1)[first + i], averaged(run, 2)[first + i]);
    if (plan.radial) {
      run.directions.insert(run.directions.end(), d.directions.begin(), d.directions.end());
      run.raw_aa.insert(run.raw_aa.end(), raw.aa.begin(), raw.aa.end()), run.raw_bb.insert(run.raw_bb.end(), raw.bb.begin(), raw.bb.end());
    }
    add_slices(fa, fb, n, s.weights, T, classes, run.slice, d.importance);
    run.done += n;
    if (run.done >= minimum || run.done >= plan.max_samples) settle_control_variate(run, cv);
    const double se = run.total.cosine(run.done).second;
    check(std::isfinite(se) && std::isfinite(run.total.aa) && std::isfinite(run.total.bb), "monte carlo similarity: after ", run.done,
          " draws the products of ", s.a.arch, "'s and ", s.b.arch, "'s outputs are out of range (",
          "outputs this heavy-tailed at input scale ", plan.input_std, " have no usable sample mean; a smaller --input-std, ",
          "e.g. 1/sqrt(vocab) for one-hot tokens)");
    // Draws the standard error says are needed (a tolerance of 0: a fixed count, max_samples).
    const double wanted = plan.tolerance > 0 ? double(run.done) * (se / plan.tolerance) * (se / plan.tolerance) : INFINITY;
    const int64_t needed = int64_t(std::clamp(wanted, double(run.done), double(plan.max_samples)));
    if (plan.progress) plan.progress(run.done, needed, se);
    if ((run.done >= minimum && se <= plan.tolerance) || run.done >= plan.max_samples) break;
    if (run.done >= minimum && stop_early && stop_early(run)) break;
  }
  return run;
}

// Student's t quantile at 0.975 for `dof` degrees of freedom, by the Cornish–Fisher expansion
// about the normal quantile z (within 0.002 from 3 degrees of freedom up; 12.7 at 1).
double student_t_975(int dof) {
  if (dof <= 1) return 12.706;
  if (dof == 2) return 4.303;
  const double z = 1.959963984540054, v = double(dof), z3 = z * z * z, z5 = z3 * z * z, z7 = z5 * z * z;
  return z + (z3 + z) / (4 * v) + (5 * z5 + 16 * z3 + 3 * z) / (96 * v * v) + (3 * z7 + 19 * z5 + 17 * z3 - 15 * z) / (384 * v * v * v);
}

// The factor t_{R−1}/z that makes ±1.96 standard errors of a mean of R runs Student's 95% interval.
double t_widening(int runs) { return student_t_975(runs - 1) / 1.959963984540054; }

// The scales E|f_a|² and E|f_b|² of the target |f_a|²/E|f_a|² + |f_b|²/E|f_b|², read off a uniform run.
struct TargetScales {
  double aa = 1, bb = 1;
};
TargetScales target_scales(const SizedRun& run) {
  TargetScales t;
  double aa = 0, bb = 0;
  for (int64_t i = 0; i < run.done; ++i) aa += run.raw_aa[size_t(i)], bb += run.raw_bb[size_t(i)];
  if (aa > 0) t.aa = aa / double(run.done);
  if (bb > 0) t.bb = bb / double(run.done);
  return t;
}

// Along each of the n directions (rows of u), by the radial rule: the target
// h = |f_a|²/E|f_a|² + |f_b|²/E|f_b|², then f_a·f_b, |f_a|², |f_b|² summed over every output,
// then those three for each output feature (summed over positions), 4 + 3·classes values a row.
// Each integrand is at most a constant times h (|f_a·f_b| ≤ (|f_a|² + |f_b|²)/2 by scale).
std::vector<double> direction_integrands(const Setup& s, const MonteCarloPlan& plan, const TargetScales& scales,
                                         const std::vector<double>& u, int64_t n) {
  const std::vector<double> x = rows_along(u, n, s.features, s.rule, plan.input_std);
  const int64_t rows = n * s.per_draw_rows, T = s.a.positions, classes = s.a.output_dim(), k = s.per_draw_rows;
  const std::vector<double> fa = outputs(s.a, s.reference, x, rows), fb = evaluate_polynomial(s.b, x, rows);
  const int64_t width = 4 + 3 * classes;
  std::vector<double> values(size_t(n * width), 0.0);
  for (int64_t d = 0; d < n; ++d) {
    double* row = values.data() + d * width;
    for (int64_t i = 0; i < k; ++i)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < classes; ++o) {
          const size_t j = size_t(((d * k + i) * T + t) * classes + o);
          const double w = s.weights[size_t(i)], ab = w * fa[j] * fb[j], aa = w * fa[j] * fa[j], bb = w * fb[j] * fb[j];
          row[1] += ab, row[2] += aa, row[3] += bb;
          row[4 + 3 * o] += ab, row[5 + 3 * o] += aa, row[6 + 3 * o] += bb;
        }
    row[0] = row[2] / scales.aa + row[3] / scales.bb;
  }
  return values;
}

// The tempered estimate (MonteCarloPlan::tempering): a pilot run sets the schedule, then
// independent runs along it, each an unbiased estimate of every inner product, summed like draws.
struct TemperedEstimate {
  CosineSums total;
  std::vector<CosineSums> slice;
  int replicates = 0, rungs = 0;
  int64_t evaluations = 0;  // directions
  double log_normaliser_spread = 0, acceptance = 0;
};
TemperedEstimate tempered_estimate(const Setup& s, const MonteCarloPlan& plan, const TargetScales& scales, const DirectionProposal& base,
                                   Generator& gen) {
  check(plan.min_replicates >= 2 && plan.max_replicates >= plan.min_replicates,
        "monte carlo similarity: tempering needs min_replicates ≥ 2 and max_replicates ≥ min_replicates, got ",
        plan.min_replicates, " and ", plan.max_replicates);
  const DirectionIntegrands integrands = [&](const std::vector<double>& u, int64_t n) {
    return direction_integrands(s, plan, scales, u, n);
  };
  TemperedEstimate e;
  const TemperingSchedule schedule = tempering_schedule(base, integrands, plan.tempering_plan, gen, &e.evaluations,
                                                        [&](double beta) {
                                                          if (plan.stage_progress) plan.stage_progress("tempering (pilot)", beta);
                                                        });
  e.rungs = int(schedule.betas.size()) - 1;
  const int64_t classes = s.a.output_dim();
  e.slice.resize(size_t(classes));
  std::vector<double> logs;
  int needed = plan.min_replicates;
  for (;;) {
    const int done = e.replicates;
    const TemperedRun run = tempered_run(base, integrands, schedule, plan.tempering_plan, gen, [&](double share) {
      if (plan.stage_progress) plan.stage_progress("tempering", (double(done) + share) / double(needed));
    });
    e.evaluations += run.evaluations, e.acceptance += run.acceptance;
    const std::vector<double>& v = run.integrals;
    e.total.add(v[0], v[1], v[2]);
    for (int64_t o = 0; o < classes; ++o) e.slice[size_t(o)].add(v[size_t(3 + 3 * o)], v[size_t(4 + 3 * o)], v[size_t(5 + 3 * o)]);
    logs.push_back(run.log_normaliser);
    ++e.replicates;
    check(std::isfinite(e.total.ab) && std::isfinite(e.total.aa) && std::isfinite(e.total.bb), "monte carlo similarity: a tempered run of ",
          s.a.arch, " and ", s.b.arch, " gave an inner product out of range");
    if (e.replicates < plan.min_replicates) continue;
    const double se = e.total.cosine(e.replicates).second * t_widening(e.replicates);  // as reported
    if (se <= plan.tolerance || e.replicates >= plan.max_replicates) break;
    const double wanted = double(e.replicates) * (se / plan.tolerance) * (se / plan.tolerance);
    needed = int(std::clamp(std::ceil(wanted), double(e.replicates + 1), double(plan.max_replicates)));
  }
  double mean = 0, squares = 0;
  for (double l : logs) mean += l / double(logs.size());
  for (double l : logs) squares += (l - mean) * (l - mean);
  e.log_normaliser_spread = std::sqrt(squares / double(logs.size() - 1));
  e.acceptance /= double(e.replicates);
  return e;
}

}  // namespace

void PooledEstimates::add(double estimate, double standard_error, double truth) {
  const double error = estimate - truth;
  ++n, sum += error, squares += error * error, claimed += standard_error, claimed_squares += standard_error * standard_error;
  covered += std::abs(error) <= 1.96 * standard_error;
  standardised_squares += (error / standard_error) * (error / standard_error);
}
double PooledEstimates::spread() const {
  const double mean = sum / n;
  return std::sqrt(std::max(squares - n * mean * mean, 0.0) / (n - 1));
}
double PooledEstimates::z() const { return (sum / n) / (std::sqrt(claimed_squares) / n); }
double PooledEstimates::t() const { return (sum / n) / (spread() / std::sqrt(double(n))); }
double PooledEstimates::spread_ratio() const { return spread() / (claimed / n); }
double PooledEstimates::standardised_spread() const { return std::sqrt(standardised_squares / n); }

MonteCarloPlan fixed_budget_plan(const PolynomialView& a, const PolynomialView& b, int64_t evaluations, uint64_t seed, double input_std,
                                 const PolynomialView* reference) {
  const int degree = std::max(polynomial_degree(a), reference ? polynomial_degree(*reference) : 0) + polynomial_degree(b);
  MonteCarloPlan plan;
  plan.seed = seed, plan.input_std = input_std, plan.tolerance = 1e-300, plan.min_draws = 0;
  plan.max_samples = std::max<int64_t>(evaluations / radial_points_for(degree), 2);
  plan.tempering = false;
  return plan;
}

bool prefer_proposal(const PilotSummary& uniform, const PilotSummary& proposal) {
  const double limit = pareto_shape_limit(std::min(uniform.draws, proposal.draws));
  const bool uniform_marked = !(uniform.pareto_shape <= limit), proposal_marked = !(proposal.pareto_shape <= limit);
  if (uniform_marked != proposal_marked) return uniform_marked;
  if (uniform_marked) return proposal.pareto_shape < uniform.pareto_shape;
  return proposal.cosine_variance < uniform.cosine_variance;
}

MonteCarloSimilarity monte_carlo_sized(const PolynomialView& a_in, const PolynomialView& b_in, const MonteCarloPlan& plan,
                                       const PolynomialView* reference_in) {
  check_views(a_in, b_in, reference_in, plan.input_std);
  check(plan.tolerance > 0 && std::isfinite(plan.tolerance), "monte carlo similarity: the tolerance must be positive, got ",
        plan.tolerance);
  Setup s;
  // Networks that begin with an embedding read x only through its rows: x ~ N(0, σ²I) is
  // sampled in the span of the rows (Qᵀx ~ N(0, σ²I_r), r at most the widths summed), the same
  // distribution of every output, at a fraction of the draws.
  std::vector<const PolynomialView*> views = {&a_in, &b_in};
  if (reference_in) views.push_back(reference_in);
  const Matrix64 basis = plan.embedding_span ? shared_input_basis(views) : Matrix64();
  s.a = basis.cols ? read_through(a_in, basis) : a_in, s.b = basis.cols ? read_through(b_in, basis) : b_in;
  if (reference_in) s.reference_view = basis.cols ? read_through(*reference_in, basis) : *reference_in, s.reference = &s.reference_view;
  // The draws: a direction and the radial rule's points along it, or one input each.
  s.features = s.a.positions * s.a.input_dim;
  const int degree = std::max(polynomial_degree(s.a), s.reference ? polynomial_degree(*s.reference) : 0) + polynomial_degree(s.b);
  if (plan.radial) s.rule = radial_rule(s.features, radial_points_for(degree));
  s.weights = plan.radial ? s.rule.weights : std::vector<double>{1.0};
  s.per_draw_rows = int64_t(s.weights.size());
  // The direct paths, when every network has one: the control variate.
  if (plan.control_variate) {
    const std::optional<PolynomialView> da = direct_path(s.a), db = direct_path(s.b),
                                        dr = s.reference ? direct_path(*s.reference) : std::nullopt;
    s.cv = da && db && (!s.reference || dr);
    if (s.cv) {
      s.da = *da, s.db = *db;
      if (s.reference) s.dr = *dr, s.dref = &s.dr;
      const std::vector<double> ra = affine_rows(s.da, s.dref), rb = affine_rows(s.db, nullptr);
      s.mean_ab = direct_inner(ra, rb, s.features, plan.input_std), s.mean_aa = direct_inner(ra, ra, s.features, plan.input_std),
      s.mean_bb = direct_inner(rb, rb, s.features, plan.input_std);
    }
  }
  Generator gen(plan.seed);
  auto heavy = [&plan](const SizedRun& r) {
    return averaged_pareto_shape(r) > pareto_shape_limit(r.done) || (!plan.radial && r.total.tail_share(r.done) > plan.tail_share_limit);
  };
  // Uniform directions first; where importance sampling may follow, they stop as soon as their
  // draws are marked heavy-tailed (sizing them further would only spend draws on a tail they do
  // not sample well).
  // Tempering always (its tests): the uniform run only reads the target's scales.
  const bool may_adapt = plan.radial && plan.importance && !plan.always_temper;
  MonteCarloPlan first = plan;
  if (plan.radial && plan.always_temper) first.max_samples = std::min(plan.max_samples, plan.min_draws);
  SizedRun run = sized_run(s, first, DirectionProposal::uniform(s.features), gen,
                           may_adapt && !plan.always_adapt ? std::function<bool(const SizedRun&)>(heavy) : nullptr);
  // Importance sampling, where the uniform directions' draws are heavy-tailed: their highest
  // directions start the search for the peaks of |f_a|²/E|f_a|² + |f_b|²/E|f_b|² (by
  // Cauchy–Schwarz |f_a·f_b| is within half of it, so one proposal serves the three inner
  // products). Which law the estimate then draws from, the proposal or uniform directions, is
  // decided on pilots: the uniform run and a run of as many draws from the proposal, compared by
  // prefer_proposal. The estimate is a fresh run from the chosen law; the runs that chose the
  // proposal and the law are set aside, which keeps the estimate unbiased.
  ProposalFit fit;
  int64_t set_aside = 0;
  bool use_proposal = false, declined = false;
  double uniform_shape = NAN, proposal_shape = NAN;
  const TargetScales scales = plan.radial ? target_scales(run) : TargetScales{};
  auto hear = [&plan](const char* role, const SizedRun& r) {
    if (plan.run_heard) plan.run_heard(role, r.directions);
  };
  // A marked first run is checked against a second uniform run of as many draws before any
  // proposal is paid for. Both runs only choose the law; where the second is unmarked the
  // estimate is a fresh uniform run, so no draw that chose uniform directions enters it.
  bool rechecked = false, cleared = false;
  double recheck_shape = NAN;
  int64_t recheck_draws = 0;
  if (may_adapt && !plan.always_adapt && plan.recheck_uniform && heavy(run)) {
    MonteCarloPlan recheck_plan = plan;
    recheck_plan.max_samples = run.done, recheck_plan.tolerance = 0;  // exactly as many draws as the first run
    const SizedRun recheck = sized_run(s, recheck_plan, DirectionProposal::uniform(s.features), gen);
    hear("uniform recheck", recheck);
    rechecked = true, cleared = !heavy(recheck);
    recheck_shape = averaged_pareto_shape(recheck);
    recheck_draws = recheck.done + recheck.pilot;
    if (cleared) {
      hear("uniform pilot", run);
      recheck_draws += run.done + run.pilot;
      run = sized_run(s, plan, DirectionProposal::uniform(s.features), gen);
    }
  }
  if (may_adapt && !cleared && (plan.always_adapt || heavy(run))) {
    std::vector<double> explored(size_t(run.done));
    for (int64_t i = 0; i < run.done; ++i) explored[size_t(i)] = run.raw_aa[size_t(i)] / scales.aa + run.raw_bb[size_t(i)] / scales.bb;
    // The adaptation's progress: the directions it has spent against its budget.
    int64_t spent = 0;
    const double budget = plan.proposal.budget * double(run.done);
    auto target = [&](const std::vector<double>& u, int64_t n) {
      const std::vector<double> x = rows_along(u, n, s.features, s.rule, plan.input_std);
      const int64_t rows = n * s.per_draw_rows;
      const Products q = per_draw(products(outputs(s.a, s.reference, x, rows), evaluate_polynomial(s.b, x, rows), rows), s.weights);
      std::vector<double> h(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) h[size_t(i)] = q.aa[size_t(i)] / scales.aa + q.bb[size_t(i)] / scales.bb;
      spent += n;
      if (plan.stage_progress && budget > 0) plan.stage_progress("adapting directions", std::min(double(spent) / budget, 0.99));
      return h;
    };
    fit = adapt_direction_proposal(s.features, target, run.directions, explored, run.done, plan.proposal, gen);
    if (!fit.proposal.components.empty()) {
      // Bounded by rerun_limit times the uniform run's draws: a law that missed the mass would
      // otherwise draw toward the sample cap before its standard error reached the tolerance.
      MonteCarloPlan capped = plan;
      if (plan.rerun_limit > 0)
        capped.max_samples = std::min(plan.max_samples, std::max(int64_t(plan.rerun_limit * double(run.done)), plan.min_draws));
      set_aside = run.done + run.pilot;
      hear("uniform pilot", run);
      use_proposal = true;
      if (plan.choose_by_pilot) {
        MonteCarloPlan pilot_plan = plan;
        pilot_plan.max_samples = run.done, pilot_plan.tolerance = 0;  // exactly as many draws as the uniform run
        const SizedRun pilot = sized_run(s, pilot_plan, fit.proposal, gen);
        hear("proposal pilot", pilot);
        set_aside += pilot.done + pilot.pilot;
        const PilotSummary from_uniform = {run.done, averaged_pareto_shape(run), cosine_variance(run.total, run.done)},
                           from_proposal = {pilot.done, averaged_pareto_shape(pilot), cosine_variance(pilot.total, pilot.done)};
        uniform_shape = from_uniform.pareto_shape, proposal_shape = from_proposal.pareto_shape;
        use_proposal = prefer_proposal(from_uniform, from_proposal);
        declined = !use_proposal;
      }
      run = sized_run(s, capped, use_proposal ? fit.proposal : DirectionProposal::uniform(s.features), gen);
    }
  }
  MonteCarloSimilarity r = finish(run.total, run.slice, run.done);
  r.controlled_ab = run.controlled[0], r.controlled_aa = run.controlled[1], r.controlled_bb = run.controlled[2];
  r.control_variate = r.controlled_ab || r.controlled_aa || r.controlled_bb;
  r.uniform_rechecked = rechecked, r.recheck_cleared = cleared, r.recheck_pareto_shape = recheck_shape;
  r.recheck_draws = recheck_draws;
  r.pilot_samples = run.pilot;
  r.radial_points = plan.radial ? int(s.per_draw_rows) : 0;
  r.importance = use_proposal;
  r.proposal_declined = declined;
  r.uniform_pilot_shape = uniform_shape, r.proposal_pilot_shape = proposal_shape;
  r.proposal_peaks = fit.peaks, r.proposal_unconverged = fit.unconverged, r.proposal_draws = fit.draws + set_aside;
  r.evaluations = (run.done + run.pilot + r.proposal_draws + r.recheck_draws) * s.per_draw_rows;
  r.tail_share = run.total.tail_share(run.done);
  r.effective_draws = self_effective_draws(run.all);
  r.pareto_shape = averaged_pareto_shape(run), r.pareto_limit = pareto_shape_limit(run.done);
  // A proposal whose search was still finding peaks (or heavy weights) when it stopped has left
  // mass unfound that a sized run may not meet: its estimate is marked whatever its draws' tail.
  r.proposal_settled = fit.settled;
  r.reliable = !heavy(run) && (!use_proposal || fit.settled);
  if (!plan.radial || !plan.tempering || (r.reliable && !plan.always_temper)) {
    hear("estimate", run);
    return r;
  }
  // Tempering in place of a marked estimate; what was spent before it is set aside.
  // It starts from the fitted proposal where there is one (its peaks, found on draws set aside).
  const TemperedEstimate t =
      tempered_estimate(s, plan, scales, fit.proposal.components.empty() ? DirectionProposal::uniform(s.features) : fit.proposal, gen);
  MonteCarloSimilarity tempered = finish(t.total, t.slice, t.replicates);
  // Few runs: each standard error widened by t/z, so that ±1.96 of them is Student's 95% interval
  // of replicates − 1 degrees of freedom (its spread is itself estimated from a few runs).
  const double widen = t_widening(t.replicates);
  for (double* se : {&tempered.similarity_se, &tempered.inner_ab_se, &tempered.inner_aa_se, &tempered.inner_bb_se}) *se *= widen;
  for (double& se : tempered.slice_se) se *= widen;
  tempered.radial_points = int(s.per_draw_rows);
  tempered.evaluations = r.evaluations + t.evaluations * s.per_draw_rows;
  tempered.proposal_peaks = r.proposal_peaks, tempered.proposal_unconverged = r.proposal_unconverged;
  tempered.proposal_draws = r.proposal_draws + run.done + run.pilot;
  tempered.uniform_rechecked = rechecked, tempered.recheck_cleared = cleared, tempered.recheck_pareto_shape = recheck_shape;
  tempered.recheck_draws = recheck_draws;
  tempered.pareto_shape = NAN, tempered.pareto_limit = NAN;
  tempered.tempered = true, tempered.replicates = t.replicates, tempered.rungs = t.rungs;
  tempered.particles = plan.tempering_plan.particles;
  tempered.log_normaliser_spread = t.log_normaliser_spread, tempered.tempering_acceptance = t.acceptance;
  tempered.reliable = t.log_normaliser_spread <= plan.tempering_spread_limit;
  return tempered;
}

}  // namespace adjoint
