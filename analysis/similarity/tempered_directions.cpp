#include "analysis/similarity/tempered_directions.h"

#include <algorithm>
#include <cmath>

#include "analysis/similarity/direction_proposal.h"
#include "engine/error.h"

namespace adjoint {

namespace {

// The particles: directions (rows of m), their integrands' rows (1 + K: h first), log h and the
// log density of the law tempering starts from (0 for the uniform law).
struct Population {
  int64_t m = 0, n = 0, width = 0;
  std::vector<double> u, values, log_h, log_q;
};

// log q at each of the n rows of u: the base law's density relative to the uniform law.
std::vector<double> log_base(const DirectionProposal& base, const std::vector<double>& u, int64_t n) {
  std::vector<double> q = base.density(u, n);
  for (double& v : q) v = std::log(v);
  return q;
}

void set_values(Population& p, std::vector<double> values, const DirectionProposal& base) {
  p.log_q = log_base(base, p.u, p.n);
  check(int64_t(values.size()) == p.n * p.width, "tempering: the integrands gave ", values.size(), " values for ", p.n,
        " directions of ", p.width, " each");
  p.values = std::move(values);
  p.log_h.resize(size_t(p.n));
  for (int64_t i = 0; i < p.n; ++i) {
    const double h = p.values[size_t(i * p.width)];
    check(std::isfinite(h) && h >= 0, "tempering: the target is ", h, " along a direction; it must be finite and non-negative");
    p.log_h[size_t(i)] = std::log(h);
  }
}

// n particles drawn from the base law; the integrands' width (1 + K) read off their first values.
Population start(int64_t n, const DirectionIntegrands& integrands, const DirectionProposal& base, Generator& gen) {
  Population p;
  p.m = base.dimension, p.n = n;
  p.u = base.sample(n, gen);
  std::vector<double> values = integrands(p.u, n);
  p.width = int64_t(values.size()) / n;
  check(p.width >= 2, "tempering: the integrands give the target and at least one integral per direction, got ", values.size(),
        " values for ", n, " directions");
  set_values(p, std::move(values), base);
  return p;
}

// The incremental log weights Δβ·(log h − log q) (0 where Δβ = 0, whatever h).
std::vector<double> log_weights(const Population& p, double step) {
  std::vector<double> w(size_t(p.n));
  for (int64_t i = 0; i < p.n; ++i) w[size_t(i)] = step > 0 ? step * (p.log_h[size_t(i)] - p.log_q[size_t(i)]) : 0.0;
  return w;
}

// The effective sample size (Σw)²/Σw² of the weights exp(log_w).
double effective_size(const std::vector<double>& log_w) {
  std::vector<double> twice(log_w.size());
  for (size_t i = 0; i < log_w.size(); ++i) twice[i] = 2 * log_w[i];
  return std::exp(2 * log_sum_exp(log_w) - log_sum_exp(twice));
}

// The conditional effective sample size of a step (Zhou, Johansen & Aston 2016), n·(Σ W_i w_i)²/Σ W_i w_i²,
// for the carried normalised weights W = exp(log_W) and the step's incremental weights exp(log_w).
double conditional_effective_size(const std::vector<double>& log_W, const std::vector<double>& log_w) {
  std::vector<double> once(log_w.size()), twice(log_w.size());
  for (size_t i = 0; i < log_w.size(); ++i) once[i] = log_W[i] + log_w[i], twice[i] = log_W[i] + 2 * log_w[i];
  return double(log_w.size()) * std::exp(2 * log_sum_exp(once) - log_sum_exp(twice));
}

// The carried log weights times the step's incremental weights, normalised to sum to 1; returns the
// log of the step's weighted mean Σ W_i w_i, the factor it contributes to the normaliser.
double reweight(std::vector<double>& log_W, const std::vector<double>& log_w) {
  for (size_t i = 0; i < log_W.size(); ++i) log_W[i] += log_w[i];
  const double factor = log_sum_exp(log_W);
  for (double& v : log_W) v -= factor;
  return factor;
}

// Multinomial resampling: n indices drawn with probabilities ∝ exp(log_w), by sorted uniforms.
void resample(Population& p, const std::vector<double>& log_w, Generator& gen) {
  const double total = log_sum_exp(log_w);
  std::vector<double> cumulative(size_t(p.n));
  double sum = 0;
  for (int64_t i = 0; i < p.n; ++i) cumulative[size_t(i)] = sum += std::exp(log_w[size_t(i)] - total);
  const std::vector<float> draw = uniform({p.n}, 0.0f, 1.0f, gen).to_vector();
  std::vector<double> points(draw.begin(), draw.end());
  std::sort(points.begin(), points.end());
  Population next = p;
  int64_t k = 0;
  for (int64_t i = 0; i < p.n; ++i) {
    const double x = points[size_t(i)] * sum;
    while (k + 1 < p.n && cumulative[size_t(k)] <= x) ++k;
    std::copy_n(p.u.begin() + k * p.m, p.m, next.u.begin() + i * p.m);
    std::copy_n(p.values.begin() + k * p.width, p.width, next.values.begin() + i * p.width);
    next.log_h[size_t(i)] = p.log_h[size_t(k)], next.log_q[size_t(i)] = p.log_q[size_t(k)];
  }
  p = std::move(next);
}

// One Metropolis sweep at β over the law ∝ q^(1−β)·h^β. A random-walk sweep (step > 0): every
// particle proposes (u + step·ξ)/|u + step·ξ|, ξ ~ N(0, I), whose density depends on the angle
// between u and u' alone (symmetric), accepted with min(1, π_β(u')/π_β(u)). An independence sweep
// (step 0): every particle proposes a fresh draw from the base law q, accepted with
// min(1, π_β(u')·q(u) / (π_β(u)·q(u'))) = min(1, ((h/q)(u') / (h/q)(u))^β), which lets a particle
// jump between distant peaks the random walk would take many rungs to cross. Either leaves π_β
// invariant. Returns the share accepted.
double metropolis_sweep(Population& p, double beta, double step, const DirectionIntegrands& integrands, const DirectionProposal& base,
                        Generator& gen, int64_t& evaluations, std::vector<char>* moved = nullptr) {
  Population trial = p;
  if (step > 0) {
    const std::vector<float> xi = normal({p.n, p.m}, 0.0f, 1.0f, gen).to_vector();
    for (int64_t i = 0; i < p.n; ++i) {
      double norm = 0;
      for (int64_t j = 0; j < p.m; ++j) {
        const size_t at = size_t(i * p.m + j);
        trial.u[at] = p.u[at] + step * double(xi[at]), norm += trial.u[at] * trial.u[at];
      }
      norm = std::sqrt(norm);
      for (int64_t j = 0; j < p.m; ++j) trial.u[size_t(i * p.m + j)] /= norm;
    }
  } else {
    trial.u = base.sample(p.n, gen);
  }
  set_values(trial, integrands(trial.u, p.n), base);
  evaluations += p.n;
  const std::vector<float> accept = uniform({p.n}, 0.0f, 1.0f, gen).to_vector();
  int64_t accepted = 0;
  for (int64_t i = 0; i < p.n; ++i) {
    const size_t k = size_t(i);
    const double log_ratio = step > 0 ? (1 - beta) * (trial.log_q[k] - p.log_q[k]) + beta * (trial.log_h[k] - p.log_h[k])
                                      : beta * ((trial.log_h[k] - trial.log_q[k]) - (p.log_h[k] - p.log_q[k]));
    if (!(std::log(double(accept[k])) < log_ratio)) continue;
    ++accepted;
    if (moved) (*moved)[k] = 1;
    std::copy_n(trial.u.begin() + i * p.m, p.m, p.u.begin() + i * p.m);
    std::copy_n(trial.values.begin() + i * p.width, p.width, p.values.begin() + i * p.width);
    p.log_h[k] = trial.log_h[k], p.log_q[k] = trial.log_q[k];
  }
  return double(accepted) / double(p.n);
}

void check_plan(const TemperingPlan& plan, int64_t dimension) {
  check(dimension >= 2, "tempering: directions need at least 2 dimensions, got ", dimension);
  check(plan.particles >= 2 && plan.moves >= 1, "tempering: needs at least 2 particles and 1 move a rung, got ", plan.particles,
        " and ", plan.moves);
  check(plan.ess_share > 0 && plan.ess_share < 1, "tempering: the effective-size share must be in (0, 1), got ", plan.ess_share);
  check(plan.resample_share > 0 && plan.resample_share <= 1, "tempering: the resampling share must be in (0, 1], got ",
        plan.resample_share);
  check(plan.moved_share >= 0 && plan.moved_share <= 1 && plan.max_moves >= plan.moves,
        "tempering: the moved share must be in [0, 1] and max_moves at least moves, got ", plan.moved_share, " and ", plan.max_moves);
  check(plan.min_rungs >= 1 && plan.max_rungs >= plan.min_rungs, "tempering: min_rungs must be at least 1 and at most max_rungs, got ",
        plan.min_rungs, " and ", plan.max_rungs);
}

// The longest step: beyond it a proposal is nearly a fresh uniform direction.
constexpr double kLongestStep = 4.0;

}  // namespace

TemperingSchedule tempering_schedule(const DirectionProposal& base, const DirectionIntegrands& integrands, const TemperingPlan& plan,
                                     Generator& gen, int64_t* evaluations, const std::function<void(double)>& progress) {
  check_plan(plan, base.dimension);
  int64_t spent = plan.particles;
  Population p = start(plan.particles, integrands, base, gen);
  const double flat = -std::log(double(plan.particles));
  std::vector<double> log_W(size_t(plan.particles), flat);  // the carried weights, normalised
  TemperingSchedule s;
  s.betas = {0.0}, s.steps = {0.0}, s.sweeps = {0}, s.resample = {0};
  double step = kLongestStep;
  const double wanted = plan.ess_share * double(plan.particles);
  while (s.betas.back() < 1) {
    check(int(s.betas.size()) <= plan.max_rungs, "tempering: the ladder reached ", plan.max_rungs, " rungs at β = ", s.betas.back(),
          " (the target is too peaked for ", plan.particles, " particles)");
    const double beta = s.betas.back();
    // The next β: where the step's conditional effective size falls to the wanted share, by
    // bisection (the size falls as the step grows), at most 1/min_rungs above this one.
    const double longest = std::min(1 - beta, 1.0 / plan.min_rungs);
    double next = beta + longest;
    if (conditional_effective_size(log_W, log_weights(p, longest)) < wanted) {
      double low = 0, high = longest;
      for (int i = 0; i < 60; ++i) {
        const double mid = (low + high) / 2;
        (conditional_effective_size(log_W, log_weights(p, mid)) >= wanted ? low : high) = mid;
      }
      next = beta + std::max(low, 1e-12);
    }
    s.betas.push_back(next);
    if (next >= 1 - 1e-12) {
      s.betas.back() = 1, s.steps.push_back(step), s.sweeps.push_back(0), s.resample.push_back(0);
      break;
    }
    reweight(log_W, log_weights(p, next - beta));
    const bool resampled = effective_size(log_W) < plan.resample_share * double(plan.particles);
    if (resampled) resample(p, log_W, gen), std::fill(log_W.begin(), log_W.end(), flat);
    // The random walk's step tuned toward the wanted acceptance over the rung's sweeps (the last
    // value is kept); sweeps on past `moves` until the wanted share of particles has moved.
    std::vector<char> moved(size_t(plan.particles), 0);
    auto moved_share = [&] { return double(std::count(moved.begin(), moved.end(), 1)) / double(plan.particles); };
    int sweep = 0;
    for (; sweep < plan.max_moves && (sweep < plan.moves || moved_share() < plan.moved_share); ++sweep) {
      if (sweep % 2 == 1) {
        metropolis_sweep(p, next, 0, integrands, base, gen, spent, &moved);
        continue;
      }
      const double rate = metropolis_sweep(p, next, step, integrands, base, gen, spent, &moved);
      step = std::clamp(step * std::exp(2 * (rate - plan.acceptance)), 1e-6, kLongestStep);
    }
    s.steps.push_back(step), s.sweeps.push_back(sweep), s.resample.push_back(resampled ? 1 : 0);
    if (progress) progress(next);
  }
  if (evaluations) *evaluations += spent;
  return s;
}

TemperedRun tempered_run(const DirectionProposal& base, const DirectionIntegrands& integrands, const TemperingSchedule& schedule,
                         const TemperingPlan& plan, Generator& gen, const std::function<void(double)>& progress) {
  check_plan(plan, base.dimension);
  const size_t size = schedule.betas.size();
  check(size >= 2 && schedule.betas.front() == 0 && schedule.betas.back() == 1 && schedule.steps.size() == size &&
            schedule.sweeps.size() == size && schedule.resample.size() == size,
        "tempering: a schedule runs from β = 0 to β = 1 with a step, sweeps and a resampling flag at each rung");
  TemperedRun run;
  run.evaluations = plan.particles;
  Population p = start(plan.particles, integrands, base, gen);
  const int64_t K = p.width - 1;
  const size_t rungs = size - 1;
  const double flat = -std::log(double(plan.particles));
  std::vector<double> log_W(size_t(plan.particles), flat);
  double acceptance = 0;
  int64_t sweeps = 0;
  for (size_t t = 1; t <= rungs; ++t) {
    run.log_normaliser += reweight(log_W, log_weights(p, schedule.betas[t] - schedule.betas[t - 1]));
    if (t == rungs) {
      // E_u[φ] = Z_L·E_{π_L}[φ/h], as γ_L = h: the normaliser times the weighted mean of φ/h.
      run.integrals.assign(size_t(K), 0.0);
      for (int64_t i = 0; i < p.n; ++i) {
        const double W = std::exp(log_W[size_t(i)]), h = p.values[size_t(i * p.width)];
        if (!(h > 0)) continue;  // W·φ/h with φ bounded by h: 0 where h is
        for (int64_t k = 0; k < K; ++k) run.integrals[size_t(k)] += W * p.values[size_t(i * p.width + 1 + k)] / h;
      }
      const double scale = std::exp(run.log_normaliser);
      for (double& v : run.integrals) v *= scale;
      break;
    }
    if (schedule.resample[t]) resample(p, log_W, gen), std::fill(log_W.begin(), log_W.end(), flat);
    for (int sweep = 0; sweep < schedule.sweeps[t]; ++sweep, ++sweeps)
      acceptance += metropolis_sweep(p, schedule.betas[t], sweep % 2 == 1 ? 0.0 : schedule.steps[t], integrands, base, gen,
                                     run.evaluations);
    if (progress) progress(double(t) / double(rungs));
  }
  run.acceptance = sweeps > 0 ? acceptance / double(sweeps) : 1.0;
  return run;
}

}  // namespace adjoint
