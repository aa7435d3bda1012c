// Integrals over directions by sequential Monte Carlo through tempered targets (docs/methods.md
// §3.3, "Tempering over directions"): where a direction's weight h(u) has many sharp peaks, a
// search for them one at a time misses some, and a proposal built from those found leaves their
// mass out. A population of directions is carried instead from a base law q (β = 0: the uniform
// law, or a proposal fitted to the peaks found) to the law ∝ h(u) (β = 1) through the tempered
// laws ∝ q(u)^(1−β)·h(u)^β, reweighted, resampled and moved by
// Metropolis steps at each rung, so that mass anywhere on the sphere is met while the target is
// still flat enough to reach it, and the particles settle on each peak in proportion to its mass.
//
// The estimate of a run is unbiased: the product of the rungs' mean incremental weights is an
// unbiased estimate of the normaliser E_u[h(u)] (Del Moral, Doucet & Jasra 2006), and the last
// rung's weighted particles give one of E_u[φ(u)] for any φ with |φ|/h bounded. Unbiased only for
// a ladder and steps fixed in advance: they are read off a pilot run (adaptive: each rung's β
// where the incremental weights' effective sample size falls to a set share, each step size
// tuned toward a set acceptance), which the estimate then sets aside. Its error bar comes from
// independent replicate runs, their spread, not a run's own variance estimate (which a missed
// peak would make too small in the same way in every draw of one run).
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "analysis/similarity/direction_proposal.h"
#include "engine/random.h"

namespace adjoint {

// For `n` unit vectors of R^m (rows of `directions`): n rows of 1 + K values, the tempering
// target h(u) > 0 first, then the K integrands φ_k(u), each with |φ_k| ≤ c·h.
using DirectionIntegrands = std::function<std::vector<double>(const std::vector<double>& directions, int64_t n)>;

struct TemperingPlan {
  int64_t particles = 256;
  int moves = 4;                // Metropolis sweeps over the population at each rung, alternately a random walk and draws from the base law
  // The pilot's next β: where the conditional effective sample size of the step (Zhou, Johansen &
  // Aston 2016), N·(Σ W_i w_i)²/Σ W_i w_i² for the carried normalised weights W and the step's
  // incremental weights w, falls to this share of the particles. It measures the step alone,
  // whatever the weights carried from earlier rungs; with W uniform it is the ESS of w.
  double ess_share = 0.5;
  // The particles are resampled only where the carried weights' ESS, (Σ W)²/Σ W², has fallen
  // below this share (1: at every rung): resampling a nearly flat population only duplicates
  // particles and spends the diversity the early rungs need to meet every peak.
  double resample_share = 0.5;
  // More sweeps where the population collapsed: the pilot sweeps each rung at least `moves` times,
  // and on until this share of the particles has moved (accepted a proposal) since the rung
  // began, at most max_moves sweeps. Duplicates left by a resampling that no sweep moved are
  // still one particle.
  double moved_share = 0.9;
  int max_moves = 16;
  double acceptance = 0.25;     // the pilot tunes each rung's step toward this acceptance rate
  // No rung raises β by more than 1/min_rungs: where the particles have not yet met the peaks
  // (a flat sample, whose weights keep a high effective size), the effective-size rule alone would
  // jump to β = 1 at once; small steps let the moves climb toward the peaks as the law sharpens.
  int min_rungs = 32;
  int max_rungs = 400;
};

// The ladder 0 = β_0 < β_1 < … < β_L = 1 and the Metropolis step length at each rung (step[t]
// moves the particles at rung t, t ≥ 1): a proposal u' = (u + step·ξ)/|u + step·ξ|, ξ ~ N(0, I);
// whether the particles are resampled at rung t, and the sweeps there (each entry 0 at t = 0).
struct TemperingSchedule {
  std::vector<double> betas, steps;
  std::vector<int> sweeps;
  std::vector<char> resample;
};

struct TemperedRun {
  std::vector<double> integrals;  // the K estimates of E_u[φ_k(u)], u uniform on the sphere
  double log_normaliser = 0;      // log of the estimate of E_u[h(u)]
  int64_t evaluations = 0;        // directions whose integrands were computed
  double acceptance = 0;          // the mean Metropolis acceptance rate over the rungs
};

// The law tempering starts from (β = 0) is `base`, a density q relative to the uniform law on
// the sphere of base.dimension (DirectionProposal::uniform, or a proposal fitted to peaks already
// found, which the population then starts on): the tempered laws are ∝ q^(1−β)·h^β, and the
// normaliser at β = 0 is exactly 1. Each rung's sweeps alternate a random walk and fresh draws
// from q (an independence sampler), each a Metropolis step that leaves the rung's law invariant.

// The pilot: an adaptive run whose ladder and steps are returned (its estimate is not).
// `progress`, when given, hears β reached.
TemperingSchedule tempering_schedule(const DirectionProposal& base, const DirectionIntegrands& integrands, const TemperingPlan& plan,
                                     Generator& gen, int64_t* evaluations = nullptr,
                                     const std::function<void(double beta)>& progress = {});

// One run along a fixed schedule: an unbiased estimate of each integral. `progress`, when given,
// hears the share of rungs done.
TemperedRun tempered_run(const DirectionProposal& base, const DirectionIntegrands& integrands, const TemperingSchedule& schedule,
                         const TemperingPlan& plan, Generator& gen, const std::function<void(double share)>& progress = {});

}  // namespace adjoint
