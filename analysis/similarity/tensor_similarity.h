// Tensor similarity of bilinear layers (METHODS.md §3.1–3.2): two layers are compared through
// their weights alone, as the inner product of their symmetrised third-order tensors,
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
// and the similarity is the cosine ⟨A|B⟩ / sqrt(⟨A|A⟩⟨B|B⟩), of the sums over o or per slice.
// Without the bias coordinate, column 0 of L and R is dropped: only the part quadratic in x
// is compared.
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

// The one bilinear layer of a network (a bilinear_mlp of depth 0), with the linear maps
// before it folded into L and R and those after it into D. Throws naming the model when the
// network is not a single bilinear layer (the deep recursion, second_moment.h, handles those).
BilinearForm bilinear_form(const PolynomialView& view);

// A − A0 as one form (hidden units side by side, A0's D negated): what changed between two
// checkpoints of one layer.
BilinearForm difference(const BilinearForm& a, const BilinearForm& a0);

// The explicit symmetrised tensor of output o, (d+1)×(d+1): for tests on small layers.
Matrix64 symmetric_slice(const BilinearForm& form, int64_t o);

// A similarity metric: the inner product it defines, per output slice.
struct SimilarityMetric {
  const char* name;
  const char* summary;
  std::vector<double> (*slice_inner)(const BilinearForm& a, const BilinearForm& b, bool bias);
};
// The table of metrics ("identity", "gaussian").
const std::vector<SimilarityMetric>& similarity_metrics();
// A metric by name; a UsageError listing the names otherwise.
const SimilarityMetric& similarity_metric(const std::string& name);

// ⟨A_o|B_o⟩ for every output o under `metric`, with or without the bias coordinate.
std::vector<double> slice_inner(const SimilarityMetric& metric, const BilinearForm& a, const BilinearForm& b, bool bias);

struct Similarity {
  double total = 0;             // cosine of the sums over outputs
  std::vector<double> slices;   // cosine per output
};
// Throws when the layers' input or output sizes differ (naming both).
Similarity tensor_similarity(const SimilarityMetric& metric, const BilinearForm& a, const BilinearForm& b, bool bias);

}  // namespace adjoint
