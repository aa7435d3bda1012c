// Layers: modules that own their parameters and call one op. Parameter names follow
// torch.nn ("weight", "bias", "running_mean", ...), so a model assembled from them has
// torchvision/timm state-dict names. Initialisation follows torch's defaults.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>

#include "engine/module.h"
#include "engine/random.h"
#include "ops/activation.h"
#include "ops/conv.h"
#include "ops/norm.h"

namespace adjoint {

// Draws `weight` afresh from N(0, std²) in place (torchvision's kaiming_normal). A generator
// without draws (a model whose weights a file then overwrites) only reserves the counters a
// draw would use and leaves `weight` as it is (the zeros that generator made it with): no
// second tensor of its size is made and copied.
void redraw_normal(Tensor& weight, float std, Generator& gen);

class Linear : public Module {
public:
  Linear(int64_t in, int64_t out, bool bias, Generator& gen);
  // With `residual`: residual + the layer's output, summed by the product (ops/matmul.h).
  // With `into`: the output written there, outside a graph (ops/matmul.h linear).
  Tensor forward(const Tensor& x, const Tensor& residual = {}, const Tensor& into = {}) const;
  // activation(forward(x), then), the activation applied by the product where it can
  // (ops/matmul.h linear_activation).
  Tensor forward_activated(const Tensor& x, Activation then) const;
  Tensor weight, bias;  // (out, in), (out) or undefined
};

class Conv2d : public Module {
public:
  Conv2d(int64_t in, int64_t out, int64_t kernel, Conv2dOptions options, bool bias, Generator& gen);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;  // (out, in/groups, k, k), (out) or undefined
  Conv2dOptions options;
};

// BatchNorm over channel axis 1 (works for (N,C,H,W) and (N,C)).
class BatchNorm : public Module {
public:
  explicit BatchNorm(int64_t channels, float eps = 1e-5f, float momentum = 0.1f);
  // With `tail`: + residual and the ReLU applied as the output is written (ops/norm.h).
  Tensor forward(const Tensor& x, const BatchNormTail& tail = {}) const;
  Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  float eps, momentum;
};

// bn(conv(x)), + residual when defined (a residual block's shortcut), then a ReLU when
// `then_relu`. In eval mode one op, which fuses them when nothing is recorded (ops/conv.h
// conv2d_batch_norm_eval); in training mode the convolution, then the BatchNorm with the
// residual and ReLU as its tail (ops/norm.h).
Tensor conv_bn(const Conv2d& conv, const BatchNorm& bn, const Tensor& x, bool then_relu,
               const Tensor& residual = Tensor());

// LayerNorm over the last axis.
class LayerNorm : public Module {
public:
  explicit LayerNorm(int64_t dim, float eps = 1e-5f);
  Tensor forward(const Tensor& x) const;
  Tensor weight, bias;
  float eps;
};

class Embedding : public Module {
public:
  Embedding(int64_t vocab, int64_t dim, Generator& gen);
  // indices of shape index_shape → index_shape + [dim]
  Tensor forward(const std::vector<int64_t>& indices, const Shape& index_shape) const;
  Tensor weight;  // (vocab, dim)
};

// (L x̃) ⊙ (R x̃) with x̃ = (1, x): column 0 of `left`/`right` is the bias (docs/methods.md §3.1).
class Bilinear : public Module {
public:
  Bilinear(int64_t in, int64_t hidden, Generator& gen);
  Tensor forward(const Tensor& x) const;
  Tensor left, right;  // (hidden, in + 1)
};

// Multi-head self-attention as timm's Attention: one qkv projection, one output projection.
class SelfAttention : public Module {
public:
  SelfAttention(int64_t dim, int64_t heads, bool qkv_bias, Generator& gen);
  // (B, T, dim) → (B, T, dim); with `residual` (B, T, dim), residual + the attention's output,
  // summed by the output projection.
  Tensor forward(const Tensor& x, bool causal = false, const Tensor& residual = {}) const;
  // The outputs of the first `queries` tokens alone, (B, queries, dim), each attending to
  // every token: only their rows of the query projection are computed. `residual` as above,
  // (B, queries, dim).
  Tensor forward_first(const Tensor& x, int64_t queries, const Tensor& residual = {}) const;
  int64_t heads;
  std::shared_ptr<Linear> qkv, proj;
};

// fn(x) for a row-wise fn: one whose output row r (along the last axis, `width` wide)
// depends on row r of x alone, such as a transformer's per-token MLP. When no graph is being
// recorded it runs on chunks of `rows` rows at a time, so that fn's wide intermediates (an
// MLP's hidden layer, four times the width) stay in cache from one op to the next instead of
// making passes over memory; the results are the same. fn(chunk, into) gets the chunk's rows
// of the output as `into` (contiguous) and may write its result there itself (a last linear
// layer's `into`), which saves copying it; a result elsewhere is copied in. Recording a
// graph, or when one chunk holds every row, it is one call fn(x, {}), since the backward
// pass keeps every intermediate anyway.
Tensor rowwise_in_chunks(const Tensor& x, int64_t rows, int64_t width,
                         const std::function<Tensor(const Tensor&, const Tensor&)>& fn);

}  // namespace adjoint
