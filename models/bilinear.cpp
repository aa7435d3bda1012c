// Bilinear models (METHODS.md §3): every nonlinearity is a bilinear form, so the network
// is a polynomial whose weights can be compared as tensors.
//
// bilinear_mlp: [embed: Linear(d→e, no bias)] → Bilinear(→hidden) → head Linear(hidden→classes,
//   no bias, the "D" matrix). Blocks: ["embed",] "bilinear", "head". Images are flattened.
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

class BilinearMlp : public Model {
public:
  BilinearMlp(const ModelConfig& config, Generator& gen) : Model(config) {
    int64_t in = config.in_features > 0 ? config.in_features : config.in_channels * config.image_size * config.image_size;
    if (config.dim > 0) {
      auto embed = register_module("embed", std::make_shared<Linear>(in, config.dim, false, gen));
      add_block("embed", [embed](const Tensor& x) { return embed->forward(flatten(x, 1)); });
      in = config.dim;
    }
    auto layer = register_module("bilinear", std::make_shared<Bilinear>(in, config.hidden, gen));
    add_block("bilinear", [layer](const Tensor& x) { return layer->forward(flatten(x, 1)); });
    auto head = register_module("head", std::make_shared<Linear>(config.hidden, config.num_classes, false, gen));
    add_block("head", [head](const Tensor& x) { return head->forward(x); });
  }
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
    auto mlp = register_module("mlp", std::make_shared<Module>());
    mlp_in = mlp->register_module("bilinear", std::make_shared<Bilinear>(dim, dim * c.mlp_ratio, gen));
    mlp_out = mlp->register_module("out", std::make_shared<Linear>(dim * c.mlp_ratio, dim, false, gen));
  }
  Tensor forward(const Tensor& x) const {
    Tensor a = norm1 ? norm1->forward(x) : x;
    a = poly_attn ? poly_attn->forward(a) : softmax_attn->forward(a, true);
    Tensor h = x + a * scale;
    Tensor m = norm2 ? norm2->forward(h) : h;
    return h + mlp_out->forward(mlp_in->forward(m)) * scale;
  }

private:
  float scale;
  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<BilinearAttention> poly_attn;
  std::shared_ptr<SelfAttention> softmax_attn;
  std::shared_ptr<Bilinear> mlp_in;
  std::shared_ptr<Linear> mlp_out;
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
      add_block(cat("blocks.", i), [block](const Tensor& x) { return block->forward(x); });
    }
    auto unembed = register_module("unembed", std::make_shared<Linear>(dim, c.vocab, false, gen));
    add_block("unembed", [unembed](const Tensor& x) { return unembed->forward(x); });
  }
};

}  // namespace

std::shared_ptr<Model> make_bilinear(const ModelConfig& config, Generator& gen) {
  if (config.arch == "bilinear_mlp") return std::make_shared<BilinearMlp>(config, gen);
  if (config.arch == "bilinear_lm") return std::make_shared<BilinearLm>(config, gen);
  throw UsageError(cat("unknown bilinear model '", config.arch, "' (bilinear_mlp, bilinear_lm)"));
}

}  // namespace adjoint
