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
//
// Two things keep it small. Each network is written in its own embedding's variables (at most
// its width a position, however many tokens), the two sides paired by canonical correlation
// (canonical_pairing.h). And the outputs (one per token of the vocabulary) differ only in Ĝ_o,
// which enters a position u's terms through η = ν_hᵀĜ_oν_h', a polynomial of degree 2: what X_u
// gives every output is linear or bilinear in the two sides' Hermite coefficients of η over
// polynomials built once a position (PositionFacts in the .cpp), so an output costs dgemms of
// the moments, not polynomial products. The fourth moment of S is never held: it enters only
// through Σ_t ⟨g22_t, W_t⟩ and is contracted with Σ_{t>u} g22_t as its terms arise, which is why
// the result is per class, summed over positions.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "engine/matrix64.h"
#include "models/polynomial.h"

namespace adjoint {

// Whether the view is one such block: Linear (the embedding), Attention and Bilinear (both
// residual), Linear (the head).
bool single_attention_block(const PolynomialView& view);

// What a pair would take, counted from the shapes before anything is built: multiply-adds
// and the most coefficients held at once (8 bytes each).
struct AttentionBlockCost {
  int64_t variables = 0;  // a position's, each side's
  double multiply_adds = 0;
  double held = 0;
};
AttentionBlockCost attention_block_cost(const PolynomialView& a, const PolynomialView& b);

// Σ_t E[f_a,t,o · f_b,t,o] for every class o, x ~ N(0, σ²·I), exactly (to rounding): what the
// similarity and its slices read (the fourth moment's terms are summed over positions as they
// arise, so the positions' shares are not kept apart).
// Each side is written in the variables of its own embedding, at most its width a position
// however many tokens there are, the two paired by their canonical correlations
// (canonical_pairing.h).
// `progress`, when given, hears (classes done, classes) after each class (from one thread at a
// time): the classes are the route's unit of work, each the same cost.
std::vector<double> attention_block_class_inner(const PolynomialView& a, const PolynomialView& b, double input_std,
                                                const std::function<void(int64_t, int64_t)>& progress = {});

}  // namespace adjoint
