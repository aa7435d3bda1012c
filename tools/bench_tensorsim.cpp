// `adjoint bench tensorsim`: how long tensor similarity takes, and how long Monte Carlo needs
// for the same number. Cases (random weights, seeded):
//   one bilinear layer, d = 1024, hidden 64, 10 outputs: the closed forms (identity and
//     Gaussian metric) per pair, three ways: from the two forms, with each layer's own terms
//     cached (what a pair costs in a run), and over all pairs of a run of 16 checkpoints
//     (stacked products, threads); --out writes them for tools/bench_tensorsim_numpy.py;
//   a residual bilinear MLP (embed 784 → 256, three blocks of hidden 256, head → 10): the
//     second-moment recursion;
//   a 2-block bilinear-attention LM over 4 positions (--lm-dim, 2 heads): the recursion with the
//     exact ten-leg attention term (Monte Carlo does not converge on such deep polynomials: its
//     outputs are heavy-tailed, so it is not run there).
// Beside each Gaussian number, Monte Carlo with growing sample counts (x ~ N(0, I), both
// networks evaluated in double): its error against the exact value and its time. The ratio is
// the time of the first Monte-Carlo run whose error is below --tolerance over the exact time.
#include "tools/bench_tensorsim.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <tuple>

#include "analysis/similarity/second_moment.h"
#include "analysis/similarity/tensor_similarity.h"
#include "engine/error.h"
#include "engine/gemm.h"
#include "engine/io/files.h"
#include "engine/io/json.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "models/model.h"
#include "tools/timing.h"

namespace adjoint {

namespace {

double seconds_of(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Two related networks of one architecture: b is a's weights plus noise of half their size.
std::pair<std::shared_ptr<Model>, std::shared_ptr<Model>> related_pair(const ModelConfig& c) {
  Generator ga(1), gb(2);
  auto a = make_model(c, ga), b = make_model(c, gb);
  for (const auto& [name, t] : b->named_parameters()) {
    const std::vector<float> own = a->state_dict().at(name).to_vector(), noise = t.to_vector();
    std::vector<float> mixed(own.size());
    for (size_t i = 0; i < own.size(); ++i) mixed[i] = own[i] + 0.5f * noise[i];
    Tensor target = t;
    target.copy_from(Tensor::from_vector(t.shape(), mixed));
  }
  return {a, b};
}

// Monte Carlo at 10^3, 10^4, ... samples until its error is below the tolerance (or the
// budget of samples is spent); prints each and returns the time of the first good one (NaN if none).
double monte_carlo_until(const PolynomialView& a, const PolynomialView& b, double exact, double tolerance,
                         int64_t max_samples) {
  for (int64_t n = 1000; n <= max_samples; n *= 10) {
    double estimate = 0;
    const double t = seconds_of([&] { estimate = monte_carlo_similarity(a, b, n, 7).similarity; });
    const double error = std::abs(estimate - exact);
    std::printf("    Monte Carlo %9lld samples: %.6f (error %.1e) in %9.3f ms\n", (long long)n, estimate, error, t * 1e3);
    if (error < tolerance) return t;
  }
  return NAN;
}

void report_ratio(double mc_seconds, double exact_seconds, double tolerance) {
  if (std::isnan(mc_seconds))
    std::printf("    Monte Carlo did not reach an error below %g within the sample budget (--max-samples)\n", tolerance);
  else
    std::printf("    ratio: Monte Carlo to an error below %g takes %.0fx the exact computation\n", tolerance,
                mc_seconds / exact_seconds);
}

}  // namespace

// One timed case of the closed forms, for the JSON that tools/bench_tensorsim_numpy.py reads.
struct ClosedFormCase {
  std::string name, metric;
  double ms = 0, fastest_ms = 0, slowest_ms = 0;
};

int run_bench_tensorsim(const cli::Args& args) {
  const int64_t repeats = args.has("repeats") ? args.integer("repeats") : 7;
  const double tolerance = args.number("tolerance");
  const int64_t max_samples = args.integer("max-samples");
  if (repeats < 1) throw UsageError(cat("option --repeats expects a count >= 1, got ", repeats));
  if (!(tolerance > 0)) throw UsageError(cat("option --tolerance expects a positive number, got ", tolerance));
  const std::string only = args.has("only") ? args.text("only") : "";
  if (!only.empty() && only != "closed")
    throw UsageError(cat("bench tensorsim: --only expects closed (the one-layer closed forms alone), got '", only, "'"));
  const std::string clock = args.text("clock");
  const cli::TimingOptions timing{cli::bench_clock(clock, num_threads())};
  std::printf("adjoint bench tensorsim: %d threads, OpenBLAS kernels %s, median %s time of %lld runs, Monte Carlo to "
              "|error| < %g\n\n",
              num_threads(), blas_kernels(), clock.c_str(), (long long)repeats, tolerance);

  constexpr int64_t kRunLength = 16;  // checkpoints of the simulated run
  ModelConfig one;
  one.arch = "bilinear_mlp", one.in_features = 1024, one.hidden = 64, one.num_classes = 10;
  auto [a1, b1] = related_pair(one);
  const BilinearForm fa = bilinear_form(a1->polynomial_view()), fb = bilinear_form(b1->polynomial_view());
  std::vector<BilinearForm> run;  // a run's checkpoints: a, drifting towards b
  for (int64_t k = 0; k < kRunLength; ++k) {
    BilinearForm f = fa;
    const double t = double(k) / double(kRunLength - 1);
    for (Matrix64* m : {&f.left, &f.right, &f.down}) {
      const Matrix64& other = m == &f.left ? fb.left : m == &f.right ? fb.right : fb.down;
      for (size_t i = 0; i < m->data.size(); ++i) m->data[i] = (1 - t) * m->data[i] + t * other.data[i];
    }
    run.push_back(f);
  }
  std::printf("one bilinear layer, d 1024, hidden 64, 10 outputs (with the 10 slices), ms per pair:\n");
  std::printf("  %-9s %12s %14s %22s\n", "metric", "from forms", "norms cached", "run of 16, all pairs");
  std::vector<ClosedFormCase> cases;
  double gaussian = 0, gaussian_seconds = 0;
  for (const SimilarityMetric& m : similarity_metrics()) {
    if (m.needs_data) continue;  // the data metric is the Gaussian one after a fold done once per model
    double value = 0;
    const cli::RunTimes scratch = cli::time_runs(repeats, [&] { value = tensor_similarity(m, fa, fb, true).total; }, timing);
    const PreparedLayer pa = prepare_layer(m, fa, true), pb = prepare_layer(m, fb, true);
    const cli::RunTimes cached = cli::time_runs(repeats, [&] { value = tensor_similarity(pa, pb).total; }, timing);
    std::vector<PreparedLayer> layers;
    for (const BilinearForm& f : run) layers.push_back(prepare_layer(m, f, true));
    const double pairs = double(kRunLength * (kRunLength - 1) / 2);
    const cli::RunTimes all = cli::time_runs(repeats, [&] { pairwise_similarity(layers); }, timing);
    std::printf("  %-9s %12.3f %14.3f %22.3f   (similarity %.6f)\n", m.name, scratch.median * 1e3, cached.median * 1e3,
                all.median * 1e3 / pairs, value);
    for (const auto& [name, t, per] : {std::tuple{"from_forms", scratch, 1.0}, std::tuple{"cached_norms", cached, 1.0},
                                       std::tuple{"run_pairs", all, pairs}})
      cases.push_back({name, m.name, t.median * 1e3 / per, t.fastest * 1e3 / per, t.slowest * 1e3 / per});
    if (std::string(m.name) == "gaussian") gaussian = value, gaussian_seconds = scratch.median;
  }
  if (args.has("out")) {
    Json results = Json::array();
    for (const ClosedFormCase& c : cases)
      results.push_back(Json(Json::Object{{"case", c.name}, {"metric", c.metric}, {"ms_per_pair", c.ms},
                                          {"ms_fastest", c.fastest_ms}, {"ms_slowest", c.slowest_ms}}));
    Json doc(Json::Object{{"threads", num_threads()}, {"blas", blas_kernels()}, {"clock", clock}, {"repeats", repeats},
                          {"inputs", int64_t(1024)}, {"hidden", int64_t(64)}, {"outputs", int64_t(10)},
                          {"run_length", kRunLength}, {"results", results}});
    write_file_atomic(args.text("out"), to_json(doc, 2) + "\n");
    std::printf("wrote %s; compare: /usr/bin/python3 tools/bench_tensorsim_numpy.py --ours %s\n", args.text("out").c_str(),
                args.text("out").c_str());
  }
  if (only == "closed") return 0;
  report_ratio(monte_carlo_until(a1->polynomial_view(), b1->polynomial_view(), gaussian, tolerance, max_samples),
               gaussian_seconds, tolerance);

  ModelConfig deep;
  deep.arch = "bilinear_mlp", deep.in_features = 784, deep.dim = 256, deep.depth = 3, deep.hidden = 256;
  deep.num_classes = 10, deep.residual_scale = 0.5;
  auto [a2, b2] = related_pair(deep);
  const PolynomialView va = a2->polynomial_view(), vb = b2->polynomial_view();
  std::printf("\nresidual bilinear MLP, 784 -> 256, 3 blocks of hidden 256, 10 outputs (second-moment recursion):\n");
  double value = 0;
  const double t = cli::median_seconds(std::max<int64_t>(1, repeats / 2), [&] { value = deep_similarity(va, vb).similarity; });
  std::printf("  recursion: %.6f in %.1f ms\n", value, t * 1e3);
  report_ratio(monte_carlo_until(va, vb, value, tolerance, max_samples), t, tolerance);
  std::printf("  (the recursion is exact for one layer and a Gaussian-closure approximation deeper; Monte Carlo's\n"
              "   error here is measured against it, so it includes the closure's own error)\n");

  ModelConfig lm;
  lm.arch = "bilinear_lm", lm.attention = "bilinear", lm.vocab = 256, lm.seq_len = 4;
  lm.dim = args.integer("lm-dim"), lm.depth = 2, lm.heads = 2, lm.mlp_ratio = 2, lm.residual_scale = 0.5;
  auto [a3, b3] = related_pair(lm);
  const PolynomialView la = a3->polynomial_view(4), lb = b3->polynomial_view(4);
  std::printf("\nbilinear-attention LM, 2 blocks, dim %lld, 2 heads, context 4 (recursion with the exact attention term):\n",
              (long long)lm.dim);
  const double input_std = 1.0 / std::sqrt(double(lm.vocab));  // the one-hot tokens' norm
  MomentTrace ta, tb;
  const double t_self = seconds_of([&] { ta = self_moments(la, input_std); });
  tb = self_moments(lb, input_std);
  const double t_cross = seconds_of([&] { value = deep_similarity(la, lb, ta, tb).similarity; });
  std::printf("  recursion (--input-std 1/16): %.6f in %.2f s: %.2f s for each network's own moments (once per\n"
              "  network in a run) and %.2f s for the pair's cross moments (one run each)\n",
              value, 2 * t_self + t_cross, t_self, t_cross);
  return 0;
}

}  // namespace adjoint
