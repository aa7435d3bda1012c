// Tensor similarity of bilinear layers (docs/methods.md §3.1–3.2): two layers are compared
// through their weights alone, as the inner product of their symmetrised third-order tensors,
// computed in closed form from H×H products of the factors: never building a d×d×o tensor.
//
// A layer with factors L, R (H, d+1) (bias in column 0) and D (O, H) is the tensor
// B_o = Σ_h D[o,h] l_h r_hᵀ over x̃ = (1, x); only its symmetric part acts on inputs. With
//   core = ½ (L_a L_bᵀ ⊙ R_a R_bᵀ + L_a R_bᵀ ⊙ R_a L_bᵀ)            (H_a × H_b)
// the metrics are, per output o (a "slice"),
//   identity   ⟨A_o^s | B_o^s⟩_F = Σ_{h,k} core[h,k] D_a[o,h] D_b[o,k]
//   gaussian   E_x[A_o(x) B_o(x)], x ~ N(0, I), by Isserlis' theorem:
//              (D_a t_a)_o (D_b t_b)_o + 2 ⟨A_o^s|B_o^s⟩ − 2 (D_a m_a)_o (D_b m_b)_o,
//              t[h] = l_h·r_h, m[h] = l_h0 r_h0 (the constant coordinate's mean term)
//   data       the same expectation for x ~ N(μ, Σ), a data set's own mean and covariance:
//              x = μ + Σ^{1/2} z is a linear map before the layer, so it folds into L and R
//              (l ↦ (l_0 + l·μ, Σ^{1/2} l)) and every product l·l' becomes (l_0 + l·μ)(l'_0 + l'·μ)
//              + l Σ l'ᵀ: Σ^{1/2} itself is never needed.
// and the similarity is the cosine ⟨A|B⟩ / sqrt(⟨A|A⟩⟨B|B⟩), of the sums over o or per slice.
// Without the bias coordinate, column 0 of L and R (for the data metric: the folded constant)
// is dropped: only the part quadratic in x (in z) is compared.
//
// For speed, each layer is prepared once (PreparedLayer: its factors stacked as [L; R] and
// its own norms), so that a pair costs one product [L_a; R_a]·[L_b; R_b]ᵀ, and the pairs of
// many layers (a run's checkpoints) are products of one layer with all later ones stacked.
#pragma once
#include <string>
#include <vector>

#include "engine/matrix64.h"
#include "models/polynomial.h"

namespace adjoint {

// output o = Σ_h D[o,h] (l_h·x̃)(r_h·x̃), x̃ = (1, x).
struct BilinearForm {
  Matrix64 left, right;  // (H, d+1)
  Matrix64 down;         // (O, H)
  int64_t hidden() const { return left.rows; }
  int64_t inputs() const { return left.cols - 1; }
  int64_t outputs() const { return down.rows; }
};

// The one bilinear layer of a network (a bilinear_mlp of depth 0, or of depth 1: a residual
// layer h + s·y, whose identity path is linear in x and joins the form as one hidden unit
// (c_o·x̃)(e_0·x̃) per output), with the linear maps before it folded into L and R and those
// after it into D. Throws naming the model when the network has more than one bilinear layer.
BilinearForm bilinear_form(const PolynomialView& view);

// A − A0 as one form (hidden units side by side, A0's D negated): what changed between two
// checkpoints of one layer.
BilinearForm difference(const BilinearForm& a, const BilinearForm& a0);

// The explicit symmetrised tensor of output o, (d+1)×(d+1): for tests on small layers.
Matrix64 symmetric_slice(const BilinearForm& form, int64_t o);

// The inputs the data metric averages over: x ~ N(mean, covariance).
struct InputDistribution {
  Matrix64 mean;        // (d, 1)
  Matrix64 covariance;  // (d, d), symmetric positive semi-definite
};
// The mean and covariance (divided by N) of the rows of `samples` (N, d): a data set's own.
InputDistribution input_distribution(const Matrix64& samples);

// A similarity metric: which inner product of the functions it takes.
struct SimilarityMetric {
  const char* name;
  const char* summary;
  bool isserlis;   // an expectation over Gaussian inputs (Isserlis' terms), not the Frobenius product
  bool needs_data;  // averages over a data set's N(μ, Σ): needs an InputDistribution
};
// The table of metrics ("identity", "gaussian", "data").
const std::vector<SimilarityMetric>& similarity_metrics();
// A metric by name; a UsageError listing the names otherwise.
const SimilarityMetric& similarity_metric(const std::string& name);

// One layer made ready for many comparisons under one metric: everything that does not
// depend on the other layer, computed once.
struct PreparedLayer {
  const SimilarityMetric* metric = nullptr;
  int64_t hidden = 0, features = 0;  // H, and d: the layer's input size
  bool bias = true;
  Matrix64 factors;   // (2H, n): the rows of L then of R over the compared coordinates
  Matrix64 weighted;  // factors with the x part multiplied by Σ (data metric); empty: Σ = I
  Matrix64 down;      // (O, H)
  std::vector<double> trace_out, mean_out;  // (D t)_o and (D m)_o: Isserlis' terms
  std::vector<double> self;                 // ⟨A_o|A_o⟩ under the metric
  std::vector<double> scale;                // (Σ_h |D[o,h]| |l_h| |r_h|)²: what a zero norm is judged against
  int64_t inputs() const { return features; }
  int64_t outputs() const { return down.rows; }
};
// `input` is required by the data metric and ignored by the others.
PreparedLayer prepare_layer(const SimilarityMetric& metric, const BilinearForm& form, bool bias,
                            const InputDistribution* input = nullptr);

// ⟨A_o|B_o⟩ for every output o, for two layers prepared under the same metric. Throws naming
// both shapes when their input or output sizes differ.
std::vector<double> slice_inner(const PreparedLayer& a, const PreparedLayer& b);
// The same from the forms (prepares both).
std::vector<double> slice_inner(const SimilarityMetric& metric, const BilinearForm& a, const BilinearForm& b, bool bias,
                                const InputDistribution* input = nullptr);

struct Similarity {
  double total = 0;             // cosine of the sums over outputs
  std::vector<double> slices;   // cosine per output; NaN where a slice of either layer has zero norm
  double inner_ab = 0, inner_aa = 0, inner_bb = 0;              // the sums over outputs
  std::vector<double> slice_ab, slice_aa, slice_bb;             // per output
};
// Throws when the layers' sizes differ (naming both), and when either layer's tensor has
// zero norm under the metric (to rounding: A − A0 of equal layers), where the cosine is undefined.
Similarity tensor_similarity(const PreparedLayer& a, const PreparedLayer& b);
Similarity tensor_similarity(const SimilarityMetric& metric, const BilinearForm& a, const BilinearForm& b, bool bias,
                             const InputDistribution* input = nullptr);

// Every pair of `layers` (all prepared under one metric): a K×K row-major matrix, computed
// as one product of each layer's stacked factors with those of all later layers, the rows
// spread over the engine's threads. Throws naming the pair that cannot be compared: by
// `names` ("A vs B") when given, else by index.
std::vector<Similarity> pairwise_similarity(const std::vector<PreparedLayer>& layers,
                                            const std::vector<std::string>& names = {});

}  // namespace adjoint
