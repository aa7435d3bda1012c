#include "tools/model_options.h"

#include <cmath>

#include "analysis/stitching/stitched_model.h"
#include "engine/error.h"

namespace adjoint {

const std::vector<cli::OptionSpec>& model_options() {
  static const std::vector<cli::OptionSpec> options = {
      {"model", "NAME", "resnet18|34|50, vgg11|13|16|19[_bn], vit_tiny|small|base|custom, vit_b_16|b_32|l_16, pvt_v2_b0..b5, bilinear_mlp, "
       "bilinear_lm",
       ""},
      {"width", "X", "channel multiplier (ResNet, VGG)", "1"},
      {"imagenet-stem", "", "ResNet: 7x7 stride-2 stem + max-pool; VGG: ImageNet classifier", ""},
      {"patch", "N", "ViT patch size", "4"},
      {"pool", "KIND", "ViT head: token (class token) or avg (mean of patch tokens, timm's global_pool='avg')",
       "token"},
      {"dim", "N", "ViT / bilinear LM width, bilinear MLP embedding width (0: the model's default / none)", "0"},
      {"depth", "N", "ViT / bilinear LM blocks; bilinear MLP residual blocks (0: the model's default)", "0"},
      {"heads", "N", "attention heads (0: the model's default)", "0"},
      {"hidden", "N", "bilinear MLP hidden width", "256"},
      {"attention", "KIND", "bilinear LM attention: softmax or bilinear", "softmax"},
      {"mlp-ratio", "N", "ViT / bilinear LM MLP hidden width as a multiple of the width", "4"},
      {"residual-scale", "X", "bilinear LM and deep bilinear MLP: x + X·block(x)", "1"},
  };
  return options;
}

std::vector<cli::OptionSpec> with_model_options(std::vector<cli::OptionSpec> own) {
  own.insert(own.begin(), model_options().begin(), model_options().end());
  return own;
}

std::vector<cli::OptionSpec> with_model_source_options(std::vector<cli::OptionSpec> own) {
  static const std::vector<cli::OptionSpec> source = {
      {"checkpoint", "FILE", "a checkpoint written by adjoint train", ""},
      {"stitch", "FILE", "a stitch written by adjoint stitch: its front and end checkpoints (relative paths: to the "
                         "stitch file's folder; their content must be the checkpoints it was trained with) joined by it", ""},
      {"weights", "FILE", "a state dict for --model: safetensors, or a torch.save file (read without running it)", ""},
      {"weights-key", "KEY", "--weights: the entry of a saved dict that holds the state dict (e.g. model)", ""},
      {"classes", "N", "classes of --model", "1000"},
      {"in-channels", "N", "input channels of --model", "3"},
      {"image-size", "N", "input size of --model", "224"},
      {"mean", "LIST", "per-channel normalisation mean for images", ""},
      {"std", "LIST", "per-channel normalisation std for images", ""},
      {"preset", "NAME", "image files through a pretrained model's evaluation transform and statistics (resnet50_v1, "
                         "resnet50_v2, vgg11_bn_v1, vit_b_16_v1, pvt_v2, ...; docs/methods.md §1.6)", ""},
  };
  own.insert(own.begin(), source.begin(), source.end());
  return with_model_options(std::move(own));
}

ModelConfig model_config(const cli::Args& a) {
  ModelConfig c;
  c.arch = a.text("model");
  c.width = a.number("width");
  c.small_stem = !a.flag("imagenet-stem");
  c.patch = a.integer("patch");
  c.pool = a.text("pool");
  c.dim = a.integer("dim");
  c.depth = a.integer("depth");
  c.heads = a.integer("heads");
  c.hidden = a.integer("hidden");
  c.attention = a.text("attention");
  c.mlp_ratio = a.integer("mlp-ratio");
  c.residual_scale = a.number("residual-scale");
  if (c.mlp_ratio < 1) throw UsageError(cat("--mlp-ratio must be at least 1, got ", c.mlp_ratio));
  if (!std::isfinite(c.residual_scale)) throw UsageError(cat("--residual-scale must be a finite number, got ", c.residual_scale));
  return c;
}

LoadedModel load_model(const cli::Args& a) {
  LoadedModel m;
  if (a.has("stitch")) {
    if (a.has("checkpoint") || a.has("weights"))
      throw UsageError("give either --stitch or --checkpoint or --model with --weights, one of them");
    m = load_stitched_model(a.text("stitch"));
  } else if (a.has("checkpoint")) {
    if (a.has("weights")) throw UsageError("give either --checkpoint or --model with --weights, not both");
    m = load_checkpoint_model(a.text("checkpoint"));
  } else {
    if (!a.has("model") || !a.has("weights")) throw UsageError("give --checkpoint FILE, or --model NAME with --weights FILE");
    ModelConfig c = model_config(a);
    c.num_classes = a.integer("classes");
    c.in_channels = a.integer("in-channels");
    c.image_size = a.integer("image-size");
    m = load_weights_model(c, a.text("weights"), a.has("weights-key") ? a.text("weights-key") : "");
  }
  if (a.has("preset")) {  // image files through a pretrained model's evaluation transform
    try {
      m.preset = &eval_preset(a.text("preset"));
    } catch (const UsageError& e) {
      throw UsageError(cat("option --preset: ", e.what()));
    }
    m.mean.assign(m.preset->mean.begin(), m.preset->mean.end());
    m.std.assign(m.preset->std.begin(), m.preset->std.end());
    const ModelConfig& c = m.model->config();
    if (c.in_channels != 3 || c.image_size != m.preset->crop)
      throw UsageError(cat("option --preset ", m.preset->name, ": its ", m.preset->crop, "x", m.preset->crop,
                           " RGB crop does not fit ", c.arch, "'s ", c.in_channels, "x", c.image_size, "x",
                           c.image_size, " input"));
  }
  if (a.has("mean")) m.mean = parse_floats(a.text("mean"), "mean");
  if (a.has("std")) m.std = parse_floats(a.text("std"), "std");
  const std::string problem = normalisation_problem(m, "--mean", "--std");
  if (!problem.empty()) throw UsageError(cat("option ", problem));
  m.model->train(false);
  return m;
}

}  // namespace adjoint
