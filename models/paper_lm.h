// The tensor-similarity paper's bilinear-attention language models (the checkpoints its code
// reads in src/models/checkpoint_transformer.py), read as a polynomial view by their parameter
// names, so that the similarity routes (analysis/similarity/) compare them like our own LMs.
//
// The family: an embedding (embed.weight, vocab × d: a row per token), then layers.{i} of
// attention only, each with an additive residual h ← h + s·o(z) (s = 0.35), the bilinear score
// (q1·k1)(q2·k2)/d_head² over a causal mask, q and k with biases (q1.bias, …) and rotary
// positions per head (rotate-half, base 10000), v and o without; then the unembedding
// (unembed.weight, vocab × d), whose final normalisation, a batch-wide scalar at inference,
// 1/sqrt(final_norm.running_mean_energy + 1e-6), is folded into it.
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "engine/tensor.h"
#include "models/polynomial.h"

namespace adjoint {

struct PaperLmShape {
  int64_t heads = 0;               // n_head of the model's config.json: not in the weights
  double attention_scale = 0.35;   // attn_scale
};

// Throws an Error naming `source` and the tensor that is missing or of the wrong shape.
// `positions`: the context compared (the paper's analysis uses 4).
PolynomialView paper_lm_view(const std::map<std::string, Tensor>& state, const PaperLmShape& shape, int64_t positions,
                             const std::string& source);

}  // namespace adjoint
