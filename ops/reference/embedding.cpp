// Embedding lookup (ops/embedding.h): rows of a weight table gathered by index. Linear in
// the weight: one rule for every transport, the cotangent rows added back to the rows they
// came from (docs/methods.md §1.2).
#include "ops/reference/reference.h"

namespace adjoint::reference {

// out[p] = weight[indices[p]], a row of D values per index.
Values embedding_forward(const Values& weight, const std::vector<int64_t>& indices, int64_t D) {
  Values out(indices.size() * D);
  for (size_t p = 0; p < indices.size(); ++p)
    for (int64_t j = 0; j < D; ++j) out[p * D + j] = weight[indices[p] * D + j];
  return out;
}

// dweight[indices[p]] += u[p] (docs/methods.md §1.2: linear, one rule for every transport).
Values embedding_backward(const Values& u, const std::vector<int64_t>& indices, int64_t V, int64_t D) {
  Values dweight(V * D, 0.0);
  for (size_t p = 0; p < indices.size(); ++p)
    for (int64_t j = 0; j < D; ++j) dweight[indices[p] * D + j] += u[p * D + j];
  return dweight;
}

}  // namespace adjoint::reference
