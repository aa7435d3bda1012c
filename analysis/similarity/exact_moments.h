// Exact Gaussian inner products of two deep polynomial networks (docs/methods.md §3.3), for
// the networks where the sum is small enough to do in full.
//
// A network's output f(x) is a polynomial of its input x ~ N(0, σ²·I). Written out layer by
// layer, it is a sum of *pieces*: each piece is a tensor network of the layers' weights whose
// *legs* are linear forms of the padded input x̃ = (1, x). A bilinear layer multiplies two
// pieces (their legs add up), a linear layer adds one weight matrix, a residual layer keeps
// the pieces it had and adds the products. Pieces of at most one leg are folded into a single
// affine leg, so a residual bilinear MLP of depth K has pieces of up to 2^K legs.
//
// For two pieces p (of f_a) and q (of f_b), E[p·q] is the non-centred Isserlis sum over every
// partial matching of their legs together: a matched pair of legs X x̃, Y x̃ contributes its
// covariance σ²·X'Y'ᵀ (X' the columns acting on x), an unmatched leg its mean (column 0).
// Each matching is one tensor network, contracted exactly, pair by pair. Nothing is assumed
// about the distribution of hidden states: the sum is E[f_a f_b] itself, to rounding.
//
// Cost: Σ over pairs of pieces of tel(legs_p + legs_q) contractions, tel(n) the number of
// partial matchings of n legs (1, 1, 2, 4, 10, 26, 76, 232, 764 for n ≤ 8), each a chain of
// matrix products over the hidden widths. A depth-2 MLP has pieces of 1, 2, 2, 3, 3 and 4
// legs: 2 658 contractions a pair of networks, of matrices over the hidden widths and the
// outputs (kept open for the slices): about 0.4 s of CPU for hidden 32 on 46 inputs and 23
// classes, about 7 s for hidden 64 on 226 inputs and 113 classes (modadd:113). Depth 3 reaches 8 legs a piece, ~10⁸ matchings:
// out of reach, as is the bilinear LM (its attention has five legs, ten after the MLP): for
// those, polynomial_moments.h writes the network out over a small input instead.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "analysis/similarity/second_moment.h"
#include "models/polynomial.h"

namespace adjoint {

// A dense tensor over numbered indices, row-major in the order of `ids`.
struct IndexedTensor {
  std::vector<int> ids;
  std::vector<int64_t> dims;
  std::vector<double> data;
  int64_t size() const;
  int axis(int id) const;  // position of `id` in ids, or -1
};

// One term of a network's output: weights (`factors`) and legs, each leg a tensor over its
// indices and kInput (the padded input, 1 + n wide). `open` is the index the term's value
// carries: the output coordinate (position, class) at the end.
struct PolynomialPiece {
  int open = 0;
  std::vector<IndexedTensor> factors;
  std::vector<IndexedTensor> legs;
};

struct OutputExpansion {
  std::string arch;
  int64_t input_size = 0;  // n = positions · input features
  int64_t positions = 1, classes = 0;
  std::vector<PolynomialPiece> pieces;  // f = Σ pieces, each over the output index (positions · classes)
};

// Whether the exact sum applies to a view (linear and bilinear steps only), and why not.
bool expandable(const PolynomialView& view, std::string* why = nullptr);
// The view's output as pieces; throws naming the step when !expandable.
OutputExpansion expand_output(const PolynomialView& view);
// a − b as one expansion (the difference tensor of --diff), for networks of one input and output.
OutputExpansion expansion_difference(OutputExpansion a, const OutputExpansion& b);

// The expansion evaluated at one input x (n values): Σ over pieces, each leg applied to
// (1, x). The same numbers as evaluate_polynomial, by the pieces: the test of the expansion.
std::vector<double> evaluate_expansion(const OutputExpansion& e, const std::vector<double>& x);

// Contractions the exact sum of E[f_a·f_b] takes (Σ over pairs of pieces of their partial matchings).
int64_t exact_contractions(const OutputExpansion& a, const OutputExpansion& b);

// E[f_a,k · f_b,k] for every output coordinate k (position-major: k = t·classes + o), exactly,
// for inputs x ~ N(0, input_std²·I).
std::vector<double> exact_output_inner(const OutputExpansion& a, const OutputExpansion& b, double input_std = 1.0);

// The similarity, total and per class (summed over positions), from E[f_a,k f_b,k], E[f_a,k²]
// and E[f_b,k²] per output coordinate k = t·classes + o.
DeepSimilarity similarity_from_inner(const std::vector<double>& ab, const std::vector<double>& aa,
                                     const std::vector<double>& bb, int64_t classes);
// exact_output_inner three times (a·b, a·a, b·b), as a similarity.
DeepSimilarity exact_similarity(const OutputExpansion& a, const OutputExpansion& b, double input_std = 1.0);

// The number of partial matchings of `legs` legs: tel(n) = tel(n−1) + (n−1)·tel(n−2).
int64_t telephone_number(int64_t legs);

}  // namespace adjoint
