// Scaled dot-product attention and its transports (docs/methods.md §1.2).
//
//   A = softmax(Q Kᵀ·s [+ causal mask]) row-wise,   out = A V.
//
// Gradient      exact through Q, K and V.
// Pullback      the pattern A is state: held fixed, the cotangent flows through V only
//               (dV = Aᵀu); nothing reaches Q and K.
// SoftPullback  the pattern is recomputed at a temperature, A_τ = softmax(Q Kᵀ·s/τ) with
//               the same mask (τ = tau.attention), held fixed: dV = A_τᵀu, nothing to Q, K.
#pragma once
#include "engine/tensor.h"

namespace adjoint {

// q (B, H, T, d), k (B, H, S, d), v (B, H, S, dv) → (B, H, T, dv). Any number of leading
// batch dims is accepted as long as q, k and v agree on them. causal masks key j for
// query i when j > i (top-left aligned, as torch.ones(T, S).tril()). scale < 0 means
// 1/sqrt(d).
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal = false,
                                    float scale = -1.0f);

// Multi-head self-attention on the packed output of a qkv projection, laid out as timm and
// nanoGPT do: qkv (B, T, 3·D) holds, per token, q then k then v, each `heads` heads of
// D/heads. Returns (B, T, D) with the heads side by side, ready for the output projection.
// The maths and transports are scaled_dot_product_attention's on the split heads; the heads
// are read and written in place, so neither they nor their cotangents are copied.
Tensor packed_qkv_attention(const Tensor& qkv, int64_t heads, bool causal = false, float scale = -1.0f);

// The same attention for queries that are a subset of the tokens: q (B, Tq, D) from the
// query part of a qkv projection, kv (B, S, 2·D) its key and value parts (per token, k then
// v, each `heads` heads of D/heads). Returns (B, Tq, D). A model whose output reads only
// some tokens (a ViT's class token, after the last block) projects and attends only those
// queries; the keys and values still come from every token. Not causal: the queries need
// not be the first Tq tokens of the sequence.
Tensor packed_kv_attention(const Tensor& q, const Tensor& kv, int64_t heads, float scale = -1.0f);

}  // namespace adjoint
