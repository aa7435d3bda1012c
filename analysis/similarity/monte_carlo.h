// The Gaussian-metric inner products of two polynomial networks estimated by sampling: N
// inputs x ~ N(0, input_std²·I) through both networks' polynomials (models/polynomial.h,
// the forward's own arithmetic in double precision), with standard errors. What
// `adjoint tensorsim --check-mc N` prints beside the closed form, and the tests' reference.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "analysis/similarity/direction_proposal.h"
#include "analysis/similarity/tempered_directions.h"
#include "models/polynomial.h"

namespace adjoint {

struct MonteCarloSimilarity {
  int64_t samples = 0;
  double similarity = 0, similarity_se = 0;
  double inner_ab = 0, inner_ab_se = 0, inner_aa = 0, inner_aa_se = 0, inner_bb = 0, inner_bb_se = 0;
  // Per output feature (class, token), summed over positions, like the closed forms' slices.
  std::vector<double> slices, slice_se;
  // Sized estimates: whether the control variate was used (in any of the three inner products),
  // and the draws spent fitting it; per inner product, whether its estimate kept the control
  // variate (the tail diagnostic read its residuals within the bar) or fell back to its raw draws.
  bool control_variate = false;
  bool controlled_ab = false, controlled_aa = false, controlled_bb = false;
  int64_t pilot_samples = 0;
  // Sized estimates: the radial rule's points per draw (0: plain sampling, a draw is one input;
  // otherwise `samples` counts directions), the network evaluations spent in all, and the
  // largest draw's share of the sample variance, the largest over the three inner products.
  int radial_points = 0;
  int64_t evaluations = 0;
  double tail_share = 0;
  // The self terms' effective number of draws, (Σ x)²/Σ x² over the draws x of |f_a|² and of |f_b|²
  // (each positive), the smaller: N for draws alike, near 1 where one draw carries the mean.
  double effective_draws = 0;
  // Importance sampling over directions (direction_proposal.h): whether the directions came from
  // a fitted proposal, the peaks it found and the directions it spent (within evaluations).
  bool importance = false;
  int proposal_peaks = 0, proposal_unconverged = 0;  // peaks whose ascent stopped short of its tolerance
  int64_t proposal_draws = 0;
  // Where a proposal was fitted and MonteCarloPlan::choose_by_pilot: whether its pilot lost to the
  // uniform run (the estimate then drew fresh uniform directions), and both pilots' Pareto shapes
  // (NaN where no choice was made).
  bool proposal_declined = false;
  bool proposal_settled = false;  // ProposalFit::settled; an estimate from an unsettled proposal is marked
  double uniform_pilot_shape = NAN, proposal_pilot_shape = NAN;
  // Where the first uniform run was marked and MonteCarloPlan::recheck_uniform: a second uniform
  // run of as many draws, set aside, was read (its Pareto shape; NaN where none), and whether it
  // was unmarked, so that the estimate drew fresh uniform directions without adapting a proposal.
  bool uniform_rechecked = false, recheck_cleared = false;
  double recheck_pareto_shape = NAN;
  // The directions the recheck set aside (within evaluations): the second run, and where it
  // cleared, the first (otherwise the first counts in proposal_draws where a proposal was fitted).
  int64_t recheck_draws = 0;
  // The tail diagnostic: the largest Pareto shape k̂ of what the three inner products' estimates
  // average (both tails, pareto_tail.h; the control variate's residuals where it is kept, the raw
  // draws where not), and the bar it was held to, min(1 − 1/log10 N, 0.7).
  double pareto_shape = 0, pareto_limit = 0.7;
  // pareto_shape within pareto_limit and tail_share within the plan's limit, and, drawn from a
  // proposal, the proposal's search settled; tempered, the replicates' log-normaliser spread
  // within tempering_spread_limit
  bool reliable = true;
  // Tempering over directions (MonteCarloPlan::tempering): the estimate is the mean of
  // `replicates` independent runs of `particles` directions through `rungs` tempered laws, its
  // standard errors their spread (samples then counts replicates); log_normaliser_spread is the
  // standard deviation of the runs' log normalisers, the runs' agreement on the mass they found.
  bool tempered = false;
  int replicates = 0, rungs = 0;
  int64_t particles = 0;
  double log_normaliser_spread = NAN, tempering_acceptance = NAN;
};

// `reference`, when given, is subtracted from a (the difference tensor of --diff).
// The standard error of each cosine is the delta method's, from the samples' covariance of
// (f_a·f_b, |f_a|², |f_b|²).
MonteCarloSimilarity monte_carlo_estimate(const PolynomialView& a, const PolynomialView& b, int64_t samples,
                                          uint64_t seed, double input_std = 1.0,
                                          const PolynomialView* reference = nullptr);

// An estimate sized to a requested standard error: batches are drawn until the cosine's
// standard error is at most `tolerance` (or `max_samples` draws are spent).
//
// Spherical–radial splitting (radial_quadrature.h), the default: x = σ·r·u, and a draw is a
// direction u with E_r[f_a·f_b] along it done exactly by the radial rule (degree of a plus
// degree of b, so deg/2 + 1 evaluations of each network a draw). Every inner product's
// estimate is the mean of i.i.d. draws whose expectation is exactly the inner product: unbiased,
// and without the radial factor r^deg whose spread makes plain sampling of a degree-25 network
// heavy-tailed, so that the sample variance, and the interval, can be trusted.
//
// The control variate. A residual network's output is its direct path, the linear map left when
// every residual branch is dropped (embedding, head), plus the branches. The direct paths'
// products g = ℓ_a·ℓ_b (and ℓ_a·ℓ_a, ℓ_b·ℓ_b) are known in expectation exactly
// (E[ℓ_a·ℓ_b] = c_a·c_b + σ²·tr(M_a M_bᵀ) for ℓ = M x + c) and move with f_a·f_b sample by sample,
// so each inner product is estimated by the mean of q − β(g − E[g]). β = cov(q, g)/var(g) is fitted
// on a pilot batch that the estimate then discards, which keeps every inner product's estimate
// unbiased; the cosine, a ratio of them, is consistent, with its interval from the delta method.
// Networks without a direct path (a non-residual bilinear layer) are sampled plainly, and so are
// directions drawn from a proposal (below), whose weighted draws would make β noise.
// Subtracting the direct paths leaves the branches, whose residuals can be far heavier-tailed for
// their variance than the raw draws: a few hundred of them then understate their own spread. So
// the tail diagnostic reads each inner product's residuals, and an inner product whose residuals
// it marks is estimated from its raw draws instead (sizing continues where that misses the
// tolerance; the choice is read again at every stop, so a term rejoins the control variate once
// its residuals pass).
struct MonteCarloPlan {
  double tolerance = 0.005;
  int64_t max_samples = int64_t(1) << 24;
  int64_t pilot = 2048;
  bool control_variate = true;
  bool radial = true;          // spherical–radial splitting; false: plain sampling
  // With the radial split, where the uniform directions' draws are heavy-tailed (the diagnostic
  // below): directions drawn from a proposal adapted toward the directions where
  // |f_a|²/E|f_a|² + |f_b|²/E|f_b|² is large (direction_proposal.h), each draw weighted by
  // uniform/proposal, in a fresh run, where the proposal does better than uniform directions on
  // the pilots (prefer_proposal, below); false: uniform directions only.
  bool importance = true;
  ProposalPlan proposal;
  bool always_adapt = false;  // adapt the proposal even where uniform directions' draws are light-tailed
  // Decide between the fitted proposal and uniform directions on pilots (prefer_proposal); false:
  // the proposal, once fitted, is used (the importance sampler's own tests).
  bool choose_by_pilot = true;
  // After an adaptation the estimate draws at most rerun_limit times the uniform run's draws (at
  // least min_draws); 0: max_samples only.
  double rerun_limit = 4;
  // Before adapting, where the first uniform run is marked: a second uniform run of as many draws
  // (set aside) tells one rare heavy draw from a law whose draws are heavy-tailed. Unmarked, the
  // law stays uniform and the estimate is a third, fresh uniform run (itself diagnosed, and
  // tempered where marked): the proposal's search, whose tangent Hessians cost m²/2 directions a
  // peak, is paid only where two independent uniform runs are both marked. false: adapt at once.
  bool recheck_uniform = true;
  // Hears each sized run's directions (rows of the sampled dimension) and its role: "uniform
  // pilot" (the first uniform run, where it is set aside), "uniform recheck", "proposal pilot",
  // "estimate" (the run reported; tempered replicates are not heard). The tests' view of which
  // draws chose the law and which gave the estimate.
  std::function<void(const std::string& role, const std::vector<double>& directions)> run_heard;
  // Sampling stops at the requested standard error, after at least min_draws. An estimate is
  // marked unreliable (MonteCarloSimilarity::reliable; its standard error may understate the
  // error) when, in any of the three inner products, its draws' Pareto tail shape exceeds
  // min(1 − 1/log10 N, 0.7); sampling plainly, also when one draw carries more than
  // tail_share_limit of the sample variance. A draw along a direction is a bounded function of
  // it (a polynomial's mean on the sphere), whose tail the Pareto shape reads; a plain draw is
  // unbounded, with a tail of the stretched-exponential kind (a high-degree polynomial of a
  // Gaussian) that fits a Pareto shape near 0 at any practical N although its mean rests on a
  // few draws.
  int64_t min_draws = 1024;
  double tail_share_limit = 0.05;
  bool embedding_span = true;  // sample x in the span of the embeddings' rows (below), where they begin with one
  uint64_t seed = 1;
  double input_std = 1.0;
  // Tempering over directions (tempered_directions.h), where the estimate above would end
  // marked (its draws heavy-tailed, or drawn from a proposal whose search did not settle): a
  // population carried from uniform directions to the law ∝ |f_a|²/E|f_a|² + |f_b|²/E|f_b|²
  // (the proposal's target) through its powers, which meets the peaks together rather than one
  // at a time. The ladder and steps come from a pilot run; then independent runs along them, at
  // least min_replicates, until the cosine's standard error across them reaches the tolerance (at
  // most max_replicates). Its estimate replaces the marked one, and is itself marked where the
  // runs' log normalisers spread by more than tempering_spread_limit: runs that disagree on the
  // mass found by factors of e^0.5 make a mean of a few of them, and its spread, untrustworthy
  // (one run that found a peak the others missed dominates both).
  // always_temper: temper every radial estimate (its own tests).
  bool tempering = true, always_temper = false;
  TemperingPlan tempering_plan;
  int min_replicates = 8, max_replicates = 64;
  double tempering_spread_limit = 0.5;
  // Hears (draws so far, draws the current standard error says are needed, that error).
  std::function<void(int64_t done, int64_t needed, double standard_error)> progress;
  // Hears the work before and beside the sized draws, by stage ("adapting directions",
  // "tempering"), as the share of the stage done.
  std::function<void(const std::string& stage, double share)> stage_progress;
};
MonteCarloSimilarity monte_carlo_sized(const PolynomialView& a, const PolynomialView& b, const MonteCarloPlan& plan,
                                       const PolynomialView* reference = nullptr);

// The plan of a check at a fixed budget (`tensorsim --check-mc N`): the default estimator given
// the network evaluations of `evaluations` plain draws, i.e. evaluations / (the radial rule's
// points) directions however small the standard error, and no tempering (its replicate runs
// would spend far beyond the budget).
MonteCarloPlan fixed_budget_plan(const PolynomialView& a, const PolynomialView& b, int64_t evaluations, uint64_t seed, double input_std,
                                 const PolynomialView* reference = nullptr);

// Independent estimates of one quantity whose value is known, each with the standard error it
// claims: whether they centre on the value and scatter as much as they claim.
struct PooledEstimates {
  int n = 0, covered = 0;  // covered: estimates within 1.96 of their standard errors
  double sum = 0, squares = 0, claimed = 0, claimed_squares = 0;  // of estimate − truth, and of the errors
  double standardised_squares = 0;  // of (estimate − truth)/standard error
  void add(double estimate, double standard_error, double truth);
  // (mean − truth) over the mean's standard error from the claims, sqrt(Σ se²)/n: normal where
  // the claims are right.
  double z() const;
  // (mean − truth) over the estimates' own spread/√n: Student's t of n − 1 degrees of freedom,
  // which trusts no claim but is inflated by a spread narrow by chance when n is small.
  double t() const;
  // The estimates' standard deviation over their mean claimed error: near 1 where the claims are right.
  double spread_ratio() const;
  // The root mean square of (estimate − truth)/standard error: near 1 where the claims are right,
  // also where the estimates claim errors of different sizes (some with the control variate, some
  // without), which spread_ratio, one spread over one mean claim, reads as a mismatch.
  double standardised_spread() const;
  double spread() const;
};

// The choice between uniform directions and a fitted proposal, read on a pilot run of each (equal
// draws, both set aside afterwards: a choice read on the draws it then reports would favour
// whichever law's draws happened to miss their tail). A law whose draws the tail diagnostic
// marks (Pareto shape over min(1 − 1/log10 N, 0.7)) loses to one it does not; between two
// marked, the lighter tail wins; between two unmarked, the smaller variance of the cosine per
// draw (both laws cost the same evaluations a draw). Ties go to uniform directions.
struct PilotSummary {
  int64_t draws = 0;
  double pareto_shape = 0;     // the largest of the three inner products' draws'
  double cosine_variance = 0;  // draws × the cosine's squared standard error
};
bool prefer_proposal(const PilotSummary& uniform, const PilotSummary& proposal);

}  // namespace adjoint
