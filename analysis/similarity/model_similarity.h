// Two bilinear models compared: tensor similarity from their weights (the closed form for
// one bilinear layer, the exact Isserlis sum for deeper networks where it is tractable, else
// the exact sum over each network written out as a polynomial of a small input (the bilinear
// LM, depth-3 MLPs), or of one position's input at a time (one-block attention LMs), a Monte
// Carlo estimate with its standard error beyond; the second-moment recursion, an
// approximation, only when asked for) with the baselines
// of docs/methods.md §3.4 beside it, computed on a batch of inputs. What `adjoint tensorsim`
// prints and writes, for one pair of checkpoints or every checkpoint of a run.
#pragma once
#include <functional>
#include <map>
#include <optional>
#include <utility>
#include <string>
#include <tuple>
#include <vector>

#include "analysis/similarity/attention_block_moments.h"
#include "analysis/similarity/exact_moments.h"
#include "analysis/similarity/monte_carlo.h"
#include "analysis/similarity/polynomial_moments.h"
#include "analysis/similarity/second_moment.h"
#include "analysis/similarity/tensor_similarity.h"
#include "engine/tensor.h"
#include "models/model.h"

namespace adjoint {

struct TensorSimOptions {
  std::string metric = "gaussian";  // identity | gaussian (one bilinear layer); deep networks: gaussian
  bool bias = true;                 // include the constant coordinate x̃_0 = 1
  int64_t positions = 0;            // sequence models: positions compared (0: the model's context)
  double input_std = 1.0;           // gaussian metric: x ~ N(0, input_std²·I)
  bool recursion = false;           // deep networks: the second-moment recursion (the Gaussian closure), asked for
  double tolerance = 0.005;         // where no exact route applies: Monte Carlo to this standard error of the cosine
  bool sampled = false;             // the sampled estimate (Monte Carlo route) even where an exact route applies: its own check
  bool tempering = true;            // where sampling stays marked, temper over directions (monte_carlo.h); false: report it marked
  uint64_t seed = 1;                // and its draws
  const InputDistribution* data = nullptr;  // data metric: the data's N(μ, Σ)
  // Long exact routes report here: which inner product ("<A|B>", "<A|A>", …) and its share done.
  std::function<void(const std::string& what, double share)> progress;
};

// Each model's own terms, kept across the comparisons of many pairs (a run's checkpoints):
// its second moments for the recursion, its expansion and E[f·f] for the exact sum, its
// Hermite polynomials and E[f·f] for the explicit-polynomial sum.
class MomentCache {
public:
  const MomentTrace& of(const Model& model, const PolynomialView& view, double input_std);
  const OutputExpansion& expansion(const Model& model, const PolynomialView& view);
  const std::vector<double>& exact_self(const Model& model, const PolynomialView& view, double input_std);
  const HermiteExpansion& hermite(const Model& model, const PolynomialView& view, double input_std);
  const std::vector<double>& hermite_self(const Model& model, const PolynomialView& view, double input_std);
  const std::vector<double>& attention_block_self(const Model& model, const PolynomialView& view, double input_std,
                                                   const std::function<void(int64_t, int64_t)>& progress = {});

private:
  using Key = std::tuple<const Model*, int64_t, double>;  // model, positions, input scale
  std::map<std::pair<const Model*, double>, MomentTrace> traces_;
  std::map<std::pair<const Model*, int64_t>, OutputExpansion> expansions_;  // by model and positions
  std::map<Key, std::vector<double>> self_, hermite_self_, attention_block_self_;
  std::map<Key, HermiteExpansion> hermite_;
};

// The most contractions the exact sum may take for ⟨A|B⟩ and ⟨A|A⟩ together (a depth-2 MLP takes 2 658 each);
// beyond it, the recursion answers, labelled an approximation.
constexpr int64_t kExactContractionBudget = 20000;
// The most the explicit-polynomial sum may take for one network: multiply-adds in its
// products (a one-block LM of dim 8 on 3 positions × 4 tokens takes 3.7·10⁹), and
// coefficients held by the state before the head (8 bytes each; a cache keeps every model's).
constexpr double kPolynomialMultiplyAddBudget = 6e9;
constexpr double kPolynomialCoefficientBudget = 2.5e7;
// The same for a one-block attention LM written out a position at a time, for one of a pair's
// inner products (attention_block_moments.h; dim 8, 2 heads, 256 tokens: 4 positions take
// 1.1·10¹¹, 16 positions 5.6·10¹¹ and 1.7·10⁸ coefficients).
constexpr double kAttentionBlockMultiplyAddBudget = 6e11;
constexpr double kAttentionBlockCoefficientBudget = 3e8;

struct TensorSimScore {
  std::string kind;            // "exact", "monte-carlo" (an estimate with a standard error) or "recursion-approx"
  std::string method;          // what computed it, in words
  double total = 0;
  std::vector<double> slices;  // per output (class, token), summed over positions
  double inner_ab = 0, inner_aa = 0, inner_bb = 0;  // the raw inner products ⟨A|B⟩, ⟨A|A⟩, ⟨B|B⟩
  std::vector<double> slice_ab, slice_aa, slice_bb;  // per output, where the method gives them
  // A Monte Carlo estimate's standard errors (0 for the others) and samples spent.
  double standard_error = 0;
  double inner_ab_se = 0, inner_aa_se = 0, inner_bb_se = 0;
  std::vector<double> slice_se;
  int64_t samples = 0;
  bool reliable = true;  // false: a Monte Carlo estimate whose tail diagnostic marks its interval untrustworthy
};

// A model of one bilinear layer (tensor_similarity.h's closed form), prepared for many
// comparisons under `options` (A − reference with --diff); nullopt for deeper networks.
std::optional<PreparedLayer> prepared_layer(const Model& model, const TensorSimOptions& options,
                                            const Model* reference = nullptr);
// The score of two prepared layers, as tensor_similarity gives it.
TensorSimScore closed_form_score(const PreparedLayer& a, const PreparedLayer& b, const TensorSimOptions& options);

// Tensor similarity of two models' polynomials; `reference`, when given, compares
// (a − reference) against b (the difference tensor: what changed since the reference).
TensorSimScore tensor_similarity(const Model& a, const Model& b, const TensorSimOptions& options,
                                 const Model* reference = nullptr, MomentCache* cache = nullptr);

// The same comparison by Monte Carlo, the estimator of the routes (monte_carlo_sized: directions
// along the radial rule, importance-sampled where uniform ones are heavy-tailed, the control
// variate) given the network evaluations of `samples` plain Gaussian inputs (the Gaussian metric
// with the bias coordinate only), with standard errors.
MonteCarloSimilarity monte_carlo_check(const Model& a, const Model& b, const TensorSimOptions& options, int64_t samples,
                                       const Model* reference = nullptr, uint64_t seed = 1);

// A data-based or weight-based baseline: name, what it measures, and its value.
struct BaselineScore {
  std::string name, summary;
  double value = 0;
  std::string not_applicable;  // why it was left out (value unset), or empty
};
// The baselines of the table (all, or those named in `only`), on `inputs` (already
// normalised): linear CKA (biased, debiased) on the hidden features (the output of the
// block before the head) and on the logits, prediction agreement, output correlation,
// weight cosine.
std::vector<BaselineScore> baseline_scores(const Model& a, const Model& b, const Tensor& inputs,
                                           const std::vector<std::string>& only = {});

}  // namespace adjoint
