#include "ops/patch_conv.h"

#include "engine/error.h"
#include "ops/layout.h"
#include "ops/matmul.h"

namespace adjoint {

Tensor patch_conv2d_channels_last(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check(x.dim() == 4, "patch_conv2d_channels_last: x must be (B, H, W, C), got ", x.shape());
  const int64_t B = x.size(0), H = x.size(1), W = x.size(2), C = x.size(3);
  check(weight.dim() == 4 && weight.size(1) == C && weight.size(2) == weight.size(3) && weight.size(2) >= 1,
        "patch_conv2d_channels_last: weight must be (O, ", C, ", r, r) for x ", x.shape(), ", got ", weight.shape());
  const int64_t O = weight.size(0), r = weight.size(2), OH = H / r, OW = W / r;
  check(OH > 0 && OW > 0, "patch_conv2d_channels_last: a ", H, "×", W, " map is smaller than its ", r, "×", r,
        " patches");
  // Only whole patches: a view of the map, copied below in any case.
  const Tensor whole = H % r || W % r ? slice(slice(x, 1, 0, OH * r), 2, 0, OW * r).contiguous() : x;
  // (B, OH, r, OW, r, C) → (B, OH, OW, r, r, C): each patch's r·r·C values side by side.
  const Tensor patches =
      reshape(permute(reshape(whole, {B, OH, r, OW, r, C}), {0, 1, 3, 2, 4, 5}), {B, OH, OW, r * r * C});
  // The kernel in the patches' order: (O, C, r, r) → (O, r, r, C).
  const Tensor kernel = reshape(permute(weight, {0, 2, 3, 1}), {O, r * r * C});
  return linear(patches, kernel, bias);
}

}  // namespace adjoint
