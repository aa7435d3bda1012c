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
//
// A folder of such checkpoints, as the paper's code downloads it, holds config.json (the
// model's sizes, in a "model" block or at the top level) beside checkpoints/step_NNNNN.*;
// the weights are read here from safetensors files of the same state dicts.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "engine/random.h"
#include "engine/tensor.h"
#include "models/model.h"
#include "models/polynomial.h"

namespace adjoint {

struct PaperLmShape {
  int64_t heads = 0;               // n_head of the model's config.json: not in the weights
  double attention_scale = 0.35;   // attn_scale
  bool qk_bias = true;             // use_bias_qk
  bool rotary = true;              // the family's rotary positions; off only for tests (plain attention, which exact routes take)
  // Sizes the config states (0: not stated), checked against the tensors.
  int64_t vocab = 0, dim = 0, layers = 0;  // vocab_size, d_model, n_layers
};

// The shape a config.json describes. Throws an Error naming `path` and the key that is
// missing or wrong, and refusing an attention other than the bilinear one (attn_type).
PaperLmShape read_paper_lm_config(const std::string& path);

// The state with the final normalisation folded into unembed.weight and final_norm.* dropped;
// a state without final_norm.running_mean_energy is returned as it is (the paper's loader
// would scale it by (1 + 1e-6)^(-1/2), the buffer's initial value, a change of 5·10⁻⁷).
std::map<std::string, Tensor> absorb_final_norm(const std::map<std::string, Tensor>& state, const std::string& source);

// The config.json that governs a checkpoint file: beside it, or in the folder above (a run
// folder's checkpoints/ sit below it); "" when there is none.
std::string paper_lm_config_for(const std::string& checkpoint_path);

// The positions compared when none are asked for: the paper's analysis context (its n_ctx).
constexpr int64_t kPaperLmPositions = 4;

// The checkpoint as a Model: its forward takes token ids (batch, T) stored as floats and
// gives logits (batch, T, vocab), in two blocks ("layers": the residual stream after the
// attention layers; "unembed"), by evaluating the view's polynomial in double precision;
// its parameters are the state dict's tensors (final norm folded into unembed.weight).
// Throws as paper_lm_view does, and names a tensor that is neither the model's nor final_norm.*.
std::shared_ptr<Model> paper_lm_model(const std::map<std::string, Tensor>& state, const PaperLmShape& shape,
                                      const std::string& source);

// A state dict of the family with random weights (entries ~ N(0, weight_std²), the q and k
// biases ~ N(0, bias_std²) when shape.qk_bias), of shape.vocab tokens, width shape.dim and
// shape.layers attention layers: the networks of tests and experiments, in the layout a
// checkpoint has (no final norm: an identity there). With `from`, that state plus the draw
// (a network near another, for pairs of a cosine well inside (0, 1)).
std::map<std::string, Tensor> paper_lm_random_state(const PaperLmShape& shape, Generator& gen, double weight_std = 0.5,
                                                    double bias_std = 0.3,
                                                    const std::map<std::string, Tensor>* from = nullptr);

// Throws an Error naming `source` and the tensor that is missing or of the wrong shape.
// `positions`: the context compared (the paper's analysis uses 4).
PolynomialView paper_lm_view(const std::map<std::string, Tensor>& state, const PaperLmShape& shape, int64_t positions,
                             const std::string& source);

}  // namespace adjoint
