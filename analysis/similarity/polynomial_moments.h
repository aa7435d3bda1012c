// Exact Gaussian inner products of two polynomial networks by writing each network out as an
// explicit polynomial of its input (docs/methods.md §3.3): the route for the bilinear LM's
// attention and for deeper MLPs, where the Isserlis sum of exact_moments.h has too many
// matchings, provided the input is small.
//
// The input x ~ N(0, σ²·I) has n = positions · input features coordinates; with y = x/σ the
// network's state is a vector of polynomials in n standard normal variables y. The view's
// steps run as polynomial arithmetic (linear maps, products; models/polynomial.h), each
// polynomial dense over the monomials of degree ≤ its degree: C(n + d, d) coefficients.
//
// Written in the probabilists' Hermite basis He_α(y) = Π_v He_{α_v}(y_v), which is orthogonal
// under the standard normal (E[He_α He_β] = α!·δ_αβ), an inner product is one pass over the
// coefficients: E[p·q] = Σ_α α!·p̂_α·q̂_α. The head (a last linear step) is not expanded: the
// Gram matrix E[h̃_a,i h̃_b,j] of the states before it, per position, gives every output's
// inner product through the two head matrices. Nothing is approximated: the result is
// E[f_a·f_b] to rounding.
//
// Cost: the products dominate. A product of polynomials of degrees d and e costs about
// C(n+d, d)·C(n+e, e) multiply-adds; the one-block LM (degree 10 = attention's 5, squared by
// its MLP) takes (hidden units · positions) products of two degree-5 polynomials per network.
// polynomial_cost() counts them from the view's shapes before anything is built. With dim 8
// and 32 hidden units: n = 12 (3 positions × 4 tokens, or 4 × 3) takes 4–5·10⁹ multiply-adds
// and 2·10⁷ coefficients a network; n = 15 takes 2·10¹⁰; n = 28 (4 × 7) takes 7·10¹² and
// 1.5·10¹⁰ coefficients, out of reach: the cost is set by the input's size, n, not the width.
// Networks that begin with an embedding are written out over the span of the pair's
// embeddings instead (shared_input_basis): n = positions · (at most the two widths), so a
// depth-3 MLP embedding 46 inputs in 8 dimensions is a pair over 16 variables, degree 8.
// Products of one shape, many in a network, go through a table of where each pair of
// monomials lands (ProductTable in the .cpp).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/matrix64.h"
#include "models/polynomial.h"

namespace adjoint {

// What writing a view out as polynomials would take, counted without building them.
struct PolynomialCost {
  int64_t variables = 0;   // n
  int64_t degree = 0;      // the highest degree of the state before the head
  double multiply_adds = 0;  // in the products
  double largest_terms = 0;  // coefficients of the largest polynomial, C(n + degree, degree)
  double held = 0;           // coefficients of the whole state before the head
};
// `features`: the input read through a basis of that many columns (shared_input_basis), or 0.
PolynomialCost polynomial_cost(const PolynomialView& view, int64_t features = 0);

// Networks that each begin with a linear step (an embedding) read x only through those steps'
// rows: with Q an orthonormal basis of the rows' span (input features × r), Wx = WQ·(Qᵀx) and
// the coordinates of Qᵀx are again independent N(0, σ²). A pair can then be written out in r
// variables a position instead of the input's features: two embeddings of width e need at
// most 2e. Returns Q, or an empty matrix when some view does not begin with a linear step or
// the rows span the whole input.
Matrix64 shared_input_basis(const std::vector<const PolynomialView*>& views);

// One network written out: per position, the state before the head (with a constant first
// coordinate, h̃ = (1, h)) as polynomials in the Hermite basis of y = x/σ, and the head that
// maps h̃ to the outputs (the identity when the view ends in a bilinear step).
struct HermiteExpansion {
  std::string arch;
  int64_t variables = 0, positions = 1, classes = 0;
  double input_std = 1.0;
  Matrix64 basis;               // the input basis the variables are coordinates in (empty: x itself)
  int degree = 0;               // every coordinate laid out at this degree
  std::vector<Matrix64> state;  // per position: (1 + width, C(n + degree, degree)) coefficients
  std::vector<Matrix64> head;   // per position: (classes, 1 + width)
};
// `basis`, when given and not empty: the variables are y = Qᵀx/σ (shared_input_basis).
HermiteExpansion hermite_expansion(const PolynomialView& view, double input_std = 1.0, const Matrix64* basis = nullptr);

// E[f_a,k · f_b,k] for every output coordinate k = t·classes + o, exactly. Both expansions must
// be in the same variables (the same input basis).
std::vector<double> hermite_output_inner(const HermiteExpansion& a, const HermiteExpansion& b);

// The three Gaussian inner products of a pair summed over their output coordinates, exactly:
// ⟨A|B⟩, ⟨A|A⟩, ⟨B|B⟩ and the cosine they give. The truth Monte Carlo estimates are checked against.
struct ExactInnerProducts {
  double ab = 0, aa = 0, bb = 0;
  double cosine() const;
};
ExactInnerProducts exact_inner_products(const PolynomialView& a, const PolynomialView& b, double input_std);

// The building blocks, for tests: a dense polynomial in n variables of degree ≤ `degree`,
// its value at y, its conversion from monomials to Hermite polynomials, and E[p·q] for two
// polynomials in the Hermite basis.
struct DensePolynomial {
  int64_t variables = 0;
  int degree = 0;
  std::vector<double> coefficients;  // monomials, the powers of y_0 outermost
};
DensePolynomial monomial(int64_t variables, const std::vector<int>& powers, double coefficient);
DensePolynomial product(const DensePolynomial& p, const DensePolynomial& q);
DensePolynomial sum(const DensePolynomial& p, const DensePolynomial& q);
double evaluate(const DensePolynomial& p, const std::vector<double>& y);
DensePolynomial to_hermite(DensePolynomial p);
double hermite_inner(const DensePolynomial& p, const DensePolynomial& q);
// dst += alpha·src and dst += alpha·p·q (dst widened to the degree it needs).
void accumulate(DensePolynomial& dst, const DensePolynomial& src, double alpha);
void accumulate_product(DensePolynomial& dst, const DensePolynomial& p, const DensePolynomial& q, double alpha);
// E[a_i·b_j] for every pair, the polynomials in the Hermite basis (of mixed degrees): one dgemm.
// With `correlation` (one ρ_v per variable): a_i's variables and b_j's are two standard normal
// vectors, paired coordinate by coordinate with correlation ρ_v and otherwise independent
// (canonical_pairing.h), so E[a_i·b_j] = Σ_α α!·ρ^α·â_α·b̂_α. Empty: the same variables (ρ = 1).
Matrix64 hermite_gram(const std::vector<DensePolynomial>& a, const std::vector<DensePolynomial>& b,
                      const std::vector<double>& correlation = {});
// He_β·p for a polynomial p in the Hermite basis, the product again in it (the linearisation
// He_m·He_n = Σ_k C(m,k)·C(n,k)·k!·He_{m+n−2k} in each variable): multiplying by a polynomial of
// low degree without leaving the basis.
DensePolynomial hermite_times(const DensePolynomial& p, const std::vector<int>& beta);
// The exponent vectors of the monomials of degree ≤ `degree`, in the coefficients' order.
std::vector<std::vector<int>> layout_exponents(int64_t variables, int degree);
// p laid out at another degree: wider, or truncated to the monomials of degree ≤ `degree`.
DensePolynomial at_degree(const DensePolynomial& p, int degree);

}  // namespace adjoint
