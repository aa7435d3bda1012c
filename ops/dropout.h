// Inverted dropout: in training each element is kept with probability 1 − p and scaled by
// 1/(1 − p), so the expected output equals the input; in eval it is the identity.
//
// Given its mask the map is linear in x, so the three transports coincide: u·mask/(1 − p).
// The mask comes from the counter-based generator (engine/random.h), so the same
// generator state gives the same mask at any thread count.
#pragma once
#include "engine/random.h"
#include "engine/tensor.h"

namespace adjoint {

// Returns x itself when !training or p == 0; all zeros when p == 1. Advances `gen` by
// x.numel() counters in training mode only.
Tensor dropout(const Tensor& x, float p, bool training, Generator& gen);

}  // namespace adjoint
