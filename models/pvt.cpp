// Pyramid Vision Transformer v2 (b0–b5, Wang et al. 2021) with the parameter names of
// current timm (timm/models/pvt_v2.py, the layout its hub checkpoints timm/pvt_v2_b*.in1k
// use; the original repository's names, patch_embed2 and block1.0.mlp.dwconv.dwconv, are
// what timm's checkpoint filter renames into these):
//
//   patch_embed.proj, patch_embed.norm                        stage 0's overlapping embedding
//   stages.<i>.downsample.proj, .norm                         stages 1–3's embeddings
//   stages.<i>.blocks.<j>.norm1, attn.q, attn.kv, attn.sr, attn.norm, attn.proj,
//                         norm2, mlp.fc1, mlp.dwconv, mlp.fc2
//   stages.<i>.norm, head
//
// Four stages. Each starts with an overlapping patch embedding (a convolution of kernel 7,
// stride 4 for the image, kernel 3, stride 2 after; then a LayerNorm over channels) and
// runs pre-norm blocks on the map's tokens: spatial-reduction attention (queries from
// every token; keys and values from the tokens of the map shrunk by a convolution of
// kernel = stride = sr_ratio and a LayerNorm, when sr_ratio > 1) and an MLP with a
// depth-wise 3×3 convolution between fc1 and GELU, on the tokens laid back on their map.
// A stage ends with its LayerNorm; the head averages the last stage's tokens.
//
// Blocks: "patch_embed", "stages.<i>.downsample" (i ≥ 1), "stages.<i>.blocks.<j>" (the last
// block of a stage applies the stage's norm), "head". Between blocks the features are maps
// (B, C, H, W), so stitching and Grad-CAM read them as they read a CNN's (channels last in memory).
//
// Reduced configs: `width` scales every head's width (a stage's dim is heads × the scaled
// head width, so heads still divide it) and `depth`, when set, is every stage's block count.
#include <cmath>

#include "engine/autograd.h"
#include "engine/error.h"
#include "models/layers.h"
#include "models/model.h"
#include "ops/activation.h"
#include "ops/attention.h"
#include "ops/depthwise_conv.h"
#include "ops/layout.h"
#include "ops/matmul.h"
#include "ops/patch_conv.h"
#include "ops/reduce.h"

namespace adjoint {

namespace {

// A variant's per-stage sizes, as timm's pvt_v2_b* functions set them.
struct PvtSizes {
  const char* name;
  std::vector<int64_t> dims, depths;
  std::vector<int64_t> mlp_ratios = {8, 8, 4, 4};
};
const std::vector<int64_t> kHeads = {1, 2, 5, 8};
const std::vector<int64_t> kReduction = {8, 4, 2, 1};

const std::vector<PvtSizes>& variants() {
  static const std::vector<PvtSizes> table = {
      {"pvt_v2_b0", {32, 64, 160, 256}, {2, 2, 2, 2}},
      {"pvt_v2_b1", {64, 128, 320, 512}, {2, 2, 2, 2}},
      {"pvt_v2_b2", {64, 128, 320, 512}, {3, 4, 6, 3}},
      {"pvt_v2_b3", {64, 128, 320, 512}, {3, 4, 18, 3}},
      {"pvt_v2_b4", {64, 128, 320, 512}, {3, 8, 27, 3}},
      {"pvt_v2_b5", {64, 128, 320, 512}, {3, 6, 40, 3}, {4, 4, 4, 4}},
  };
  return table;
}

// Between blocks the features are maps (B, C, H, W) whose memory is channels last, (B, H,
// W, C): the tokens' own layout, so that passing from tokens to a map and back copies
// nothing (a copy each way, and each way again in backward, for every block). A map that
// is laid out channels first (a convolution's output) is copied once, here.

// (B, C, H, W) → (B, H·W, C): a map's tokens, row-major, as timm's flatten(2).transpose(1, 2).
Tensor map_tokens(const Tensor& map) {
  return reshape(permute(map, {0, 2, 3, 1}), {map.size(0), map.size(2) * map.size(3), map.size(1)});
}

// (B, H·W, C) → (B, C, H, W): the inverse of map_tokens, a view of the tokens.
Tensor tokens_map(const Tensor& tokens, int64_t H, int64_t W) {
  return permute(reshape(tokens, {tokens.size(0), H, W, tokens.size(2)}), {0, 3, 1, 2});
}

// Convolution with a square kernel, stride and padding, and a bias.
std::shared_ptr<Conv2d> conv(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t padding,
                             int64_t groups, Generator& gen) {
  return std::make_shared<Conv2d>(in, out, kernel, Conv2dOptions::square(stride, padding, 1, groups), true, gen);
}

// A convolution whose kernel overlaps its neighbours' (kernel > stride), then a LayerNorm
// over channels: (B, C, H, W) → (B, dim, H/stride, W/stride).
class OverlapPatchEmbed : public Module {
public:
  OverlapPatchEmbed(int64_t in, int64_t dim, int64_t kernel, int64_t stride, Generator& gen) {
    proj = register_module("proj", conv(in, dim, kernel, stride, kernel / 2, 1, gen));
    norm = register_module("norm", std::make_shared<LayerNorm>(dim, 1e-5f));
  }
  Tensor forward(const Tensor& x) const {
    const Tensor map = proj->forward(x);
    return tokens_map(norm->forward(map_tokens(map)), map.size(2), map.size(3));
  }

private:
  std::shared_ptr<Conv2d> proj;
  std::shared_ptr<LayerNorm> norm;
};

// Attention whose keys and values come from the map shrunk by `reduction` on each side,
// so a stage-1 token attends to 64 times fewer keys than there are tokens.
class SpatialReductionAttention : public Module {
public:
  SpatialReductionAttention(int64_t dim, int64_t heads_, int64_t reduction_, Generator& gen)
      : heads(heads_), reduction(reduction_) {
    check(dim % heads == 0, "pvt: dim ", dim, " is not divisible by ", heads, " heads");
    q = register_module("q", std::make_shared<Linear>(dim, dim, true, gen));
    kv = register_module("kv", std::make_shared<Linear>(dim, 2 * dim, true, gen));
    proj = register_module("proj", std::make_shared<Linear>(dim, dim, true, gen));
    if (reduction > 1) {
      sr = register_module("sr", conv(dim, dim, reduction, reduction, 0, 1, gen));
      norm = register_module("norm", std::make_shared<LayerNorm>(dim, 1e-5f));
    }
  }
  // tokens (B, H·W, dim) of an H×W map → residual + the attention's output.
  Tensor forward(const Tensor& tokens, int64_t H, int64_t W, const Tensor& residual) const {
    check(H >= reduction && W >= reduction, "pvt: a ", H, "×", W, " map is smaller than its attention's reduction ",
          reduction, "×", reduction, " (PVT-v2 reads images of at least 32×32 pixels)");
    const Tensor sources = sr ? norm->forward(reduced_tokens(tokens, H, W)) : tokens;
    return proj->forward(packed_kv_attention(q->forward(tokens), kv->forward(sources), heads), residual);
  }

private:
  // The tokens of the map shrunk by sr, whose kernel equals its stride: on the tokens'
  // channels-last values one product over their patches (ops/patch_conv.h), with no copy to
  // channels first and back.
  Tensor reduced_tokens(const Tensor& tokens, int64_t H, int64_t W) const {
    const int64_t B = tokens.size(0), C = tokens.size(2);
    const Tensor reduced = patch_conv2d_channels_last(reshape(tokens, {B, H, W, C}), sr->weight, sr->bias);
    return reshape(reduced, {B, reduced.size(1) * reduced.size(2), reduced.size(3)});
  }

  int64_t heads, reduction;
  std::shared_ptr<Linear> q, kv, proj;
  std::shared_ptr<Conv2d> sr;  // null when the stage attends to every token
  std::shared_ptr<LayerNorm> norm;
};

// fc1, a depth-wise 3×3 convolution on the hidden tokens laid on their map, GELU, fc2.
class DepthwiseConvMlp : public Module {
public:
  DepthwiseConvMlp(int64_t dim, int64_t hidden, Generator& gen) {
    fc1 = register_module("fc1", std::make_shared<Linear>(dim, hidden, true, gen));
    dwconv = register_module("dwconv", conv(hidden, hidden, 3, 1, 1, hidden, gen));
    fc2 = register_module("fc2", std::make_shared<Linear>(hidden, dim, true, gen));
  }
  // The convolution reads the hidden tokens as their map in place (channels last), as
  // timm's dwconv reads them after a transpose to (B, C, H, W).
  //
  // It runs on a few images at a time: the hidden layer is eight times the tokens' width,
  // and a whole batch's (8 images of 56×56×512 in the first stage of b1 at 224 pixels, 51
  // MiB) is larger than the blocks the allocator keeps for reuse (engine/tensor.cpp), so
  // each of its intermediates, and in a training step each of their cotangents, would be
  // mapped, page-faulted and unmapped again every call. Recording a graph, a call takes as
  // many images as keep a hidden intermediate within kHiddenBytes (backward keeps them all
  // anyway); at inference one image, whose intermediates stay warmer in cache from op to
  // op. The results are the images' own either way.
  Tensor forward(const Tensor& tokens, int64_t H, int64_t W, const Tensor& residual) const {
    const int64_t B = tokens.size(0), image_bytes = H * W * hidden_width() * int64_t(sizeof(float));
    const int64_t per_call = grad_enabled() ? std::max<int64_t>(1, kHiddenBytes / std::max<int64_t>(image_bytes, 1)) : 1;
    if (B <= per_call) return forward_images(tokens, H, W, residual);
    std::vector<Tensor> parts;
    for (int64_t b = 0; b < B; b += per_call) {
      const int64_t end = std::min(B, b + per_call);
      parts.push_back(forward_images(slice(tokens, 0, b, end), H, W, slice(residual, 0, b, end)));
    }
    return concat(parts, 0);
  }

private:
  // fc1's bias is added by the convolution as it reads the hidden tokens, and GELU applied
  // as it writes them: one op (ops/depthwise_conv.h), so that neither fc1's bias nor GELU
  // makes a pass over the hidden layer of its own, forward or backward.
  Tensor forward_images(const Tensor& tokens, int64_t H, int64_t W, const Tensor& residual) const {
    const Tensor hidden = linear(tokens, fc1->weight);
    const int64_t B = hidden.size(0), C = hidden.size(2);
    const Tensor mixed = depthwise_conv2d_channels_last(reshape(hidden, {B, H, W, C}), dwconv->weight, dwconv->bias,
                                                        Activation::Gelu, fc1->bias);
    return fc2->forward(reshape(mixed, {B, H * W, C}), residual);
  }

  int64_t hidden_width() const { return dwconv->weight.size(0); }

  // Below the largest block that glibc serves from its heap (32 MiB, the mmap threshold
  // engine/tensor.cpp sets), with room for the allocator's own headers.
  static constexpr int64_t kHiddenBytes = 28 << 20;

  std::shared_ptr<Linear> fc1, fc2;
  std::shared_ptr<Conv2d> dwconv;
};

class PvtBlock : public Module {
public:
  PvtBlock(int64_t dim, int64_t heads, int64_t reduction, int64_t mlp_ratio, Generator& gen) {
    norm1 = register_module("norm1", std::make_shared<LayerNorm>(dim, 1e-6f));
    attn = register_module("attn", std::make_shared<SpatialReductionAttention>(dim, heads, reduction, gen));
    norm2 = register_module("norm2", std::make_shared<LayerNorm>(dim, 1e-6f));
    mlp = register_module("mlp", std::make_shared<DepthwiseConvMlp>(dim, dim * mlp_ratio, gen));
  }
  // The residual sums are made by attn.proj and mlp.fc2, which accumulate onto their input.
  Tensor forward(const Tensor& tokens, int64_t H, int64_t W) const {
    const Tensor h = attn->forward(norm1->forward(tokens), H, W, tokens);
    return mlp->forward(norm2->forward(h), H, W, h);
  }

private:
  std::shared_ptr<LayerNorm> norm1, norm2;
  std::shared_ptr<SpatialReductionAttention> attn;
  std::shared_ptr<DepthwiseConvMlp> mlp;
};

class Pvt : public Model {
public:
  PolynomialView polynomial_view(int64_t) const override {
    throw Error(cat(config().arch, ": patch_embed.norm is a LayerNorm (and the blocks' attention softmax, their MLP a "
                    "GELU), which is not polynomial; tensor similarity compares bilinear models"));
  }
  Pvt(const ModelConfig& config, const std::vector<int64_t>& dims, const std::vector<int64_t>& depths,
      const std::vector<int64_t>& mlp_ratios, Generator& gen)
      : Model(config) {
    auto patch_embed = register_module("patch_embed", std::make_shared<OverlapPatchEmbed>(config.in_channels, dims[0], 7, 4, gen));
    add_block("patch_embed", [patch_embed](const Tensor& x) { return patch_embed->forward(x); });
    auto stages = register_module("stages", std::make_shared<Module>());
    std::string last_block;
    for (size_t i = 0; i < dims.size(); ++i) {
      auto stage = stages->register_module(std::to_string(i), std::make_shared<Module>());
      const std::string prefix = cat("stages.", i, ".");
      if (i > 0) {
        auto downsample = stage->register_module("downsample", std::make_shared<OverlapPatchEmbed>(dims[i - 1], dims[i], 3, 2, gen));
        add_block(prefix + "downsample", [downsample](const Tensor& x) { return downsample->forward(x); });
      }
      auto blocks = stage->register_module("blocks", std::make_shared<Module>());
      std::vector<std::shared_ptr<PvtBlock>> stage_blocks;
      for (int64_t j = 0; j < depths[i]; ++j)
        stage_blocks.push_back(blocks->register_module(
            std::to_string(j), std::make_shared<PvtBlock>(dims[i], kHeads[i], kReduction[i], mlp_ratios[i], gen)));
      auto norm = stage->register_module("norm", std::make_shared<LayerNorm>(dims[i], 1e-6f));
      for (int64_t j = 0; j < depths[i]; ++j) {
        const std::shared_ptr<LayerNorm> stage_norm = j + 1 == depths[i] ? norm : nullptr;
        add_block(last_block = cat(prefix, "blocks.", j), [block = stage_blocks[j], stage_norm](const Tensor& map) {
          check(map.dim() == 4, "pvt: a block expects feature maps (B, C, H, W), got ", map.shape());
          const int64_t H = map.size(2), W = map.size(3);
          Tensor tokens = block->forward(map_tokens(map), H, W);
          if (stage_norm) tokens = stage_norm->forward(tokens);
          return tokens_map(tokens, H, W);
        });
      }
    }
    auto head = register_module("head", std::make_shared<Linear>(dims.back(), config.num_classes, true, gen));
    add_block("head", [head](const Tensor& map) { return head->forward(mean(map, {2, 3})); });
    // Grad-CAM reads the last stage's output map, normalised, before the head's average.
    set_facts({.gradcam_block = last_block, .has_dropout = false, .default_optimizer = "adamw"});
  }
};

}  // namespace

std::shared_ptr<Model> make_pvt(const ModelConfig& config, Generator& gen) {
  const PvtSizes* sizes = nullptr;
  std::string names;
  for (const PvtSizes& v : variants()) {
    if (config.arch == v.name) sizes = &v;
    names += (names.empty() ? "" : ", ") + std::string(v.name);
  }
  if (!sizes) throw UsageError(cat("unknown PVT-v2 '", config.arch, "' (", names, ")"));
  if (!(config.width > 0 && std::isfinite(config.width)))
    throw UsageError(cat(config.arch, ": width multiplier must be positive, got ", config.width));
  if (config.depth < 0) throw UsageError(cat(config.arch, ": depth must be 0 (the variant's) or positive, got ", config.depth));
  if (config.dim != 0 || config.heads != 0)
    throw UsageError(cat(config.arch, ": dim and heads are fixed per stage (1, 2, 5, 8 heads); --width scales each ",
                         "head's width, --depth sets every stage's block count"));
  std::vector<int64_t> dims, depths = sizes->depths;
  for (size_t i = 0; i < sizes->dims.size(); ++i) {
    const int64_t head_width = std::max<int64_t>(1, std::lround(double(sizes->dims[i] / kHeads[i]) * config.width));
    dims.push_back(kHeads[i] * head_width);
    if (config.depth > 0) depths[i] = config.depth;
  }
  return std::make_shared<Pvt>(config, dims, depths, sizes->mlp_ratios, gen);
}

}  // namespace adjoint
