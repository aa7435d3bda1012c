#include "analysis/similarity/monte_carlo.h"

#include <algorithm>
#include <cmath>

#include "engine/error.h"
#include "engine/random.h"

namespace adjoint {

namespace {

// Running sums of the three per-sample products and of their pairwise products.
struct CosineSums {
  double ab = 0, aa = 0, bb = 0, ab_ab = 0, aa_aa = 0, bb_bb = 0, ab_aa = 0, ab_bb = 0, aa_bb = 0;
  void add(double x, double y, double z) {
    ab += x, aa += y, bb += z;
    ab_ab += x * x, aa_aa += y * y, bb_bb += z * z, ab_aa += x * y, ab_bb += x * z, aa_bb += y * z;
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
};

}  // namespace

MonteCarloSimilarity monte_carlo_estimate(const PolynomialView& a, const PolynomialView& b, int64_t samples,
                                          uint64_t seed, double input_std, const PolynomialView* reference) {
  check(a.input_dim == b.input_dim && a.positions == b.positions && a.output_dim() == b.output_dim(),
        "monte carlo similarity: ", a.arch, " and ", b.arch, " differ in their input or output sizes");
  check(!reference || (reference->input_dim == a.input_dim && reference->positions == a.positions &&
                       reference->output_dim() == a.output_dim()),
        "monte carlo similarity: the reference differs from the model in its input or output sizes");
  check(samples >= 2, "monte carlo similarity: needs at least 2 samples, got ", samples);
  check(input_std > 0 && std::isfinite(input_std), "monte carlo similarity: the input's standard deviation must be positive, got ",
        input_std);
  Generator gen(seed);
  const int64_t T = a.positions, per = T * a.input_dim, classes = a.output_dim(), chunk = 4096;
  CosineSums total;
  const size_t C = static_cast<size_t>(classes);
  std::vector<CosineSums> slice(C);
  for (int64_t done = 0; done < samples; done += chunk) {
    const int64_t n = std::min(chunk, samples - done);
    const std::vector<float> draw = normal({n, per}, 0.0f, float(input_std), gen).to_vector();
    const std::vector<double> x(draw.begin(), draw.end());
    std::vector<double> fa = evaluate_polynomial(a, x, n);
    const std::vector<double> fb = evaluate_polynomial(b, x, n);
    if (reference) {
      const std::vector<double> fr = evaluate_polynomial(*reference, x, n);
      for (size_t i = 0; i < fa.size(); ++i) fa[i] -= fr[i];
    }
    std::vector<double> ab(C), aa(C), bb(C);
    for (int64_t s = 0; s < n; ++s) {
      std::fill(ab.begin(), ab.end(), 0.0), std::fill(aa.begin(), aa.end(), 0.0), std::fill(bb.begin(), bb.end(), 0.0);
      for (int64_t t = 0; t < T; ++t)
        for (int64_t o = 0; o < classes; ++o) {
          const size_t i = size_t((s * T + t) * classes + o);
          ab[size_t(o)] += fa[i] * fb[i], aa[size_t(o)] += fa[i] * fa[i], bb[size_t(o)] += fb[i] * fb[i];
        }
      double sab = 0, saa = 0, sbb = 0;
      for (size_t o = 0; o < C; ++o) {
        slice[o].add(ab[o], aa[o], bb[o]);
        sab += ab[o], saa += aa[o], sbb += bb[o];
      }
      total.add(sab, saa, sbb);
    }
  }
  MonteCarloSimilarity r;
  r.samples = samples;
  std::tie(r.similarity, r.similarity_se) = total.cosine(samples);
  const double N = double(samples);
  r.inner_ab = total.ab / N, r.inner_aa = total.aa / N, r.inner_bb = total.bb / N;
  r.inner_ab_se = std::sqrt(std::max(total.ab_ab / N - r.inner_ab * r.inner_ab, 0.0) / (N - 1));
  for (const CosineSums& s : slice) {
    const auto [c, se] = s.cosine(samples);
    r.slices.push_back(c), r.slice_se.push_back(se);
  }
  return r;
}

}  // namespace adjoint
