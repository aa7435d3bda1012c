// A ReLU's gate as bits. The gradient (and the pullback) of a ReLU only asks, per value,
// whether its input z was positive; a training step's backward pass can read that from one
// bit instead of from the saved output's four bytes, a quarter of the reads of a fused
// BatchNorm–ReLU backward (ops/norm.cpp).
//
// A row of L values takes gate_words(L) words of 16 bits: bit j of word w is value 16w + j,
// set where y > 0 (for y = relu(z), that is z > 0, NaN unset, as relu_gate reads z). Rows
// start on a word, so that a channel's rows are found without a division.
#pragma once
#include <cstdint>

namespace adjoint {

inline int64_t gate_words(int64_t L) { return (L + 15) / 16; }

// bits[0 .. gate_words(L)) = the gate of y[0 .. L).
void write_gate_bits(const float* y, int64_t L, uint16_t* bits);

// out[l] = bit l of `bits` ? u[l] : 0, for l < L: relu_gate with the gate read from bits
// (the same values: u itself, or +0).
void select_by_gate_bits(const uint16_t* bits, const float* u, int64_t L, float* out);

}  // namespace adjoint
