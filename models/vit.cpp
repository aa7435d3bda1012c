// Vision Transformer with timm's parameter names (patch_embed.proj, cls_token,
// pos_embed, blocks.<i>.norm1/attn.qkv/attn.proj/norm2/mlp.fc1/mlp.fc2, norm, head); the
// torchvision's sizes (vit_b_16, vit_b_32, vit_l_16) read weight files in torchvision's
// names too (ModelFacts::weight_file_names). Patch embedding, class token, learned position embeddings, pre-LN blocks with GELU
// MLPs, any patch size that divides the image.
// Blocks: "patch_embed" (tokens + class token + positions), "blocks.<i>", "head".
// The head pools as timm does: pool "token" takes the class token after the final `norm`;
// pool "avg" (timm's global_pool='avg') averages the patch tokens, leaving the class token
// out, and normalises the mean with `fc_norm`.
#include "engine/error.h"
#include "models/layers.h"
#include "models/model.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/reduce.h"

namespace adjoint {

namespace {

class VitBlock : public Module {
public:
  VitBlock(int64_t dim, int64_t heads, int64_t mlp_ratio, Generator& gen) {
    norm1 = register_module("norm1", std::make_shared<LayerNorm>(dim, 1e-6f));
    attn = register_module("attn", std::make_shared<SelfAttention>(dim, heads, true, gen));
    norm2 = register_module("norm2", std::make_shared<LayerNorm>(dim, 1e-6f));
    auto mlp = register_module("mlp", std::make_shared<Module>());
    fc1 = mlp->register_module("fc1", std::make_shared<Linear>(dim, dim * mlp_ratio, true, gen));
    fc2 = mlp->register_module("fc2", std::make_shared<Linear>(dim * mlp_ratio, dim, true, gen));
  }
  // The residual connections' sums are made by the projections before them (x + attn(…) by
  // attn.proj, h + mlp(…) by mlp.fc2), which accumulate onto the residual.
  Tensor forward(const Tensor& x) const { return with_mlp(attn->forward(norm1->forward(x), false, x)); }
  // The outputs of the first `tokens` tokens alone, each attending to every token.
  Tensor forward_first(const Tensor& x, int64_t tokens) const {
    return with_mlp(attn->forward_first(norm1->forward(x), tokens, slice(x, 1, 0, tokens)));
  }

private:
  // The MLP half of the block, h + mlp(norm2(h)): token by token, so at inference it runs
  // on chunks of 1024 tokens, fc1's output staying in cache through GELU and fc2
  // (docs/benchmarks.md), and fc2 writing each chunk's rows of the block's output. fc1
  // applies the GELU itself where its product can (Linear::forward_activated).
  Tensor with_mlp(const Tensor& h) const {
    return rowwise_in_chunks(h, 1024, h.size(-1), [this](const Tensor& t, const Tensor& into) {
      return fc2->forward(fc1->forward_activated(norm2->forward(t), Activation::Gelu), t, into);
    });
  }

  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<SelfAttention> attn;
  std::shared_ptr<Linear> fc1, fc2;
};

// torchvision's names for the same parameters (VisionTransformer: conv_proj, class_token,
// encoder.pos_embedding, encoder.layers.encoder_layer_<i>, encoder.ln, heads.head). Its MLP
// is an nn.Sequential (mlp.0, mlp.3) since torchvision 0.14, mlp.linear_1/linear_2 before.
NameRules torchvision_vit_names() {
  const std::string layer = R"(^encoder\.layers\.encoder_layer_(\d+)\.)";
  return {
      {R"(^conv_proj\.)", "patch_embed.proj."},
      {R"(^class_token$)", "cls_token"},
      {R"(^encoder\.pos_embedding$)", "pos_embed"},
      {layer + R"(ln_1\.)", "blocks.$1.norm1."},
      {layer + R"(self_attention\.in_proj_weight$)", "blocks.$1.attn.qkv.weight"},
      {layer + R"(self_attention\.in_proj_bias$)", "blocks.$1.attn.qkv.bias"},
      {layer + R"(self_attention\.out_proj\.)", "blocks.$1.attn.proj."},
      {layer + R"(ln_2\.)", "blocks.$1.norm2."},
      {layer + R"(mlp\.(?:0|linear_1)\.)", "blocks.$1.mlp.fc1."},
      {layer + R"(mlp\.(?:3|linear_2)\.)", "blocks.$1.mlp.fc2."},
      {R"(^encoder\.ln\.)", "norm."},
      {R"(^heads\.head\.)", "head."},
  };
}

class Vit : public Model {
public:
  PolynomialView polynomial_view(int64_t) const override {
    throw Error(cat(config().arch, ": blocks.0.norm1 is a LayerNorm (and blocks.0.attn softmax attention, the MLP a "
                    "GELU), which is not polynomial; tensor similarity compares bilinear models"));
  }
  Vit(const ModelConfig& config, int64_t dim, int64_t depth, int64_t heads, bool torchvision_names, Generator& gen)
      : Model(config) {
    const int64_t p = config.patch, side = config.image_size;
    check(p > 0 && side % p == 0, "vit: patch size ", p, " does not divide the image size ", side);
    const int64_t tokens = (side / p) * (side / p) + 1;
    Conv2dOptions patchify;
    patchify.stride_h = patchify.stride_w = p;
    auto patch_embed = register_module("patch_embed", std::make_shared<Module>());
    auto proj = patch_embed->register_module("proj", std::make_shared<Conv2d>(config.in_channels, dim, p, patchify, true, gen));
    Tensor cls = register_parameter("cls_token", normal({1, 1, dim}, 0.0f, 0.02f, gen));
    Tensor pos = register_parameter("pos_embed", normal({1, tokens, dim}, 0.0f, 0.02f, gen));
    add_block("patch_embed", [proj, cls, pos, dim, tokens](const Tensor& x) {
      const int64_t B = x.size(0);
      Tensor t = proj->forward(x);                               // (B, D, h, w)
      t = transpose(reshape(t, {B, dim, tokens - 1}), 1, 2);     // (B, N, D)
      t = concat({broadcast_to(cls, {B, 1, dim}), t}, 1);         // (B, 1 + N, D)
      check(t.size(1) == tokens, "vit: input ", x.shape(), " gives ", t.size(1), " tokens, the model expects ", tokens);
      return t + broadcast_to(pos, t.shape());
    });
    auto blocks = register_module("blocks", std::make_shared<Module>());
    std::shared_ptr<VitBlock> block;
    for (int64_t i = 0; i < depth; ++i) {
      block = blocks->register_module(std::to_string(i), std::make_shared<VitBlock>(dim, heads, config.mlp_ratio, gen));
      add_block(cat("blocks.", i), [block](const Tensor& x) { return block->forward(x); });
    }
    const bool average = config.pool == "avg";
    auto norm = register_module(average ? "fc_norm" : "norm", std::make_shared<LayerNorm>(dim, 1e-6f));
    auto head = register_module("head", std::make_shared<Linear>(dim, config.num_classes, true, gen));
    auto class_token_head = [norm, head](const Tensor& x) { return head->forward(squeeze(norm->forward(x), 1)); };
    if (!average && block)
      // The head reads the class token alone, so the last block need only compute its row:
      // the queries', the MLP's and the projections' products shrink from 1 + N tokens to 1
      // (only the keys and values need every token): 6.9% of ViT-Tiny's multiply-adds saved.
      set_with_next([block, class_token_head](const Tensor& x) {
        return class_token_head(block->forward_first(x, 1));
      });
    add_block("head", [norm, head, average, class_token_head](const Tensor& x) {
      if (average) return head->forward(norm->forward(mean(slice(x, 1, 1, x.size(1)), {1})));  // (B, D)
      return class_token_head(slice(x, 1, 0, 1));  // LayerNorm is per token: normalise the class token alone
    });
    // Grad-CAM reads the input of the last transformer block: the gradient at the patch
    // tokens of its output is zero (analysis/pullbacks/explain.h).
    set_facts({.gradcam_block = depth >= 2 ? cat("blocks.", depth - 2) : std::string("patch_embed"),
               .has_dropout = false,
               .default_optimizer = "adamw",
               .weight_file_names = torchvision_names ? torchvision_vit_names() : NameRules{}});
  }
};

}  // namespace

std::shared_ptr<Model> make_vit(const ModelConfig& requested, Generator& gen) {
  // timm's sizes take their patch from the config; torchvision's fix theirs and their files
  // use torchvision's names.
  struct Size {
    const char* arch;
    int64_t dim, depth, heads, patch;  // 0: from the config
    bool torchvision;
  };
  static constexpr Size kSizes[] = {
      {"vit_tiny", 192, 12, 3, 0, false},     {"vit_small", 384, 12, 6, 0, false},
      {"vit_base", 768, 12, 12, 0, false},    {"vit_custom", 0, 12, 0, 0, false},
      {"vit_b_16", 768, 12, 12, 16, true},    {"vit_b_32", 768, 12, 12, 32, true},
      {"vit_l_16", 1024, 24, 16, 16, true},
  };
  const Size* size = nullptr;
  std::string known;
  for (const Size& s : kSizes) {
    if (requested.arch == s.arch) size = &s;
    known += (known.empty() ? "" : ", ") + std::string(s.arch);
  }
  if (size == nullptr) throw UsageError(cat("unknown ViT '", requested.arch, "' (", known, ")"));
  ModelConfig config = requested;
  if (size->patch > 0) config.patch = size->patch;
  const int64_t dim = config.dim > 0 ? config.dim : size->dim;
  const int64_t depth = config.depth > 0 ? config.depth : size->depth;
  const int64_t heads = config.heads > 0 ? config.heads : size->heads;
  if (config.pool != "token" && config.pool != "avg")
    throw UsageError(cat("vit: pool must be token or avg, got '", config.pool, "'"));
  check(dim > 0 && heads > 0, "vit_custom needs dim and heads (got dim ", dim, ", heads ", heads, ")");
  return std::make_shared<Vit>(config, dim, depth, heads, size->torchvision, gen);
}

}  // namespace adjoint
