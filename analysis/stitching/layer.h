// The stitch (docs/methods.md §2.1): an affine map S_θ from the front model's features after
// its block i to the end model's features after its block j, the only thing that trains
// when two frozen models are stitched.
//
//   feature maps  (N, C, H, W) → (N, C', H', W'): a 1×1 convolution. Where the spatial
//                 sizes differ, each axis is first resized on its own: an axis that shrinks
//                 takes area averages (the windows of adaptive average pooling), an axis that
//                 grows is interpolated linearly (bilinear, align_corners = False, PyTorch's
//                 F.interpolate convention). Both are fixed linear maps whose rows sum to
//                 one, so the resize commutes with the 1×1 convolution and its bias.
//   tokens        (N, T, D) → (N, T', D'): the same linear map applied to every token. Where
//                 the counts differ, both must be ViT sequences (below): the class token
//                 stays the class token and the patch grid g×g is resized to g'×g' first.
//   maps → tokens (N, C, H, W) → (N, 1 + g², D), between a CNN and a ViT. The ViT's
//                 sequence is its class token at position 0, then a g×g grid of patch
//                 tokens in row-major order (models/vit.cpp). The map is resized to g×g by
//                 the rule above, its positions become the patch tokens in that order, and
//                 the per-token linear map C → D is applied; the class token is then the
//                 mean of the stitched patch tokens (the map has nothing that corresponds
//                 to it, and the mean is what a pooled global summary of the map would be).
//   tokens → maps (N, 1 + g², D) → (N, C, H, W): the front's class token is dropped (a
//                 feature map has no place for it), the patch tokens are laid back on their
//                 g×g grid, resized to H×W and mapped by the 1×1 convolution D → C.
// Either way the whole stitch is still one affine map of the front features, so identity,
// least squares and random initialisation work through the adapter, and every transport
// of it is the same linear map. Token sequences of different lengths that are not both
// 1 + g², flat features (logits, MLP activations) and anything else are refused with a
// one-line error that names the models, the blocks and the shapes.
//
// Initialisation: identity (equal channel counts), least squares on paired features
// (normal equations in double precision, optional ridge), or random. Least squares fits
// the positions the affine map produces: into tokens, the patch tokens only (the class
// token follows from them).
#pragma once
#include <cstdint>
#include <string>

#include "engine/module.h"
#include "engine/random.h"
#include "engine/tensor.h"

namespace adjoint {

// The features a stitch joins, one example each (no batch axis): (C, H, W) or (T, D).
// `where` names the models and blocks for error messages ("front a.ckpt block 2 'layer1.1'
// → end b.ckpt block 2 'layer1.1'").
struct StitchShapes {
  Shape front, end;
  std::string where;
};

class Stitch : public Module {
public:
  // Throws Error naming shapes.where and both shapes when no affine map joins them.
  explicit Stitch(StitchShapes shapes);
  const StitchShapes& shapes() const { return shapes_; }
  bool maps() const { return shapes_.front.size() == 3; }  // front features are maps (else tokens)
  int64_t in_features() const { return weight.size(1); }
  int64_t out_features() const { return weight.size(0); }

  // (N, *front) → (N, *end).
  Tensor forward(const Tensor& front_features) const;

  // W = I, b = 0. Throws unless the channel (or token width) counts agree.
  void init_identity();
  // W ~ U(−1/√in, 1/√in) (torch's default for a 1×1 convolution), b = 0.
  void init_random(Generator& gen);
  // The affine map that best predicts `end` (N, *end) from `front` (N, *front) in the
  // least-squares sense over all examples and positions, with ridge λ = ridge ·
  // trace(XᵀX)/in on the weights (never on the bias), X the front features on the end's
  // positions (align_to_end).
  // Throws when the normal equations are singular (then a ridge > 0 helps).
  void init_least_squares(const Tensor& front, const Tensor& end, double ridge = 0.0);

  Tensor weight;  // (out, in)
  Tensor bias;    // (out)

private:
  StitchShapes shapes_;
};

// The stitch as a function of its parameters: h (N, C, H, W) or (N, T, D) brought onto the
// end's positions (align_to_end), mapped by the 1×1 convolution or per-token linear map
// (weight (out, in)), and, into tokens from maps, given its class token.
Tensor apply_stitch(const Tensor& h, const Tensor& weight, const Tensor& bias, const Shape& end_example_shape);

// The front features on the end's positions, before the affine map: maps resized to the
// end's H×W (N, C, H, W); into tokens, (N, T', in) with T' the end's patch tokens (maps
// resized to the token grid and flattened row-major) or all its tokens (from tokens, the
// patch grid resized where the counts differ). From tokens into maps, the front's class
// token dropped and its grid resized to H×W.
Tensor align_to_end(const Tensor& h, const Shape& end_example_shape);

// The side g of a ViT sequence of 1 + g² tokens (class token first); 0 when `tokens` has
// no such form.
int64_t token_grid_side(int64_t tokens);

// Resizes feature maps (N, C, H, W) to (N, C, height, width) by the rule above: area
// averages on an axis that shrinks, linear interpolation on one that grows. Recorded
// (two matrix products), so gradients flow through it.
Tensor resize_maps(const Tensor& maps, int64_t height, int64_t width);

// The (out × in) matrix of that rule along one axis.
Tensor resize_matrix(int64_t in, int64_t out);

}  // namespace adjoint
