// Exact Gaussian inner products of two one-block bilinear-attention LMs (embedding, the
// polynomial attention, the bilinear MLP, the unembedding: models/polynomial.h), position by
// position (docs/methods.md §3.3). Writing such a network out as one polynomial of every
// position's input (polynomial_moments.h) is out of reach beyond a few positions and tokens:
// 4 positions × 7 tokens are 28 variables and 7·10¹² multiply-adds. Here the variables of
// one position at a time are written out, never more.
//
// Why that suffices: under the Gaussian metric the positions' inputs y_0, …, y_{T−1} are
// independent. The state the MLP reads at position t is
//   r̃_t = ĉ_t(y_t) + Σ_{u<t} Σ_m Q_m(y_t) K̂_m(y_u),
// with ĉ_t = (1, h_t + the attention's own-position term) a polynomial of y_t alone (degree
// 5), Q_m = q1_i·q2_j for m = (head, i, j) (degree 2 in y_t) and K̂_m = (0, s/d_head²·k1_i·k2_j·
// proj·v) (degree 3 in y_u). The MLP, its residual and the head make every output a quadratic
// form f_t,o = r̃ᵀ Ĝ_o r̃, so with S = Σ_{u<t} K̂(y_u), a random matrix independent of y_t,
//   f = F0(y_t) + Σ_ma F1_ma(y_t)·S_ma + Σ_mm' F2_mm'(y_t)·S_mᵀ Ĝ_o S_m',
// and E[f·g] = Σ_{i,j ∈ {0,1,2}} Σ E_t[F_i·G_j]·E_S[…]: Hermite inner products in one
// position's variables times moments of S of order ≤ 4. Those are built one position at a
// time: S ← S + X_u with X_u independent of S, each moment of the sum a sum over which of its
// factors come from X_u (2^factors terms).
#pragma once
#include <cstdint>
#include <vector>

#include "engine/matrix64.h"
#include "models/polynomial.h"

namespace adjoint {

// Whether the view is one such block: Linear (the embedding), Attention and Bilinear (both
// residual), Linear (the head).
bool single_attention_block(const PolynomialView& view);

// What a pair would take, counted from the shapes before anything is built: multiply-adds
// and the most coefficients held at once (8 bytes each). `features`: the input read through
// a basis of that many columns a position (shared_input_basis), or 0.
struct AttentionBlockCost {
  int64_t variables = 0;  // a position's
  double multiply_adds = 0;
  double held = 0;
};
AttentionBlockCost attention_block_cost(const PolynomialView& a, const PolynomialView& b, int64_t features = 0);

// E[f_a,k · f_b,k] for every output k = t·classes + o, x ~ N(0, σ²·I), exactly (to rounding).
// `basis`, when given and not empty: each position's input read through it (shared_input_basis).
std::vector<double> attention_block_output_inner(const PolynomialView& a, const PolynomialView& b, double input_std,
                                                 const Matrix64* basis = nullptr);

}  // namespace adjoint
