// Two networks that read their input x ~ N(0, σ²·I) through linear maps W_a and W_b (their
// embeddings) depend on x only through W_a·x and W_b·x. Canonical correlation analysis pairs
// the two views (docs/methods.md §3.3):
//   a = P_aᵀ x/σ and b = P_bᵀ x/σ, P_a and P_b with orthonormal columns spanning W_a's and W_b's
//   rows, chosen so that E[a_i·b_j] = δ_ij·ρ_i (ρ_i the cosines of the principal angles between
//   the two row spaces; the singular values of Q_aᵀQ_b for any orthonormal bases Q of them).
// Each of a and b is standard normal, and by Mehler's formula the Hermite polynomials of
// paired standard normals with correlation ρ are orthogonal with E[He_m(a_i)·He_n(b_i)] =
// δ_mn·n!·ρ_iⁿ. So E[p(a)·q(b)] = Σ_α α!·ρ^α·p̂_α·q̂_α: each network is a polynomial in at most
// its own embedding's width of variables, never in the span of both (twice as many).
#pragma once
#include <vector>

#include "engine/matrix64.h"

namespace adjoint {

// An orthonormal basis (as columns, input features × r) of the span of every given matrix's
// rows, by Gram–Schmidt applied twice: rows already in the span are skipped.
Matrix64 orthonormal_row_basis(const std::vector<Matrix64>& maps);

struct CanonicalPairing {
  // (input features, r), r = max(rank W_a, rank W_b, 1): P_a and P_b, each padded with zero
  // columns up to r. W_a = W_a·P_a·P_aᵀ.
  Matrix64 read_a, read_b;
  std::vector<double> correlation;  // ρ, r values in [0, 1], descending; 0 beyond the smaller rank
};
// `wa`, `wb`: (rows, input features), the same number of input features.
CanonicalPairing canonical_pairing(const Matrix64& wa, const Matrix64& wb);

}  // namespace adjoint
