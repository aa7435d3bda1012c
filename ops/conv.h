// 2-D convolution (cross-correlation, as torch.nn.functional.conv2d), by one of three
// algorithms chosen per layer from its shape (the forward pass and the input gradient each
// choose; the weight gradient runs through GEMMs, in F(4×4)'s transform domain where that
// runs the layer on a batch of 256 tiles or more, else in F(2×2)'s or by im2col):
//
// - Direct, on CPUs with AVX-512 (ops/conv/direct.h): narrow layers (up to 32 channels) on
//   maps 12 to 32 wide, small maps (up to 8 wide, up to 128 input channels) and strided
//   3×3 layers, where the GEMM algorithms move more memory than they compute.
// - Winograd F(2×2, 3×3) for other 3×3 kernels at stride 1 (no dilation, no groups, 16
//   channels or more; with more than 128 × 128 channels, at least 128 tiles per call, since
//   outside eval mode the weights' transform is redone every call): 16 GEMMs in a transform
//   domain, 2.25× fewer multiplications than direct convolution. On AVX-512 its transforms run 16 tiles
//   at a time (ops/conv/winograd_avx512.h) and the weights' transform writes the GEMM kernel's
//   packed layout directly. On maps of 14 and more rows and columns, F(4×4, 3×3) instead
//   (ops/conv/winograd_f4.h): 36 GEMMs over 4×4 tiles, 4× fewer multiplications, at about
//   ten times F(2×2)'s rounding error (1e-5 of the outputs' RMS); its input gradient is the
//   same forward pass on the transposed, flipped weights, its weight gradient the adjoint
//   transforms around 36 GEMMs (ops/conv/winograd_f4_weight_grad.h).
// - im2col + GEMM for everything else, with a 1×1 stride-1 path that reads the input in
//   place.
//
// The GEMMs run the widest kernels the CPU has (GemmKernel::widest in engine/gemm.h: the
// engine's own on AVX-512, else OpenBLAS's), as oneDNN's convolutions do in PyTorch. Small
// images are folded into one GEMM (columns = images · output positions), since a deep
// layer's per-image product (e.g. 512 × 16 × 4608) is too narrow for the GEMM's full
// rate; large images are cut into bands of output rows so that each GEMM's operand stays
// in cache. Convolution is affine in its input, so all three transports share one rule.
// ops/conv.cpp holds the op and its choice; ops/conv/ holds the algorithms, each beside the
// constants that tune it. Results are bitwise the same at any thread count; between a CPU
// with AVX-512 and one without they differ by rounding (other algorithms and kernels).
#pragma once
#include <cstdint>

#include "engine/tensor.h"

namespace adjoint {

struct Conv2dOptions {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;

  // The same stride, padding and dilation on both axes: Conv2dOptions::square(2, 1).
  static Conv2dOptions square(int64_t stride, int64_t padding = 0, int64_t dilation = 1, int64_t groups = 1) {
    return {stride, stride, padding, padding, dilation, dilation, groups};
  }
  Conv2dOptions& with_stride(int64_t s) { stride_h = stride_w = s; return *this; }
  Conv2dOptions& with_padding(int64_t p) { pad_h = pad_w = p; return *this; }
  Conv2dOptions& with_dilation(int64_t d) { dilation_h = dilation_w = d; return *this; }
  Conv2dOptions& with_groups(int64_t g) { groups = g; return *this; }
};

// Output extent along one axis: floor((in + 2·pad − dilation·(kernel − 1) − 1) / stride) + 1.
int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation);

// x (N, C, H, W), weight (O, C/groups, kh, kw), bias (O) or undefined → (N, O, OH, OW).
// Backward skips the input gradient when the input needs none (a network's first layer)
// and the weight gradient when the weight needs none (explanations).
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = {}, const Conv2dOptions& options = {});

// conv2d(x, weight, bias, options) + residual (of the output's shape; none when undefined),
// the residual added as each output is written where the algorithm finishes its rows in
// place (im2col, direct): the separate ops' bits and one pass over the output less.
Tensor conv2d_add(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& options,
                  const Tensor& residual);

// The algorithms of conv2d (ops/conv/), and the one that runs this convolution here, forward
// or for its input gradient (after dead taps are cut; on this CPU and vector cap): for the
// tests, which check each against the reference (ops/reference/), and for benchmarks.
enum class ConvAlgorithm { Im2col, Winograd, WinogradF4, Direct };
const char* to_string(ConvAlgorithm algorithm);
ConvAlgorithm conv2d_algorithm(const Tensor& x, const Tensor& weight, const Conv2dOptions& options = {},
                               bool input_gradient = false);

// An eval-mode BatchNorm's parameters (ops/norm.h), for the fused op below.
struct EvalBatchNorm {
  Tensor weight, bias, running_mean, running_var;  // weight and bias may be undefined
  float eps = 1e-5f;
};

// relu(batch_norm(conv2d(x, weight, bias, options), eval mode) + residual), the residual only
// when defined (of the output's shape: a residual block's shortcut), the ReLU only when
// `then_relu`. When nothing is recorded (inference), the convolution applies BatchNorm's
// per-channel affine map, the residual and the ReLU to each output as it writes it: one
// pass over the output instead of three and one tensor instead of three, with bitwise the
// same values. When a graph is recorded, BatchNorm folds into the weights instead
// (fold_eval_batch_norm, ops/norm.h). Either way what is prepared from the weights (the fold,
// Winograd's transforms, the kernels' packings, forward and for the input gradient) is kept
// with them and made again only when their values change (ops/conv/prepared_weights.h).
Tensor conv2d_batch_norm_eval(const Tensor& x, const Tensor& weight, const Tensor& bias, const Conv2dOptions& options,
                              const EvalBatchNorm& bn, bool then_relu, const Tensor& residual = Tensor());

}  // namespace adjoint
