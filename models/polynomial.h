// A bilinear network read as a polynomial (docs/methods.md §3): the typed view that tensor
// similarity works on. Each bilinear model builds it beside its forward (models/bilinear.cpp),
// from the same weights, so analysis never looks parameters up by state-dict strings.
//
// The network acts on a state z = (1, h_1, ..., h_T): a constant coordinate, then one
// feature vector per sequence position (T = 1 for a classifier). The steps run in order:
//   Linear     h_t ← W h_t + b_t                    (bias per position or shared, or none)
//   Bilinear   y_t = D((L h̃_t) ⊙ (R h̃_t)), h̃_t = (1, h_t); then h_t ← y_t, or h_t ← h_t + s·y_t
//              when residual
//   Attention  the bilinear-score attention of the bilinear LM (polynomial of degree five);
//              h_t ← h_t + s·proj(Σ_{u≤t} (q1_t·k1_u)(q2_t·k2_u)/d_head² · v_u), per head; q and k
//              optionally with biases and rotated by their position (rotary: the
//              tensor-similarity paper's LMs), which keeps every leg linear in h
// A token model's input is the one-hot vector of each position's token.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "engine/tensor.h"

namespace adjoint {

struct PolynomialStep {
  enum class Kind { Linear, Bilinear, Attention };
  Kind kind = Kind::Linear;
  std::string name;  // the layer's parameter prefix ("blocks.0.mlp"), for messages

  Tensor weight, bias;       // Linear: (out, in); bias (out), (T, out) or undefined
  Tensor left, right, down;  // Bilinear: (hidden, in + 1) each, bias in column 0; down (out, hidden)
                             // or undefined (out = hidden)
  Tensor qkv, proj;          // Attention: (5·dim, dim) in the order q1, k1, q2, k2, v; (dim, dim)
  Tensor qk_bias;            // Attention: (4·dim) biases of q1, k1, q2, k2, or undefined
  bool rotary = false;       // Attention: q1, k1, q2, k2 rotated by position, per head (rotate-half, base 10000)
  int64_t heads = 0;
  bool residual = false;     // Bilinear and Attention: h ← h + scale·y
  double scale = 1.0;
};

// Whether an attention step is the plain one every exact route takes: no QK biases, no rotary
// positions (a sampled estimate takes any).
inline bool plain_attention(const PolynomialStep& s) { return !s.qk_bias.defined() && !s.rotary; }

struct PolynomialView {
  std::string arch;
  int64_t input_dim = 0;  // features per position of the input
  int64_t positions = 1;  // T
  std::vector<PolynomialStep> steps;

  // Feature width after each step, and the output width.
  int64_t width_after(size_t step) const;
  int64_t output_dim() const { return steps.empty() ? input_dim : width_after(steps.size() - 1); }
};

// The network as a polynomial: evaluates the view on inputs x (N, T·input_dim) in double
// precision, giving (N, T·output_dim). What the model's forward computes, by another road:
// the test that ties the view to the forward, and the Monte-Carlo reference of the closed forms.
std::vector<double> evaluate_polynomial(const PolynomialView& view, const std::vector<double>& x, int64_t n);

}  // namespace adjoint
