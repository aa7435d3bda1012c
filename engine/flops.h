// Nominal floating-point operations of a forward pass, so that a benchmark can set a
// model's throughput beside the machine's GEMM rate (`adjoint bench models`).
//
// The convention, the usual one for published model FLOPs: only the products count, two
// operations per multiply-add, as the textbook algorithm does them. A convolution counts
// 2·N·O·OH·OW·(C/groups)·kh·kw (direct convolution, whatever algorithm ran: Winograd does
// fewer multiplications, which shows up as a higher achieved rate; kernel taps that meet
// only padding at every output are cut and not counted, see ops/conv.cpp), a linear layer or
// matmul 2·rows·out·in, attention its two products Q·Kᵀ and A·V, a bilinear layer its
// two projections. Biases, normalisation, activations, pooling and softmax do not count.
// A training step is counted as three forward passes (the backward pass runs two
// products of each forward one, for the input and the weight gradient).
#pragma once
#include <cstdint>

namespace adjoint {

// Counts, while alive, the operations of the products that the ops run on any thread.
// One count at a time.
class FlopCount {
 public:
  FlopCount();
  ~FlopCount();
  FlopCount(const FlopCount&) = delete;
  FlopCount& operator=(const FlopCount&) = delete;
  // Operations counted so far.
  int64_t total() const;
};

// Called by the ops' forward passes: adds 2·multiply_adds when a FlopCount is alive.
void count_multiply_adds(int64_t multiply_adds);

}  // namespace adjoint
