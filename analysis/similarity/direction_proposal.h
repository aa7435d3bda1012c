// Importance sampling over directions on the unit sphere (docs/methods.md §3.3, "Importance
// sampling over directions"): where a polynomial's radial means are sharply peaked in a few
// directions, drawing those directions more often and weighting each draw by uniform/proposal
// keeps the estimate unbiased and tames the tail that uniform directions leave.
//
// The proposal is a defensive mixture q = α·uniform + (1 − α)·Σ_k π_k·PN_k of projected normals:
// PN(μ, s) is the law of z/|z| for z ~ N(±s·μ, I), either sign with probability 1/2, so that u and
// −u have the same density, as the radial rule (which integrates a direction and its opposite
// together) wants. Its density relative to the uniform law on the sphere S^{m−1} is exact in
// closed form: with a = s·μ·u,
//     area(S^{m−1})·(2π)^{−m/2}·e^{−(s² − a²)/2}·J_{m−1}(a),  J_k(a) = ∫_0^∞ r^k e^{−(r−a)²/2} dr,
// averaged over the two signs, so the exact mixture density enters every weight, and the uniform
// share bounds each weight by 1/α. Near ±μ it falls like a Gaussian in the angle (an angular
// central Gaussian would fall like a Cauchy law there, putting little of its mass on the peak).
// The components sit at the target's peaks, each as wide as its peak's flattest direction (a
// Laplace approximation made conservative), and the shares follow where the target's mass lies.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/random.h"

namespace adjoint {

struct ProjectedNormal {
  std::vector<double> mean;  // μ, a unit vector
  double distance = 0;       // s
};
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
// target values, `peaks` climbs from the highest (an evolution strategy of `climb_steps` rounds
// of `climb_candidates`) find the target's peaks; at each, the curvature in its flattest
// direction, from `curvature_directions` random tangents, sizes a component; the mixture's
// shares are each part's share of the target's mass, over `share_draws` draws from the mixture
// in each of `share_rounds` rounds, the uniform share at least `uniform_floor`.
struct ProposalPlan {
  int peaks = 4;
  int climb_steps = 40;
  int64_t climb_candidates = 16;
  int64_t curvature_directions = 8;
  int64_t share_draws = 512;
  int share_rounds = 3;
  double uniform_floor = 0.1;
};

// What the adaptation did: the directions it spent, the peaks found (none: the proposal is the
// uniform law).
struct ProposalFit {
  DirectionProposal proposal;
  int64_t draws = 0;
  int peaks = 0;
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
