// Tempering over directions (analysis/similarity/tempered_directions.h) on targets whose
// integral over the sphere is known in closed form: several sharp peaks of different masses,
// which a single run must meet together, and whose masses its particles must share out right.
#include <doctest/doctest.h>

#include <cmath>
#include <vector>

#include "analysis/similarity/tempered_directions.h"

using namespace adjoint;

namespace {

// E[u_1^(2p)] for u uniform on the unit sphere of R^m: Γ(p + ½)·Γ(m/2) / (Γ(½)·Γ(m/2 + p)).
double sphere_moment(int64_t m, int p) {
  return std::exp(std::lgamma(p + 0.5) + std::lgamma(0.5 * double(m)) - std::lgamma(0.5) - std::lgamma(0.5 * double(m) + p));
}

// h(u) = Σ_k c_k·u_k^(2p) over the first `peaks` axes (a peak at ±e_k of mass c_k·E[u_1^(2p)]);
// the integrands: h itself, then the first peak's term alone.
DirectionIntegrands peaked(int64_t m, int peaks, int p) {
  return [=](const std::vector<double>& u, int64_t n) {
    std::vector<double> v(size_t(n * 3), 0.0);
    for (int64_t i = 0; i < n; ++i) {
      for (int k = 0; k < peaks; ++k) {
        const double term = double(k + 1) * std::pow(u[size_t(i * m + k)], 2 * p);
        v[size_t(i * 3)] += term, v[size_t(i * 3 + 1)] += term;
        if (k == 0) v[size_t(i * 3 + 2)] = term;
      }
    }
    return v;
  };
}

struct Replicates {
  double mean = 0, se = 0;
};
Replicates summary(const std::vector<double>& x) {
  Replicates r;
  for (double v : x) r.mean += v / double(x.size());
  double squares = 0;
  for (double v : x) squares += (v - r.mean) * (v - r.mean);
  r.se = std::sqrt(squares / double(x.size() - 1) / double(x.size()));
  return r;
}

}  // namespace

TEST_CASE("tempering over directions: replicate runs estimate the mass of six sharp peaks, and each peak's share") {
  // Six peaks u_k^40 in 12 dimensions, masses 1…6 times E[u_1^40] (about 10⁻¹⁵ of a peak's height:
  // uniform directions essentially never meet them). 12 runs along one pilot's schedule.
  const int64_t m = 12;
  const int peaks = 6, p = 20;
  const DirectionIntegrands f = peaked(m, peaks, p);
  const double one = sphere_moment(m, p), total = 21 * one;
  TemperingPlan plan;
  plan.particles = 1024;
  Generator gen(7);
  const DirectionProposal uniform = DirectionProposal::uniform(m);
  const TemperingSchedule schedule = tempering_schedule(uniform, f, plan, gen);
  CHECK(schedule.betas.size() >= size_t(plan.min_rungs + 1));
  std::vector<double> all, first;
  for (int run = 0; run < 12; ++run) {
    const TemperedRun r = tempered_run(uniform, f, schedule, plan, gen);
    REQUIRE(r.integrals.size() == 2);
    CHECK(r.integrals[0] == doctest::Approx(std::exp(r.log_normaliser)).epsilon(1e-9));  // φ = h: the normaliser itself
    all.push_back(r.integrals[0] / total), first.push_back(r.integrals[1] / one);
  }
  const Replicates mass = summary(all), share = summary(first);
  MESSAGE("total mass / exact ", mass.mean, " ± ", mass.se, "; first peak's / exact ", share.mean, " ± ", share.se);
  // Student's t at 11 degrees of freedom, 99%: 3.11. The total is known to a few percent; a single
  // peak's share far less well (which peaks the particles settle on is fixed early, while the
  // peaks are still broad, and reweighting corrects it at the cost of variance), but without bias.
  CHECK(std::abs(mass.mean - 1) <= 3.11 * mass.se);
  CHECK(std::abs(share.mean - 1) <= 3.11 * share.se);
  CHECK(mass.se < 0.08);
  CHECK(share.se < 0.35);
}

TEST_CASE("tempering over directions: the pilot resamples only where the weights collapsed, and sweeps on where particles stay put") {
  // The six peaks again, two ways at about the same evaluations: resampling at every rung with
  // `moves` sweeps (3 584 particles), and the adaptive schedule (1 024): resampling only where the
  // carried weights' ESS fell below half, sweeping on until 90% of the particles have moved.
  const int64_t m = 12;
  const DirectionIntegrands f = peaked(m, 6, 20);
  const double one = sphere_moment(m, 20), total = 21 * one;
  const DirectionProposal uniform = DirectionProposal::uniform(m);
  Replicates mass[2], share[2];
  double evaluations[2] = {0, 0};
  for (const int adaptive : {0, 1}) {
    TemperingPlan plan;
    plan.particles = adaptive ? 1024 : 3584;
    if (!adaptive) plan.resample_share = 1, plan.moved_share = 0;
    Generator gen(7);
    const TemperingSchedule schedule = tempering_schedule(uniform, f, plan, gen);
    int resampled = 0, extra = 0;
    for (size_t t = 1; t + 1 < schedule.betas.size(); ++t) resampled += schedule.resample[t], extra += schedule.sweeps[t] > plan.moves;
    const int moving_rungs = int(schedule.betas.size()) - 2;  // the last rung neither resamples nor moves
    CHECK(schedule.sweeps.back() == 0);
    if (adaptive) {
      CHECK(resampled < moving_rungs / 2);
      CHECK(extra > 0);
    } else {
      CHECK(resampled == moving_rungs);
      CHECK(extra == 0);
    }
    std::vector<double> all, first;
    for (int run = 0; run < 12; ++run) {
      const TemperedRun r = tempered_run(uniform, f, schedule, plan, gen);
      all.push_back(r.integrals[0] / total), first.push_back(r.integrals[1] / one), evaluations[adaptive] += double(r.evaluations) / 12;
    }
    mass[adaptive] = summary(all), share[adaptive] = summary(first);
    const std::string name = adaptive ? "adaptive" : "every rung";
    MESSAGE(name, ": ", moving_rungs, " rungs moved, resampled at ", resampled,
            ", ", extra, " with extra sweeps, ", evaluations[adaptive], " evaluations a run; mass / exact ", mass[adaptive].mean, " ± ",
            mass[adaptive].se, ", first peak's ", share[adaptive].mean, " ± ", share[adaptive].se);
    CHECK(std::abs(mass[adaptive].mean - 1) <= 3.11 * mass[adaptive].se);
    CHECK(std::abs(share[adaptive].mean - 1) <= 3.11 * share[adaptive].se);
  }
  CHECK(evaluations[1] < 1.2 * evaluations[0]);
  // At about the same cost, the adaptive schedule's runs agree more closely.
  CHECK(mass[1].se < 0.6 * mass[0].se);
  CHECK(share[1].se < 0.6 * share[0].se);
}
