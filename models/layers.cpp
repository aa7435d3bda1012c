#include "models/layers.h"

#include <algorithm>
#include <cmath>

#include "engine/autograd.h"
#include "engine/error.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/bilinear.h"
#include "ops/elementwise.h"
#include "ops/embedding.h"
#include "ops/layout.h"
#include "ops/matmul.h"
#include "ops/norm.h"

namespace adjoint {

namespace {
// torch's default for Linear and Conv: U(-1/√fan_in, 1/√fan_in) for weight and bias
// (kaiming_uniform with a = √5 reduces to this bound).
Tensor fan_in_uniform(const Shape& shape, int64_t fan_in, Generator& gen) {
  const float bound = 1.0f / std::sqrt(float(std::max<int64_t>(fan_in, 1)));
  return uniform(shape, -bound, bound, gen);
}
}  // namespace

void redraw_normal(Tensor& weight, float std, Generator& gen) {
  if (!gen.draws()) {
    gen.reserve(static_cast<uint64_t>(weight.numel()));
    return;
  }
  weight.copy_from(normal(weight.shape(), 0.0f, std, gen));
}

Linear::Linear(int64_t in, int64_t out, bool has_bias, Generator& gen) {
  weight = register_parameter("weight", fan_in_uniform({out, in}, in, gen));
  if (has_bias) bias = register_parameter("bias", fan_in_uniform({out}, in, gen));
}
Tensor Linear::forward(const Tensor& x, const Tensor& residual, const Tensor& into) const {
  return linear(x, weight, bias, residual, into, !training());
}
Tensor Linear::forward_activated(const Tensor& x, Activation then) const {
  return linear_activation(x, weight, bias, then, !training());
}

Conv2d::Conv2d(int64_t in, int64_t out, int64_t kernel, Conv2dOptions opts, bool has_bias, Generator& gen)
    : options(opts) {
  check(in % opts.groups == 0 && out % opts.groups == 0, "Conv2d: ", in, " -> ", out,
        " channels are not divisible by groups=", opts.groups);
  const int64_t fan_in = in / opts.groups * kernel * kernel;
  weight = register_parameter("weight", fan_in_uniform({out, in / opts.groups, kernel, kernel}, fan_in, gen));
  if (has_bias) bias = register_parameter("bias", fan_in_uniform({out}, fan_in, gen));
}
Tensor Conv2d::forward(const Tensor& x) const { return conv2d(x, weight, bias, options); }

Tensor conv_bn(const Conv2d& conv, const BatchNorm& bn, const Tensor& x, bool then_relu, const Tensor& residual) {
  if (!bn.training())
    return conv2d_batch_norm_eval(x, conv.weight, conv.bias, conv.options,
                                  {bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps}, then_relu, residual);
  return bn.forward(conv.forward(x), {residual, then_relu});
}

BatchNorm::BatchNorm(int64_t channels, float eps_, float momentum_) : eps(eps_), momentum(momentum_) {
  weight = register_parameter("weight", Tensor::ones({channels}));
  bias = register_parameter("bias", Tensor::zeros({channels}));
  running_mean = register_buffer("running_mean", Tensor::zeros({channels}));
  running_var = register_buffer("running_var", Tensor::ones({channels}));
  num_batches_tracked = register_buffer("num_batches_tracked", Tensor::zeros({}));
}
Tensor BatchNorm::forward(const Tensor& x, const BatchNormTail& tail) const {
  if (training()) {
    Tensor counter = num_batches_tracked;  // a handle on the buffer's storage
    counter.data()[0] += 1;
  }
  return batch_norm(x, weight, bias, running_mean, running_var, training(), momentum, eps, tail);
}

LayerNorm::LayerNorm(int64_t dim, float eps_) : eps(eps_) {
  weight = register_parameter("weight", Tensor::ones({dim}));
  bias = register_parameter("bias", Tensor::zeros({dim}));
}
Tensor LayerNorm::forward(const Tensor& x) const { return layer_norm(x, 1, weight, bias, eps); }

Embedding::Embedding(int64_t vocab, int64_t dim, Generator& gen) {
  weight = register_parameter("weight", normal({vocab, dim}, 0.0f, 1.0f, gen));
}
Tensor Embedding::forward(const std::vector<int64_t>& indices, const Shape& index_shape) const {
  return embedding(weight, indices, index_shape);
}

Bilinear::Bilinear(int64_t in, int64_t hidden, Generator& gen) {
  left = register_parameter("left", fan_in_uniform({hidden, in + 1}, in, gen));
  right = register_parameter("right", fan_in_uniform({hidden, in + 1}, in, gen));
}
Tensor Bilinear::forward(const Tensor& x) const { return bilinear(x, left, right); }

SelfAttention::SelfAttention(int64_t dim, int64_t heads_, bool qkv_bias, Generator& gen) : heads(heads_) {
  check(heads > 0 && dim % heads == 0, "SelfAttention: dim ", dim, " is not divisible by ", heads, " heads");
  qkv = register_module("qkv", std::make_shared<Linear>(dim, 3 * dim, qkv_bias, gen));
  proj = register_module("proj", std::make_shared<Linear>(dim, dim, true, gen));
}

Tensor SelfAttention::forward(const Tensor& x, bool causal, const Tensor& residual) const {
  check(x.dim() == 3, "SelfAttention: expects (batch, tokens, dim), got ", x.shape());
  // qkv (B, T, 3D) is split into heads as timm's reshape(B, T, 3, H, dh) does, in place.
  return proj->forward(packed_qkv_attention(qkv->forward(x), heads, causal), residual);
}

Tensor SelfAttention::forward_first(const Tensor& x, int64_t queries, const Tensor& residual) const {
  check(x.dim() == 3 && queries > 0 && queries <= x.size(1), "SelfAttention: ", queries,
        " queries of (batch, tokens, dim) ", x.shape());
  // Rows [0, D) of the qkv projection make the queries, rows [D, 3D) the keys and values.
  const int64_t D = x.size(2);
  auto rows = [&](const Tensor& t, int64_t from, int64_t to) { return t.defined() ? slice(t, 0, from, to) : t; };
  const bool keep_packed = !qkv->training();  // as Linear::forward
  Tensor q = linear(slice(x, 1, 0, queries), rows(qkv->weight, 0, D), rows(qkv->bias, 0, D), {}, {}, keep_packed);
  Tensor kv = linear(x, rows(qkv->weight, D, 3 * D), rows(qkv->bias, D, 3 * D), {}, {}, keep_packed);
  return proj->forward(packed_kv_attention(q, kv, heads), residual);
}

Tensor rowwise_in_chunks(const Tensor& x, int64_t rows, int64_t width,
                         const std::function<Tensor(const Tensor&, const Tensor&)>& fn) {
  check(x.dim() >= 1 && rows > 0 && width >= 0, "rowwise_in_chunks: ", rows, " rows of ", x.shape(), " to width ",
        width);
  const int64_t total = x.numel() / std::max<int64_t>(x.size(-1), 1);
  if (grad_enabled() || total <= rows) return fn(x, {});
  const Tensor flat = reshape(x, {total, x.size(-1)});
  Shape shape = x.shape();
  shape.back() = width;
  Tensor out = Tensor::empty({total, width});
  for (int64_t r = 0; r < total; r += rows) {
    const int64_t end = std::min(total, r + rows);
    Tensor into = slice(out, 0, r, end);
    const Tensor part = fn(slice(flat, 0, r, end), into);
    check(part.shape() == into.shape(), "rowwise_in_chunks: rows ", r, "..", end, " of ", x.shape(), " gave ",
          part.shape(), ", expected ", into.shape());
    if (part.data() != into.data()) {
      const Tensor values = part.contiguous();
      std::copy(values.data(), values.data() + values.numel(), into.data());
    }
  }
  return reshape(out, shape);
}

}  // namespace adjoint
