// Importance sampling over directions on the unit sphere (docs/methods.md §3.3, "Importance
// sampling over directions"): where a polynomial's radial means are sharply peaked in a few
// directions, drawing those directions more often and weighting each draw by uniform/proposal
// keeps the estimate unbiased and tames the tail that uniform directions leave.
//
// The proposal is a defensive mixture q = α·uniform + (1 − α)·Σ_k π_k·PN_k of projected normals:
// PN(μ, s) is the law of z/|z| for z ~ N(±s·μ, I) (or a shaped covariance, below), either sign with probability 1/2, so that u and
// −u have the same density, as the radial rule (which integrates a direction and its opposite
// together) wants. Its density relative to the uniform law on the sphere S^{m−1} is exact in
// closed form: for z ~ N(±s·μ, I), with a = s·μ·u,
//     area(S^{m−1})·(2π)^{−m/2}·e^{−(s² − a²)/2}·J_{m−1}(a),  J_k(a) = ∫_0^∞ r^k e^{−(r−a)²/2} dr,
// averaged over the two signs, so the exact mixture density enters every weight, and the uniform
// share bounds each weight by 1/α. Near ±μ it falls like a Gaussian in the angle (an angular
// central Gaussian would fall like a Cauchy law there, putting little of its mass on the peak).
// Each component is the Laplace fit of one of the target's peaks: centred on the peak a climb
// converged to, with z's covariance shaped so that the component's angular log density has the
// peak's own curvature, in every tangent direction (from the full tangent Hessian of log h),
// widened by a safety factor; the shares follow where the target's mass lies.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/random.h"

namespace adjoint {

struct ProjectedNormal {
  std::vector<double> mean;  // μ, a unit vector
  double distance = 0;       // s
  // z's precision is I + Σ_j (λ_j − 1)·e_j e_jᵀ for the unit tangent axes e_j (orthogonal to μ and
  // to each other; rows of `axes`, m entries each) and λ_j = `precisions`; empty: z ~ N(±s·μ, I).
  // With the general precision P the density relative to the uniform law keeps its closed form:
  // with A = uᵀPu and a = s·μ·u/√A, area(S^{m−1})·(2π)^{−m/2}·|P|^{1/2}·A^{−m/2}·e^{−(s² − a²)/2}·J_{m−1}(a).
  std::vector<double> axes;
  std::vector<double> precisions;
};
// log Σ exp(v_i), without overflow (the largest term factored out); −∞ for no finite term.
double log_sum_exp(const std::vector<double>& v);

// log of PN(μ, s)'s density relative to the uniform law, at the unit vector u of R^m.
double log_density(const ProjectedNormal& component, const double* u, int64_t m);

struct DirectionProposal {
  int64_t dimension = 0;             // m: directions are unit vectors of R^m
  double uniform_share = 1;          // α; 1 is the uniform law alone
  std::vector<double> shares;        // π_k, summing to 1
  std::vector<ProjectedNormal> components;

  static DirectionProposal uniform(int64_t dimension);
  // `n` directions, as rows of `dimension` entries.
  std::vector<double> sample(int64_t n, Generator& gen) const;
  // q(u) relative to the uniform law on the sphere, for each of the `n` rows (unit vectors).
  std::vector<double> density(const std::vector<double>& directions, int64_t n) const;
};

// The adaptation (docs/methods.md §3.3). From directions already drawn uniformly and their
// target values, `peaks` climbs from the highest find the target's peaks: an evolution strategy
// of `climb_steps` rounds of `climb_candidates` brings each near a peak, then quasi-Newton ascent
// (BFGS on log h in a chart of the sphere, gradients by central differences) runs until the
// height it can still gain, ½·gᵀH⁻¹g and ½·|g|², is below `ascent_tolerance` (in log h), or for
// at most `ascent_steps` steps. At each peak the full tangent Hessian of log h (finite differences,
// (m − 1)·m/2 + m directions) gives the component's shape, its precision divided by
// `widening`; the mixture's shares are each part's share of the target's mass, over
// `share_draws` draws from the mixture in each of `share_rounds` rounds, the uniform share at
// least `uniform_floor`. Then, for up to `refine_rounds` rounds, climbs from the highest weights
// h/q of `refine_draws` draws from the mixture (up to `peaks` a round, `max_peaks` in all) add the
// peaks it misses; where they find none, it stops if the weights' Pareto tail shape is below
// `refine_shape`, and otherwise refits the components nearest the highest weights twice as wide.
// No climb or round starts once the adaptation has spent `budget` times the explored directions
// (0: no bound): in m dimensions a peak costs about m²/2 directions for its Hessian alone.
struct ProposalPlan {
  int peaks = 4;
  int max_peaks = 32;
  int refine_rounds = 8;
  int64_t refine_draws = 2048;
  double refine_shape = 0.5;
  double budget = 16;
  int climb_steps = 40;
  int64_t climb_candidates = 16;
  int ascent_steps = 60;
  double ascent_tolerance = 1e-3;
  double widening = 1.5;
  int64_t share_draws = 512;
  int share_rounds = 3;
  double uniform_floor = 0.1;
};

// What the adaptation did: the directions it spent, the peaks found (none: the proposal is the
// uniform law), and how many of their ascents did not converge.
struct ProposalFit {
  DirectionProposal proposal;
  int64_t draws = 0;
  int peaks = 0;
  int unconverged = 0;  // peaks whose ascent stopped at ascent_steps, short of its tolerance
  // Whether the search ended because it found no new peak and the weights' tail was light; false
  // where the rounds, the peaks or the budget ran out first (mass it did not find may remain).
  bool settled = false;
};

// Adapts a proposal toward `target(directions, n)`, a non-negative function of each of `n` rows
// (unit vectors of R^m), up to a constant factor, from `explored` uniform directions (rows of
// `directions`) and their target values. Uses only its own draws and those given: an estimate
// that then samples fresh directions from the result stays unbiased.
ProposalFit adapt_direction_proposal(int64_t dimension,
                                     const std::function<std::vector<double>(const std::vector<double>&, int64_t)>& target,
                                     const std::vector<double>& directions, const std::vector<double>& values, int64_t explored,
                                     const ProposalPlan& plan, Generator& gen);

}  // namespace adjoint
