// How often the sized Monte Carlo estimate's 95% intervals cover the truth on 2-block
// attention-only LMs of the tensor-similarity paper's family, for three estimators: directions
// importance-sampled from an adapted proposal (the default), uniform directions (spherical–radial),
// and plain sampling of whole inputs; and whether each drifts with the number of draws on a
// network of the paper's layout. (The default adapts a proposal only where uniform directions'
// draws are heavy-tailed, and then draws its estimate from the proposal or from uniform directions,
// whichever did better on a pilot; "always adapted" fits one on every run and always uses it.)
//
//   build/analysis/experiments/mc_coverage coverage RUNS TOLERANCE INPUT_STD VOCAB DIM POSITIONS WEIGHT_STD PERTURBATION [PAIRS]
//   build/analysis/experiments/mc_coverage drift INPUT_STD PAPER_LM.safetensors DRAWS...
//   build/analysis/experiments/mc_coverage versus A B POSITIONS INPUT_STD RUNS TOLERANCE EXACT_AB EXACT_AA EXACT_BB
//   build/analysis/experiments/mc_coverage batches A B POSITIONS INPUT_STD SAMPLES SEEDS EXACT_AB EXACT_AA EXACT_BB
//
// coverage: PAIRS (default 1) pairs of random networks, the second the first with its weights
// moved by PERTURBATION times a fresh draw (plain attention: no QK bias, no rotary
// positions, so that writing them out as polynomials, polynomial_moments.h, gives the exact
// inner products), each estimated RUNS times from independent seeds to TOLERANCE with each
// estimator; prints per pair and estimator how many intervals covered the cosine and each of
// the three inner products, the mean standard error and time, the largest Pareto tail shape
// seen, and how many runs the tail diagnostic marked (and the earlier variance-share rule would
// have).
// versus: two adjoint checkpoints whose exact inner products are known (lm_exact_check.csv),
// estimated RUNS times by each estimator: how many intervals cover each.
// batches: the same pair through --check-mc SAMPLES (fixed_budget_plan) with seeds 1 … SEEDS, with
// the control variate and without: whether the batches centre on the exact values and scatter as
// much as their standard errors claim (what a handful of lm_exact_check batches cannot tell), as
// PooledEstimates reads them.
// drift: the safetensors file's network (the paper's layout, 2 heads, 4 positions) against
// itself with layers.1.o.weight halved, estimated at each number of draws (no tolerance), by
// each estimator (plain sampling given the same network evaluations as a direction's rule).
// MC_ESTIMATORS=default,importance,tempered,spherical,plain (any of them) runs only those named;
// MC_REPLICATES=R the tempered estimate's runs in drift (8 otherwise), where DRAWS counts its
// particles a run; MC_PARTICLES=N the particles of every tempered run in drift (the default's too).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "analysis/similarity/exact_moments.h"
#include "analysis/similarity/monte_carlo.h"
#include "analysis/similarity/polynomial_moments.h"
#include "analysis/similarity/radial_quadrature.h"
#include "engine/error.h"
#include "engine/io/safetensors.h"
#include "engine/io/table.h"
#include "models/checkpoint.h"
#include "models/paper_lm.h"

using namespace adjoint;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

bool covers(double estimate, double se, double exact) { return std::abs(estimate - exact) <= 1.96 * se; }

// One cell, formatted as printf would.
template <class... Values>
std::string cell(const char* format, Values... values) {
  char text[160];
  std::snprintf(text, sizeof text, format, values...);
  return text;
}

// "k/n": covered k times of n.
std::string of(int k, int n) { return cell("%d/%d", k, n); }

// A table's Markdown written a row at a time, each row as soon as it is measured.
void print_head(const Table& t) {
  std::fputs(t.markdown_head().c_str(), stdout);
  std::fflush(stdout);
}
void print_row(const Table& t, const std::vector<std::string>& cells) {
  std::fputs(t.markdown_row(cells).c_str(), stdout);
  std::fflush(stdout);
}

// Right-aligned columns but the named ones (text).
std::vector<Align> numbers_but(size_t columns, const std::vector<size_t>& text) {
  std::vector<Align> align(columns, Align::Right);
  for (size_t i : text) align[i] = Align::Left;
  return align;
}

// The estimators compared: importance-sampled directions (the default), uniform directions, and
// plain sampling of whole inputs.
struct Estimator {
  const char* name;
  bool radial, importance, always_adapt, tempering, always_temper;
};
const Estimator kEstimators[] = {
    {"default (directions importance-sampled where uniform ones are heavy-tailed, tempered where still marked)", true, true, false,
     true, false},
    {"importance-sampled directions, always adapted", true, true, true, false, false},
    {"tempered directions, always", true, false, false, true, true},
    {"spherical-radial (uniform directions)", true, false, false, false, false},
    {"plain", false, false, false, false, false},
};
MonteCarloPlan plan_of(const Estimator& e) {
  MonteCarloPlan plan;
  plan.radial = e.radial, plan.importance = e.importance, plan.always_adapt = e.always_adapt;
  plan.tempering = e.tempering, plan.always_temper = e.always_temper;
  plan.choose_by_pilot = !e.always_adapt;  // "always adapted": the proposal forced, its own evidence
  return plan;
}

// What `runs` independent sized estimates of one pair did against the truth: how often each
// interval covered it, the means of their costs, and what the tail diagnostic marked.
struct Tally {
  int cosine = 0, ab = 0, aa = 0, bb = 0, marked = 0, marked_missed = 0, missed = 0, share_marked = 0;
  double se = 0, draws = 0, evaluations = 0, time = 0, tail = 0, pareto = -INFINITY;
};

// MC_ESTIMATORS, when set, names the estimators to run (a comma-separated list of the names'
// first words: default, importance, tempered, spherical, plain); all otherwise.
bool selected(const Estimator& e) {
  const char* only = std::getenv("MC_ESTIMATORS");
  if (!only) return true;
  const std::string name(e.name), list = std::string(",") + only + ",";
  std::string key = ",";  // appended piece by piece: g++ 12 warns (-Wrestrict) on "," + substr + ","
  key.append(name, 0, name.find_first_of(" -"));
  key += ',';
  return list.find(key) != std::string::npos;
}

// Run r is seeded seed_step·r + seed_offset, so that each table's rows regenerate.
Tally repeated_runs(const PolynomialView& a, const PolynomialView& b, MonteCarloPlan plan, int runs, uint64_t seed_step,
                    uint64_t seed_offset, const ExactInnerProducts& truth) {
  Tally t;
  for (int run = 1; run <= runs; ++run) {
    plan.seed = uint64_t(run) * seed_step + seed_offset;
    const auto start = std::chrono::steady_clock::now();
    const MonteCarloSimilarity mc = monte_carlo_sized(a, b, plan);
    t.time += seconds_since(start) / runs;
    const bool cosine_covered = covers(mc.similarity, mc.similarity_se, truth.cosine());
    t.cosine += cosine_covered, t.ab += covers(mc.inner_ab, mc.inner_ab_se, truth.ab);
    t.aa += covers(mc.inner_aa, mc.inner_aa_se, truth.aa), t.bb += covers(mc.inner_bb, mc.inner_bb_se, truth.bb);
    t.se += mc.similarity_se / runs, t.draws += double(mc.samples) / runs, t.evaluations += double(mc.evaluations) / runs;
    t.tail = std::max(t.tail, mc.tail_share), t.pareto = std::max(t.pareto, mc.pareto_shape);
    t.marked += !mc.reliable, t.marked_missed += !mc.reliable && !cosine_covered, t.missed += !cosine_covered;
    t.share_marked += mc.tail_share > 0.05;  // the earlier diagnostic, for comparison
  }
  return t;
}

// A pair of random networks, the second the first with every weight moved by `perturbation`
// times a fresh draw (a cosine well inside (0, 1)).
std::pair<PolynomialView, PolynomialView> plain_attention_pair(int64_t vocab, int64_t dim, int64_t positions, double weight_std,
                                                               double perturbation, Generator& gen) {
  PaperLmShape shape;
  shape.heads = 2, shape.qk_bias = false, shape.rotary = false, shape.vocab = vocab, shape.dim = dim, shape.layers = 2;
  const std::map<std::string, Tensor> first = paper_lm_random_state(shape, gen, weight_std),
                                      second = paper_lm_random_state(shape, gen, perturbation * weight_std, 0, &first);
  return {paper_lm_view(first, shape, positions, "a"), paper_lm_view(second, shape, positions, "b")};
}

void coverage(int runs, double tolerance, double input_std, int64_t vocab, int64_t dim, int64_t positions, double weight_std,
              double perturbation, int pairs) {
  Table table{{"pair", "estimator", "exact cosine", "cosine", "<A|B>", "<A|A>", "<B|B>", "mean s.e.", "mean draws", "mean evaluations",
               "mean time (s)", "largest Pareto k", "marked unreliable (of them, cosine missed; cosine missed in all)",
               "marked by variance share > 0.05"}};
  table.align = numbers_but(table.header.size(), {1});
  print_head(table);
  for (int pair = 0; pair < pairs; ++pair) {
    Generator gen(uint64_t(1000 + pair));
    const auto [a, b] = plain_attention_pair(vocab, dim, positions, weight_std, perturbation, gen);
    const ExactInnerProducts truth = exact_inner_products(a, b, input_std);
    for (const Estimator& e : kEstimators) {
      if (!selected(e)) continue;
      MonteCarloPlan plan = plan_of(e);
      plan.tolerance = tolerance, plan.input_std = input_std;
      const Tally t = repeated_runs(a, b, plan, runs, 7919, 13, truth);
      print_row(table, {std::to_string(pair), e.name, cell("%.6f", truth.cosine()), of(t.cosine, runs), of(t.ab, runs), of(t.aa, runs),
                        of(t.bb, runs), cell("%.5f", t.se), cell("%.0f", t.draws), cell("%.0f", t.evaluations), cell("%.2f", t.time),
                        cell("%.2f", t.pareto), cell("%d (%d; %d)", t.marked, t.marked_missed, t.missed), std::to_string(t.share_marked)});
    }
  }
}

// "k_u, k_p" of the two pilots' tail shapes, or "forced" where no choice was made.
std::string pilot_shapes(double uniform, double proposal) {
  if (std::isnan(uniform)) return "forced";
  char text[64];
  std::snprintf(text, sizeof text, "%.2f, %.2f", uniform, proposal);
  return text;
}

// MC_REPLICATES, when set, the tempered estimate's runs in drift (8 otherwise).
int replicates_wanted() {
  const char* text = std::getenv("MC_REPLICATES");
  return text ? std::max(2, std::atoi(text)) : 8;
}

// "tempered (R runs × N particles, L rungs; log-normaliser s.d. S, acceptance A)".
std::string tempered_law(const MonteCarloSimilarity& mc) {
  char text[160];
  std::snprintf(text, sizeof text, "tempered (%d runs × %lld particles, %d rungs; log-normaliser s.d. %.2f, acceptance %.2f)",
                mc.replicates, (long long)mc.particles, mc.rungs, mc.log_normaliser_spread, mc.tempering_acceptance);
  return text;
}

void drift(double input_std, const std::string& path, const std::vector<int64_t>& budgets) {
  const SafetensorsFile file = read_safetensors(path);
  PaperLmShape shape;
  shape.heads = 2;
  const PolynomialView a = paper_lm_view(file.tensors, shape, kPaperLmPositions, path);
  // B: A with its last layer's output projection halved (a cosine near 0.95).
  std::map<std::string, Tensor> other = file.tensors;
  std::vector<float> halved = other.at("layers.1.o.weight").to_vector();
  for (float& w : halved) w *= 0.5f;
  other["layers.1.o.weight"] = Tensor::from_vector(other.at("layers.1.o.weight").shape(), halved);
  const PolynomialView b = paper_lm_view(other, shape, kPaperLmPositions, "halved");
  Table table{{"estimator", "draws", "evaluations", "cosine ± s.e.", "<A|B> ± s.e.", "<A|A> ± s.e.", "<B|B> ± s.e.", "Pareto k",
               "tail share", "reliable", "law drawn (peaks, unconverged; pilots' k: uniform, proposal)", "time (s)"}};
  table.align = numbers_but(table.header.size(), {0, 9, 10});
  print_head(table);
  for (const Estimator& e : kEstimators) {
    if (!selected(e)) continue;
    for (int64_t draws : budgets) {
      MonteCarloPlan plan = plan_of(e);
      plan.tolerance = 1e-12, plan.input_std = input_std, plan.seed = uint64_t(draws) + 1, plan.rerun_limit = 0;
      // Plain sampling gets the same network evaluations.
      plan.max_samples = e.radial ? draws : draws * radial_points_for(polynomial_degree(a) + polynomial_degree(b));
      // Tempered: DRAWS particles a run, a fixed number of runs (no tolerance to size them to).
      plan.min_replicates = plan.max_replicates = replicates_wanted();
      if (e.always_temper) plan.tempering_plan.particles = draws;
      if (const char* particles = std::getenv("MC_PARTICLES")) plan.tempering_plan.particles = std::max(2LL, std::atoll(particles));
      const auto start = std::chrono::steady_clock::now();
      const MonteCarloSimilarity mc = monte_carlo_sized(a, b, plan);
      const std::string law = mc.tempered ? tempered_law(mc)
                              : !e.radial ? "inputs"
                              : mc.proposal_peaks == 0 ? "uniform"
                                                       : std::string(mc.importance ? "proposal" : "uniform") + " (" +
                                                             std::to_string(mc.proposal_peaks) + ", " +
                                                             std::to_string(mc.proposal_unconverged) + "; " +
                                                             pilot_shapes(mc.uniform_pilot_shape, mc.proposal_pilot_shape) + ")";
      print_row(table, {e.name, std::to_string(mc.samples), std::to_string(mc.evaluations), cell("%.4f ± %.4f", mc.similarity, mc.similarity_se),
                        cell("%.4g ± %.2g", mc.inner_ab, mc.inner_ab_se), cell("%.4g ± %.2g", mc.inner_aa, mc.inner_aa_se),
                        cell("%.4g ± %.2g", mc.inner_bb, mc.inner_bb_se), cell("%.2f", mc.pareto_shape), cell("%.3f", mc.tail_share),
                        mc.reliable ? "yes" : "no", law, cell("%.1f", seconds_since(start))});
    }
  }
}

void versus(const std::string& path_a, const std::string& path_b, int64_t positions, double input_std, int runs,
            double tolerance, double ab, double aa, double bb) {
  const PolynomialView a = model_from_checkpoint(load_checkpoint(path_a))->polynomial_view(positions),
                       b = model_from_checkpoint(load_checkpoint(path_b))->polynomial_view(positions);
  Table table{{"estimator", "cosine", "<A|B>", "<A|A>", "<B|B>", "mean s.e.", "mean draws", "mean evaluations", "mean time (s)",
               "largest Pareto k", "marked unreliable"}};
  table.align = numbers_but(table.header.size(), {0});
  print_head(table);
  for (const Estimator& e : kEstimators) {
    if (!selected(e)) continue;
    MonteCarloPlan plan = plan_of(e);
    plan.tolerance = tolerance, plan.input_std = input_std;
    const Tally t = repeated_runs(a, b, plan, runs, 104729, 0, {ab, aa, bb});
    print_row(table, {e.name, of(t.cosine, runs), of(t.ab, runs), of(t.aa, runs), of(t.bb, runs), cell("%.5f", t.se), cell("%.0f", t.draws),
                      cell("%.0f", t.evaluations), cell("%.1f", t.time), cell("%.2f", t.pareto), std::to_string(t.marked)});
  }
}

// batches: what --check-mc's fixed budget gives on a pair whose exact inner products are known,
// over `seeds` independent batches (seeds 1 … seeds) of `samples` network evaluations each, with
// the control variate and without: per inner product, the batches' mean − exact in units of the
// mean's standard error (their spread over sqrt(seeds)), their spread against the mean standard
// error they claim (near 1 where the claimed error is the error), the root mean square of each
// error over its own claim (the same where some batches kept the control variate and some fell
// back to the raw draws), how many intervals covered, and how many batches kept the control variate.
void batches(const std::string& path_a, const std::string& path_b, int64_t positions, double input_std, int64_t samples, int seeds,
             double ab, double aa, double bb) {
  const PolynomialView a = model_from_checkpoint(load_checkpoint(path_a))->polynomial_view(positions),
                       b = model_from_checkpoint(load_checkpoint(path_b))->polynomial_view(positions);
  Table table{{"control variate", "inner product", "exact", "batch mean", "t (mean over spread)", "z (mean over claims)",
               "spread / claimed s.e.", "rms error / own claim", "covered", "kept control variate"}};
  table.align = numbers_but(table.header.size(), {0, 1});
  print_head(table);
  for (const bool cv : {true, false}) {
    check(seeds >= 2, "mc_coverage batches: needs at least 2 seeds to read their spread, got ", seeds);
    MonteCarloPlan plan = fixed_budget_plan(a, b, samples, 1, input_std);
    plan.control_variate = cv;
    PooledEstimates m[3];
    int kept[3] = {0, 0, 0};
    const double exact[3] = {ab, aa, bb};
    for (int seed = 1; seed <= seeds; ++seed) {
      plan.seed = uint64_t(seed);
      const MonteCarloSimilarity mc = monte_carlo_sized(a, b, plan);
      m[0].add(mc.inner_ab, mc.inner_ab_se, ab), m[1].add(mc.inner_aa, mc.inner_aa_se, aa), m[2].add(mc.inner_bb, mc.inner_bb_se, bb);
      kept[0] += mc.controlled_ab, kept[1] += mc.controlled_aa, kept[2] += mc.controlled_bb;
    }
    const char* names[3] = {"<A|B>", "<A|A>", "<B|B>"};
    for (int k = 0; k < 3; ++k)
      print_row(table, {cv ? "yes" : "no", names[k], cell("%.6g", exact[k]), cell("%.6g", exact[k] + m[k].sum / m[k].n),
                        cell("%.2f", m[k].t()), cell("%.2f", m[k].z()), cell("%.2f", m[k].spread_ratio()),
                        cell("%.2f", m[k].standardised_spread()), of(m[k].covered, seeds), of(kept[k], seeds)});
  }
}

}  // namespace

int main(int argc, char** argv) try {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "coverage" && (argc == 10 || argc == 11)) {
    coverage(std::stoi(argv[2]), std::stod(argv[3]), std::stod(argv[4]), std::stoll(argv[5]), std::stoll(argv[6]),
             std::stoll(argv[7]), std::stod(argv[8]), std::stod(argv[9]), argc == 11 ? std::stoi(argv[10]) : 1);
    return 0;
  }
  if (mode == "drift" && argc >= 5) {
    std::vector<int64_t> budgets;
    for (int i = 4; i < argc; ++i) budgets.push_back(std::stoll(argv[i]));
    drift(std::stod(argv[2]), argv[3], budgets);
    return 0;
  }
  if (mode == "versus" && argc == 11) {
    versus(argv[2], argv[3], std::stoll(argv[4]), std::stod(argv[5]), std::stoi(argv[6]), std::stod(argv[7]),
           std::stod(argv[8]), std::stod(argv[9]), std::stod(argv[10]));
    return 0;
  }
  if (mode == "batches" && argc == 11) {
    batches(argv[2], argv[3], std::stoll(argv[4]), std::stod(argv[5]), std::stoll(argv[6]), std::stoi(argv[7]), std::stod(argv[8]),
            std::stod(argv[9]), std::stod(argv[10]));
    return 0;
  }
  std::fprintf(stderr, "usage: mc_coverage coverage RUNS TOLERANCE INPUT_STD VOCAB DIM POSITIONS WEIGHT_STD PERTURBATION [PAIRS]\n"
                       "       mc_coverage drift INPUT_STD PAPER_LM.safetensors DRAWS...\n"
                       "       mc_coverage versus A B POSITIONS INPUT_STD RUNS TOLERANCE EXACT_AB EXACT_AA EXACT_BB\n"
                       "       mc_coverage batches A B POSITIONS INPUT_STD SAMPLES SEEDS EXACT_AB EXACT_AA EXACT_BB\n");
  return 2;
} catch (const std::exception& e) {
  std::fprintf(stderr, "mc_coverage: %s\n", e.what());
  return 1;
}
