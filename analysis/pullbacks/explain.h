// Explanation methods (docs/methods.md §1.3): attributions of a classifier's target logit to
// its input, each one a transport of the engine run backwards from the logits.
//
//   soft_pullback          one backward of the target logit (u = e_c on the logits, not
//                          a loss) under SoftPullback; the raw input cotangent
//   pullback               the same under Pullback (gates and routing frozen, hard)
//   pullback_ascent        x_{t+1} = x_t + α·ν̃(x_t)/‖ν̃(x_t)‖₂, K steps under
//                          SoftPullback; attribution x_K − x_0 (x_K: a counterfactual)
//   gradient_ascent        the same loop under Gradient
//   gradient               saliency, signed: ∂f_c/∂x
//   input_x_gradient       x ⊙ ∂f_c/∂x
//   smoothgrad             mean of ∂f_c/∂x at x + N(0, σ²) over n samples
//   integrated_gradients   (x − x0) ⊙ ∫₀¹ ∂f_c(x0 + a(x − x0)) da by a quadrature rule
//   guided_backprop        one backward under the Guided transport
//   gradcam                ReLU(Σ_k w_k A_k), w_k = spatial mean of ∂f_c/∂A_k at a block's
//                          output, bilinearly upsampled and repeated over input channels
//   guided_gradcam         guided_backprop ⊙ gradcam
//   deeplift               DeepLift rescale: (x − x0) ⊙ the DeepLift transport's cotangent
//
// Every method batches: all N examples go through one backward with one-hot rows as the
// cotangent; SmoothGrad and IG put several samples of every example in one batch. Only
// the input's cotangent is computed, and the passes that take it alone are recorded for the
// input alone (the parameters are constants there, so no op keeps what only a parameter's
// gradient reads). The model
// must be in eval mode (model.train(false)); the methods check it.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "analysis/common/attribution.h"
#include "engine/tensor.h"
#include "engine/transport.h"
#include "models/model.h"

namespace adjoint {

struct ExplainOptions {
  // Soft-pullback temperatures per layer kind (defaults: the published ones, §1.2).
  Temperatures temperatures;

  // Pullback / gradient ascent.
  int64_t ascent_steps = 5;   // K
  float ascent_alpha = 0.0f;  // step length; ≤ 0: 20·sqrt(D/150528)·(range.width()/2),
                              // D = C·H·W, the published per-pixel step on any input size
  bool ascent_clip = false;   // clip every x_t to `range`

  // The range the inputs live in: the ascent's default step, SmoothGrad's σ and the
  // ascent's clipping are stated relative to it.
  InputRange range;

  // SmoothGrad: n noisy samples with σ = smoothgrad_sigma · range.width(). The noise of
  // sample s is the s-th draw, of x's shape, from Generator(seed).
  int64_t smoothgrad_samples = 50;
  float smoothgrad_sigma = 0.15f;

  // Integrated gradients: `ig_steps` gradient evaluations on the path from the baseline,
  // combined by "trapezoid" (Captum's riemann_trapezoid: n equally spaced points 0..1,
  // end weights halved) or "gauss-legendre" (n Gauss–Legendre nodes on [0, 1]).
  int64_t ig_steps = 50;
  std::string ig_rule = "trapezoid";

  // Baseline x0 of integrated gradients and DeepLift: undefined means zeros; otherwise a
  // tensor of x's shape or of one example's shape (broadcast over the batch).
  Tensor baseline;

  // Grad-CAM's block (a name from model.blocks()); empty: default_gradcam_block(model, x's shape).
  std::string gradcam_block;

  // Rows (examples × samples) per forward pass in SmoothGrad and IG: samples are added to
  // a pass while it stays within this many rows (at least one sample per pass). Lower it
  // for large models, whose recorded forward state grows with the rows. The methods of one
  // transport (gradient, soft_pullback, pullback, guided_backprop, input_x_gradient and
  // guided Grad-CAM's guided part) split a larger batch into passes of this many examples.
  int64_t max_batch = 64;
  // And input elements per pass (rows × one example's elements): at ImageNet's size a deep
  // network's recorded state per row is large, so 64 rows would hold many gigabytes. The
  // default lets 8 images of 3×224×224 share a pass and leaves small images to max_batch.
  // The results are the same in any passes; only the memory and its page faults differ.
  int64_t max_pass_elements = 8 * 3 * 224 * 224;
  // The same budget for the passes of SmoothGrad's noisy copies and IG's path points. By
  // default it equals max_pass_elements, so that a pass of samples holds no more recorded
  // state than one gradient of the batch: the explanation's peak memory is that of a single
  // gradient whatever the count of samples. Raising it puts more samples in a pass, which
  // shares a pass's fixed work (weight transforms and packings, the narrowest layers'
  // products on few rows) among more rows at the cost of their recorded state.
  int64_t max_sample_pass_elements = 8 * 3 * 224 * 224;

  uint64_t seed = 0;
};

// Rows of the batch x that one forward pass holds (ExplainOptions::max_batch and
// max_pass_elements; at least one).
int64_t rows_per_pass(const ExplainOptions& options, const Tensor& x);
// The same for SmoothGrad's and IG's passes (max_batch and max_sample_pass_elements).
int64_t sample_rows_per_pass(const ExplainOptions& options, const Tensor& x);

// The method names explain() and make_explainer() accept, in the order listed above.
std::vector<std::string> explanation_methods();

// Attributions of x's shape for one target class per example. Throws UsageError for an
// unknown method and Error for a model in training mode or targets out of range.
Tensor explain(const std::string& method, const Model& model, const Tensor& x, const std::vector<int64_t>& targets,
               const ExplainOptions& options = {});

// Whether `method` is one transport of the input (gradient, soft_pullback, pullback,
// guided_backprop): one forward pass whose logits also give the predicted classes.
bool explains_in_one_pass(const std::string& method);
// A method of explains_in_one_pass for the model's predicted classes, read off the logits of
// the method's own forward pass (the classes predicted_classes gives) and returned in
// `predicted`: no separate forward pass finds them first.
Tensor explain_predicted(const std::string& method, const Model& model, const Tensor& x,
                         std::vector<int64_t>& predicted, const ExplainOptions& options = {});

// The same as an Explainer (analysis/common/attribution.h). It keeps a reference to `model`,
// which must outlive it; the method name is checked here, once.
Explainer make_explainer(const std::string& method, const Model& model, const ExplainOptions& options = {});

// The arg-max class of each example ("predicted" targets), from one forward pass.
std::vector<int64_t> predicted_classes(const Model& model, const Tensor& x);

// Pullback ascent (soft = true) or gradient ascent (soft = false): the attribution
// x_K − x_0 and the counterfactual x_K, from one run.
struct AscentResult {
  Tensor attribution;
  Tensor counterfactual;
};
AscentResult ascent(const Model& model, const Tensor& x, const std::vector<int64_t>& targets,
                    const ExplainOptions& options, bool soft);
// The default step length for inputs of x's shape (see ExplainOptions::ascent_alpha).
float default_ascent_alpha(const Tensor& x, const InputRange& range);

// Grad-CAM's default block for inputs of `input` shape (N, C, H, W). For CNNs the last one
// before the head whose output is larger than 1×1 (ResNet "layer4.<last>" on 32×32; a
// small VGG on 28×28 pools its last stage to 1×1, where the map would be uniform, so an
// earlier "features.<i>"). For ViTs the output of the second-to-last "blocks.<i>"
// ("patch_embed" for depth 1): the head reads the class token alone after a per-token
// LayerNorm, so the gradient at the patch tokens of the last block's output is exactly
// zero; pytorch-grad-cam uses blocks[-1].norm1 for the same reason, whose input this is.
std::string default_gradcam_block(const Model& model, const Shape& input);

// The Grad-CAM map at a block, before upsampling: (N, h, w). A block output of shape
// (N, C, h, w) is a channel stack; (N, 1 + h·w, D) is a ViT token sequence whose class
// token is dropped and whose patch tokens form the h×w grid (h/w = H/W of the input),
// with the D embedding dimensions as channels.
Tensor gradcam_map(const Model& model, const Tensor& x, const std::vector<int64_t>& targets, const std::string& block);

// Bilinear resampling of maps (N, h, w) to (N, H, W) with align_corners = False
// (PyTorch's F.interpolate(mode="bilinear") convention).
Tensor bilinear_resize(const Tensor& maps, int64_t H, int64_t W);

// A quadrature rule on [0, 1]: ∫₀¹ g ≈ Σ_k weights[k]·g(nodes[k]).
struct Quadrature {
  std::vector<double> nodes, weights;
};
// "trapezoid" (n ≥ 2 points) or "gauss-legendre" (n ≥ 1 nodes, exact for polynomials of
// degree 2n − 1; nodes by Newton's method on the Legendre polynomial P_n).
Quadrature quadrature(const std::string& rule, int64_t n);

}  // namespace adjoint
