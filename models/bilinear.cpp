// Bilinear models (docs/methods.md §3): every nonlinearity is a bilinear form, so the network
// is a polynomial whose weights can be compared as tensors. Each model also describes itself
// as that polynomial (polynomial_view, models/polynomial.h), from the same layers its
// forward runs.
//
// bilinear_mlp, depth 0 (default): [embed: Linear(d→e, no bias)] → Bilinear(→hidden) → head
//   Linear(hidden→classes, no bias, the "D" matrix). Blocks: ["embed",] "bilinear", "head".
// bilinear_mlp, depth K ≥ 1: [embed: Linear(d→dim, no bias)] → K residual blocks
//   h ← h + s·out((L h̃) ⊙ (R h̃)) (width dim, or d without embed; hidden units per block) →
//   head Linear(→classes, no bias). Blocks: ["embed",] "blocks.<i>", "head".
//   Images are flattened.
// bilinear_lm: token embedding + learned positions, `depth` residual blocks
//   x ← x + s·attn(x); x ← x + s·D((L x̃) ⊙ (R x̃)), attention softmax (causal) or the
//   bilinear polynomial score ((q1·k1)(q2·k2))/d_head² with a causal mask and no softmax,
//   then an unembedding. Input: (B, T) token ids stored as floats. Output: (B, T, vocab).
//   Blocks: "embed", "blocks.<i>", "unembed".
#include <cmath>

#include "engine/error.h"
#include "models/layers.h"
#include "models/model.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/matmul.h"

namespace adjoint {

namespace {

// A residual connection x + scale·f. At the default scale of 1 the product is left out: a
// pass over the activations (and another in the backward pass) that would change nothing.
Tensor residual(const Tensor& x, const Tensor& f, float scale) { return scale == 1.0f ? x + f : x + f * scale; }

PolynomialStep linear_step(const std::string& name, const Linear& layer) {
  PolynomialStep s;
  s.kind = PolynomialStep::Kind::Linear;
  s.name = name;
  s.weight = layer.weight;
  s.bias = layer.bias;
  return s;
}

// out((L h̃) ⊙ (R h̃)): the bilinear feed-forward layer of the deep MLP and the LM's blocks.
class BilinearFeedForward : public Module {
public:
  BilinearFeedForward(int64_t dim, int64_t hidden, Generator& gen) {
    bilinear = register_module("bilinear", std::make_shared<Bilinear>(dim, hidden, gen));
    out = register_module("out", std::make_shared<Linear>(hidden, dim, false, gen));
  }
  Tensor forward(const Tensor& x) const { return out->forward(bilinear->forward(x)); }
  PolynomialStep step(const std::string& name, double scale) const {
    PolynomialStep s;
    s.kind = PolynomialStep::Kind::Bilinear;
    s.name = name;
    s.left = bilinear->left, s.right = bilinear->right, s.down = out->weight;
    s.residual = true, s.scale = scale;
    return s;
  }
  std::shared_ptr<Bilinear> bilinear;
  std::shared_ptr<Linear> out;
};

class BilinearMlp : public Model {
public:
  BilinearMlp(const ModelConfig& config, Generator& gen) : Model(config) {
    input_dim_ = config.in_features > 0 ? config.in_features : config.in_channels * config.image_size * config.image_size;
    int64_t width = input_dim_;
    if (config.dim > 0) {
      embed_ = register_module("embed", std::make_shared<Linear>(width, config.dim, false, gen));
      add_block("embed", [embed = embed_](const Tensor& x) { return embed->forward(flatten(x, 1)); });
      width = config.dim;
    }
    if (config.depth > 0) {
      const float scale = float(config.residual_scale);
      auto blocks = register_module("blocks", std::make_shared<Module>());
      for (int64_t i = 0; i < config.depth; ++i) {
        auto block = blocks->register_module(std::to_string(i), std::make_shared<BilinearFeedForward>(width, config.hidden, gen));
        blocks_.push_back(block);
        add_block(cat("blocks.", i), [block, scale](const Tensor& x) {
          Tensor h = flatten(x, 1);
          return residual(h, block->forward(h), scale);
        });
      }
    } else {
      layer_ = register_module("bilinear", std::make_shared<Bilinear>(width, config.hidden, gen));
      add_block("bilinear", [layer = layer_](const Tensor& x) { return layer->forward(flatten(x, 1)); });
      width = config.hidden;
    }
    head_ = register_module("head", std::make_shared<Linear>(width, config.num_classes, false, gen));
    add_block("head", [head = head_](const Tensor& x) { return head->forward(x); });
  }

  PolynomialView polynomial_view(int64_t) const override {
    PolynomialView v{config().arch, input_dim_, 1, {}};
    if (embed_) v.steps.push_back(linear_step("embed", *embed_));
    for (size_t i = 0; i < blocks_.size(); ++i)
      v.steps.push_back(blocks_[i]->step(cat("blocks.", i), config().residual_scale));
    if (layer_) {
      // The one-layer model: the head is the bilinear layer's D (a Linear after it would be too).
      PolynomialStep s;
      s.kind = PolynomialStep::Kind::Bilinear;
      s.name = "bilinear";
      s.left = layer_->left, s.right = layer_->right, s.down = head_->weight;
      v.steps.push_back(s);
    } else {
      v.steps.push_back(linear_step("head", *head_));
    }
    return v;
  }

private:
  int64_t input_dim_ = 0;
  std::shared_ptr<Linear> embed_, head_;
  std::shared_ptr<Bilinear> layer_;
  std::vector<std::shared_ptr<BilinearFeedForward>> blocks_;
};

// Polynomial attention: S = ((Q1 K1ᵀ) ⊙ (Q2 K2ᵀ)) / d_head² ⊙ causal mask, out = S V.
class BilinearAttention : public Module {
public:
  BilinearAttention(int64_t dim, int64_t heads_, Generator& gen) : heads(heads_) {
    check(dim % heads == 0, "bilinear attention: dim ", dim, " is not divisible by ", heads, " heads");
    qkv = register_module("qkv", std::make_shared<Linear>(dim, 5 * dim, false, gen));
    proj = register_module("proj", std::make_shared<Linear>(dim, dim, false, gen));
  }
  Tensor forward(const Tensor& x) const {
    const int64_t B = x.size(0), T = x.size(1), D = x.size(2), dh = D / heads;
    Tensor parts = permute(reshape(qkv->forward(x), {B, T, 5, heads, dh}), {2, 0, 3, 1, 4});  // (5,B,H,T,dh)
    auto part = [&](int64_t i) { return squeeze(slice(parts, 0, i, i + 1), 0); };
    Tensor s1 = matmul(part(0), transpose(part(1), 2, 3));
    Tensor s2 = matmul(part(2), transpose(part(3), 2, 3));
    Tensor mask = Tensor::zeros({T, T});
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j <= i; ++j) mask.data()[i * T + j] = 1.0f / float(dh * dh);
    Tensor scores = s1 * s2 * broadcast_to(mask, {B, heads, T, T});
    Tensor o = matmul(scores, part(4));  // (B, H, T, dh)
    return proj->forward(reshape(transpose(o, 1, 2), {B, T, D}));
  }
  int64_t heads;
  std::shared_ptr<Linear> qkv, proj;
};

class BilinearLmBlock : public Module {
public:
  BilinearLmBlock(const ModelConfig& c, int64_t dim, int64_t heads, Generator& gen) : scale(float(c.residual_scale)) {
    if (c.layer_norm) {
      norm1 = register_module("norm1", std::make_shared<LayerNorm>(dim));
      norm2 = register_module("norm2", std::make_shared<LayerNorm>(dim));
    }
    if (c.attention == "bilinear") poly_attn = register_module("attn", std::make_shared<BilinearAttention>(dim, heads, gen));
    else if (c.attention == "softmax") softmax_attn = register_module("attn", std::make_shared<SelfAttention>(dim, heads, false, gen));
    else throw UsageError(cat("bilinear_lm: attention must be softmax or bilinear, got '", c.attention, "'"));
    mlp = register_module("mlp", std::make_shared<BilinearFeedForward>(dim, dim * c.mlp_ratio, gen));
  }
  Tensor forward(const Tensor& x) const {
    Tensor a = norm1 ? norm1->forward(x) : x;
    a = poly_attn ? poly_attn->forward(a) : softmax_attn->forward(a, true);
    Tensor h = residual(x, a, scale);
    Tensor m = norm2 ? norm2->forward(h) : h;
    return residual(h, mlp->forward(m), scale);
  }

  // The block's two polynomial steps; a LayerNorm or softmax attention is refused by name.
  void append_steps(const std::string& name, std::vector<PolynomialStep>& steps) const {
    if (norm1) throw Error(cat("bilinear_lm: ", name, ".norm1 is a LayerNorm, which is not polynomial"));
    if (softmax_attn) throw Error(cat("bilinear_lm: ", name, ".attn is softmax attention, which is not polynomial"));
    PolynomialStep a;
    a.kind = PolynomialStep::Kind::Attention;
    a.name = name + ".attn";
    a.qkv = poly_attn->qkv->weight, a.proj = poly_attn->proj->weight, a.heads = poly_attn->heads;
    a.residual = true, a.scale = scale;
    steps.push_back(a);
    steps.push_back(mlp->step(name + ".mlp", scale));
  }

private:
  float scale;
  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<BilinearAttention> poly_attn;
  std::shared_ptr<SelfAttention> softmax_attn;
  std::shared_ptr<BilinearFeedForward> mlp;
};

class BilinearLm : public Model {
public:
  BilinearLm(const ModelConfig& c, Generator& gen) : Model(c) {
    const int64_t dim = c.dim > 0 ? c.dim : 256, depth = c.depth > 0 ? c.depth : 2, heads = c.heads > 0 ? c.heads : 4;
    auto embed = register_module("embed", std::make_shared<Embedding>(c.vocab, dim, gen));
    Tensor pos = register_parameter("pos_embed", normal({c.seq_len, dim}, 0.0f, 0.02f, gen));
    const int64_t vocab = c.vocab, max_len = c.seq_len;
    add_block("embed", [embed, pos, vocab, max_len](const Tensor& tokens) {
      check(tokens.dim() == 2, "bilinear_lm: expects token ids of shape (batch, length), got ", tokens.shape());
      const int64_t B = tokens.size(0), T = tokens.size(1);
      check(T <= max_len, "bilinear_lm: sequence length ", T, " exceeds the model's ", max_len);
      std::vector<int64_t> ids(size_t(B * T));
      std::vector<float> values = tokens.to_vector();
      for (size_t i = 0; i < ids.size(); ++i) {
        ids[i] = int64_t(values[i]);
        check(values[i] == float(ids[i]) && ids[i] >= 0 && ids[i] < vocab, "bilinear_lm: token ", values[i],
              " at position ", i, " is not an id in [0, ", vocab, ")");
      }
      Tensor x = embed->forward(ids, {B, T});
      return x + broadcast_to(unsqueeze(slice(pos, 0, 0, T), 0), x.shape());
    });
    auto blocks = register_module("blocks", std::make_shared<Module>());
    for (int64_t i = 0; i < depth; ++i) {
      auto block = blocks->register_module(std::to_string(i), std::make_shared<BilinearLmBlock>(c, dim, heads, gen));
      blocks_.push_back(block);
      add_block(cat("blocks.", i), [block](const Tensor& x) { return block->forward(x); });
    }
    unembed_ = register_module("unembed", std::make_shared<Linear>(dim, c.vocab, false, gen));
    add_block("unembed", [unembed = unembed_](const Tensor& x) { return unembed->forward(x); });
    embed_ = embed, pos_ = pos;
  }

  // Over `positions` tokens (the context the comparison looks at): the embedding is a linear
  // map of each position's one-hot token with the position's embedding as its bias.
  PolynomialView polynomial_view(int64_t positions) const override {
    if (positions == 0) positions = pos_.size(0);
    check(positions >= 1 && positions <= pos_.size(0), "bilinear_lm: a context of ", positions,
          " positions is outside [1, ", pos_.size(0), "]");
    PolynomialView v{config().arch, config().vocab, positions, {}};
    PolynomialStep e;
    e.kind = PolynomialStep::Kind::Linear;
    e.name = "embed";
    e.weight = transpose(embed_->weight, 0, 1).contiguous();  // (dim, vocab)
    e.bias = slice(pos_, 0, 0, positions).contiguous();        // (T, dim)
    v.steps.push_back(e);
    for (size_t i = 0; i < blocks_.size(); ++i) blocks_[i]->append_steps(cat("blocks.", i), v.steps);
    v.steps.push_back(linear_step("unembed", *unembed_));
    return v;
  }

private:
  std::shared_ptr<Embedding> embed_;
  Tensor pos_;
  std::vector<std::shared_ptr<BilinearLmBlock>> blocks_;
  std::shared_ptr<Linear> unembed_;
};

}  // namespace

std::shared_ptr<Model> make_bilinear(const ModelConfig& config, Generator& gen) {
  if (config.arch == "bilinear_mlp") return std::make_shared<BilinearMlp>(config, gen);
  if (config.arch == "bilinear_lm") return std::make_shared<BilinearLm>(config, gen);
  throw UsageError(cat("unknown bilinear model '", config.arch, "' (bilinear_mlp, bilinear_lm)"));
}

}  // namespace adjoint
