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
                        Generator& gen, int64_t& evaluations) {
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
  TemperingSchedule s;
  s.betas = {0.0}, s.steps = {0.0};
  double step = kLongestStep;
  const double wanted = plan.ess_share * double(plan.particles);
  while (s.betas.back() < 1) {
    check(int(s.betas.size()) <= plan.max_rungs, "tempering: the ladder reached ", plan.max_rungs, " rungs at β = ", s.betas.back(),
          " (the target is too peaked for ", plan.particles, " particles)");
    const double beta = s.betas.back();
    // The next β: where the incremental weights' effective size falls to the wanted share, by
    // bisection (the size falls as the step grows), at most 1/min_rungs above this one.
    const double longest = std::min(1 - beta, 1.0 / plan.min_rungs);
    double next = beta + longest;
    if (effective_size(log_weights(p, longest)) < wanted) {
      double low = 0, high = longest;
      for (int i = 0; i < 60; ++i) {
        const double mid = (low + high) / 2;
        (effective_size(log_weights(p, mid)) >= wanted ? low : high) = mid;
      }
      next = beta + std::max(low, 1e-12);
    }
    s.betas.push_back(next);
    if (next >= 1 - 1e-12) {
      s.betas.back() = 1, s.steps.push_back(step);
      break;
    }
    resample(p, log_weights(p, next - beta), gen);
    // The random walk's step tuned toward the wanted acceptance over the rung's sweeps; the last
    // value is kept.
    for (int sweep = 0; sweep < plan.moves; ++sweep) {
      if (sweep % 2 == 1) {
        metropolis_sweep(p, next, 0, integrands, base, gen, spent);
        continue;
      }
      const double rate = metropolis_sweep(p, next, step, integrands, base, gen, spent);
      step = std::clamp(step * std::exp(2 * (rate - plan.acceptance)), 1e-6, kLongestStep);
    }
    s.steps.push_back(step);
    if (progress) progress(next);
  }
  if (evaluations) *evaluations += spent;
  return s;
}

TemperedRun tempered_run(const DirectionProposal& base, const DirectionIntegrands& integrands, const TemperingSchedule& schedule,
                         const TemperingPlan& plan, Generator& gen, const std::function<void(double)>& progress) {
  check_plan(plan, base.dimension);
  check(schedule.betas.size() >= 2 && schedule.betas.front() == 0 && schedule.betas.back() == 1 &&
            schedule.steps.size() == schedule.betas.size(),
        "tempering: a schedule runs from β = 0 to β = 1 with a step at each rung");
  TemperedRun run;
  run.evaluations = plan.particles;
  Population p = start(plan.particles, integrands, base, gen);
  const int64_t K = p.width - 1;
  const size_t rungs = schedule.betas.size() - 1;
  double acceptance = 0;
  for (size_t t = 1; t <= rungs; ++t) {
    const std::vector<double> log_w = log_weights(p, schedule.betas[t] - schedule.betas[t - 1]);
    if (t == rungs) {
      // E_u[φ] = Z_{L−1}·(the mean over the particles of w·φ/h), as γ_L = h; each term in the log
      // scale's range.
      const double top = *std::max_element(log_w.begin(), log_w.end());
      run.integrals.assign(size_t(K), 0.0);
      for (int64_t i = 0; i < p.n; ++i) {
        const double w = std::exp(log_w[size_t(i)] - top), h = p.values[size_t(i * p.width)];
        if (!(h > 0)) continue;  // w·φ/h with φ bounded by h: 0 where h is
        for (int64_t k = 0; k < K; ++k) run.integrals[size_t(k)] += w * p.values[size_t(i * p.width + 1 + k)] / h;
      }
      const double scale = std::exp(run.log_normaliser + top) / double(p.n);
      for (double& v : run.integrals) v *= scale;
    }
    run.log_normaliser += log_sum_exp(log_w) - std::log(double(p.n));
    if (t == rungs) break;
    resample(p, log_w, gen);
    for (int sweep = 0; sweep < plan.moves; ++sweep)
      acceptance += metropolis_sweep(p, schedule.betas[t], sweep % 2 == 1 ? 0.0 : schedule.steps[t], integrands, base, gen,
                                     run.evaluations);
    if (progress) progress(double(t) / double(rungs));
  }
  run.acceptance = rungs > 1 ? acceptance / double((rungs - 1) * size_t(plan.moves)) : 1.0;
  return run;
}

}  // namespace adjoint
