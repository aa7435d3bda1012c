// im2col + GEMM: the convolution as matrix products. A tile's column matrix holds, in
// row (c, i, j) and column (image, output position), the input value that tap (i, j) of
// channel c meets there; the output is weight (O × C·kh·kw) times columns, one GEMM per
// group. Small images are folded into one GEMM (columns = images · output positions),
// since a deep layer's per-image product is too narrow to run at the GEMM's full rate;
// large images are cut into bands of output rows so that each GEMM's operand stays in
// cache. A 1×1 stride-1 convolution reads its input in place, as its own column matrix.
// The backward pass runs the same tiles: dW = Σ dY·colsᵀ, dx = col2im(Wᵀ·dY).
#pragma once
#include "ops/conv/geometry.h"
#include "ops/conv/prepared_weights.h"

namespace adjoint::conv {

// y = epilogue(conv(x, w)): image blocks in parallel; per block, per tile, one GEMM per group.
// The packed weights are kept by `kept` where it keeps forms (ops/conv/prepared_weights.h),
// here and in conv_backward.
void conv_forward(const ConvGeometry& g, const float* x, const float* w, const Epilogue& epilogue, float* y,
                  const PreparedWeights& kept = {});

// Whether conv_backward writes every entry of dx: 1×1 kernels without padding or dilation
// (at any stride), where each input position is read by at most one output position, so
// that col2im writes it rather than adds onto it. Otherwise dx must arrive zeroed.
bool col2im_writes_every_entry(const ConvGeometry& g);

// dx = col2im(Wᵀ·dY), dw = Σ_tiles dY·colsᵀ and db = Σ_tiles Σ_columns dY, each skipped when
// its pointer is null; dx arrives zeroed (col2im adds) unless col2im_writes_every_entry.
void conv_backward(const ConvGeometry& g, const float* x, const float* w, const float* dy, float* dx, float* dw,
                   float* db, const PreparedWeights& kept = {});

}  // namespace adjoint::conv
