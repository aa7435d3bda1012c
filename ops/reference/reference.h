// Reference ops: every op family of ops/ once more, as plain loops a student can read in one
// sitting, with the backward rule of every transport (engine/transport.h, docs/methods.md
// §1.2). No threads, no vectors, no tiling, no fast exponentials: each function is its
// definition, written out. The tests check the fast kernels of ops/ against these
// (tests/test_reference_ops.cpp), and these against finite differences.
//
// Conventions, as in llm.c's layer functions:
// - Values are row-major arrays of doubles (`Values`), their extents passed as integers;
//   doubles so that a reference's own rounding is far below the float kernels' tolerance.
// - `*_forward` returns the output; `*_backward` takes the forward's inputs and the
//   output's cotangent u and returns the cotangents of the inputs under a transport.
// - The transports (Transport::kind): Gradient, the exact vector-Jacobian product;
//   Pullback, the adjoint of the input-conditioned linear map (gates, statistics and
//   attention patterns held fixed); SoftPullback, the pullback with hard gates softened at
//   a temperature (Transport::tau); Guided and DeepLift, which change only the activations
//   and are the gradient everywhere else.
//
// Which file holds which family (read them in this order):
//   linear.cpp       matmul, linear
//   elementwise.cpp  exp, log, tanh, sigmoid, abs, sqrt, products
//   activation.cpp   ReLU, GELU, SiLU: the one table of gates every transport reads
//   conv2d.cpp       conv2d (any stride, padding, dilation, groups)
//   pool.cpp         max_pool2d, avg_pool2d, adaptive_avg_pool2d
//   reduce.cpp       mean, var, max over an axis
//   norm.cpp         BatchNorm (batch or running statistics), LayerNorm
//   softmax.cpp      softmax, log_softmax
//   attention.cpp    scaled dot-product attention
//   bilinear.cpp     the bilinear layer
//   embedding.cpp    embedding lookup
//   loss.cpp         cross-entropy, mean squared error
//   values.cpp       Values from and to the engine's tensors
//   resample.cpp     PIL's 8-bit image resize (engine/data/resample.h)
#pragma once
#include <cstdint>
#include <vector>

#include "engine/tensor.h"
#include "engine/transport.h"
#include "ops/activation.h"
#include "engine/data/resample.h"
#include "ops/conv.h"

namespace adjoint::reference {

using Values = std::vector<double>;

// A tensor's values (any layout), and back to a float tensor of `shape`.
Values values(const Tensor& t);
Tensor to_tensor(const Shape& shape, const Values& v);

// ---------------------------------------------------------------------------------------
// linear.cpp. Both maps are linear in each input: one rule for every transport.

// a (M, K) · b (K, N) → (M, N).
Values matmul_forward(const Values& a, const Values& b, int64_t M, int64_t K, int64_t N);
struct MatmulGrads {
  Values da, db;  // u bᵀ, aᵀ u
};
MatmulGrads matmul_backward(const Values& u, const Values& a, const Values& b, int64_t M, int64_t K, int64_t N);

// x (M, in) · wᵀ + bias: w (out, in), bias (out) or empty → (M, out).
Values linear_forward(const Values& x, const Values& w, const Values& bias, int64_t M, int64_t in, int64_t out);
struct LinearGrads {
  Values dx, dw, dbias;  // u w, uᵀ x, Σ_rows u
};
LinearGrads linear_backward(const Values& u, const Values& x, const Values& w, int64_t M, int64_t in, int64_t out);

// ---------------------------------------------------------------------------------------
// conv2d.cpp. Convolution is linear in x and in w: one rule for every transport.

// x (N, C, H, W), w (O, C/groups, KH, KW) under `options`.
struct ConvShape {
  int64_t N, C, H, W, O, KH, KW;
  Conv2dOptions options;
  int64_t OH() const;
  int64_t OW() const;
};
// y (N, O, OH, OW): y[n][o][oh][ow] = bias[o] + Σ_{c in o's group, i, j} w[o][c][i][j] ·
// x[n][c][oh·sh − ph + i·dh][ow·sw − pw + j·dw], zero outside x.
Values conv2d_forward(const Values& x, const Values& w, const Values& bias, const ConvShape& s);
struct ConvGrads {
  Values dx, dw, dbias;
};
ConvGrads conv2d_backward(const Values& u, const Values& x, const Values& w, const ConvShape& s);

// ---------------------------------------------------------------------------------------
// pool.cpp. Over (N, C, H, W) with a kh × kw window, stride (sh, sw), padding (ph, pw).

struct PoolShape {
  int64_t N, C, H, W, kh, kw, sh, sw, ph, pw;
  int64_t OH() const { return (H + 2 * ph - kh) / sh + 1; }
  int64_t OW() const { return (W + 2 * pw - kw) / sw + 1; }
};
// The window's maximum; padding never wins.
Values max_pool2d_forward(const Values& x, const PoolShape& s);
// Gradient, Pullback, Guided, DeepLift: u to the first maximal input of the window (in
// row-major order). SoftPullback: u spread over the window's inputs with the weights
// softmax(window/τ), τ = tau.max_pool.
Values max_pool2d_backward(const Values& u, const Values& x, const PoolShape& s, const Transport& t);
// The window's sum over the whole kernel (padding counts as zeros) / (kh·kw).
Values avg_pool2d_forward(const Values& x, const PoolShape& s);
// Linear: u/(kh·kw) to every input of the window, under every transport.
Values avg_pool2d_backward(const Values& u, const PoolShape& s);
// Adaptive average pooling of (N, C, H, W) to (N, C, OH, OW): output (oh, ow) averages rows
// [⌊oh·H/OH⌋, ⌈(oh+1)·H/OH⌉) and columns likewise. Linear: one rule for every transport.
Values adaptive_avg_pool2d_forward(const Values& x, int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH,
                                   int64_t OW);
Values adaptive_avg_pool2d_backward(const Values& u, int64_t N, int64_t C, int64_t H, int64_t W, int64_t OH,
                                    int64_t OW);

// ---------------------------------------------------------------------------------------
// activation.cpp. f(z) = z·g(z) elementwise, for the gate g of each kind.

Values activation_forward(const Values& z, Activation kind);
// The cotangent of z, per transport: f'(z)·u; g(z)·u; g_soft(z/τ)·u; f'(z)·max(u, 0); and
// DeepLift's rescale rule on the batch [x; x0] (the first half of z the inputs, the second
// their baselines).
Values activation_backward(const Values& u, const Values& z, Activation kind, const Transport& t);

// ---------------------------------------------------------------------------------------
// norm.cpp. y = γ·(x − μ)/σ + β, σ = sqrt(var + eps).

// BatchNorm over x (N, C, L): statistics per channel over N and L. With `running` the
// statistics are running_mean and running_var (eval mode), else the batch's (biased variance).
struct BatchNormShape {
  int64_t N, C, L;
  double eps = 1e-5;
};
struct Statistics {
  Values mean, var;
};
Statistics batch_norm_statistics(const Values& x, const BatchNormShape& s);
Values batch_norm_forward(const Values& x, const Values& gamma, const Values& beta, const Statistics& stats,
                          const BatchNormShape& s);
struct NormGrads {
  Values dx, dgamma, dbeta;
};
// Batch statistics under Gradient, Guided and DeepLift: differentiated. Otherwise (the
// pullbacks, or running statistics) held fixed: dx = (γ/σ)·u. dγ = Σ u·x̂ and dβ = Σ u always.
NormGrads batch_norm_backward(const Values& u, const Values& x, const Values& gamma, const Statistics& stats,
                              bool batch_statistics, const BatchNormShape& s, const Transport& t);

// BatchNorm with its tail (ops/norm.h BatchNormTail): z = BatchNorm(x) + residual (none when
// empty), then the ReLU when `relu`, else y = z.
Values batch_norm_tail_forward(const Values& x, const Values& gamma, const Values& beta, const Statistics& stats,
                               const Values& residual, bool relu, const BatchNormShape& s);
// The ReLU's rule of t at z (activation_backward), which is also the residual's cotangent,
// then batch_norm_backward of that.
struct BatchNormTailGrads {
  NormGrads norm;
  Values dresidual;
};
BatchNormTailGrads batch_norm_tail_backward(const Values& u, const Values& x, const Values& gamma, const Values& beta,
                                            const Statistics& stats, const Values& residual, bool relu,
                                            bool batch_statistics, const BatchNormShape& s, const Transport& t);

// LayerNorm over the last D features of each of M rows.
Values layer_norm_forward(const Values& x, const Values& gamma, const Values& beta, int64_t M, int64_t D,
                          double eps = 1e-5);
NormGrads layer_norm_backward(const Values& u, const Values& x, const Values& gamma, int64_t M, int64_t D,
                              const Transport& t, double eps = 1e-5);

// ---------------------------------------------------------------------------------------
// reduce.cpp. Over the last axis of `rows` rows of n values.

Values mean_forward(const Values& x, int64_t rows, int64_t n);
Values mean_backward(const Values& u, int64_t rows, int64_t n);
// The unbiased variance.
Values var_forward(const Values& x, int64_t rows, int64_t n);
Values var_backward(const Values& u, const Values& x, int64_t rows, int64_t n);
// The maximum; backward as max-pooling's: u to the first maximal element, or (soft
// pullback) spread with the weights softmax(row/τ), τ = tau.max_pool.
Values max_forward(const Values& x, int64_t rows, int64_t n);
Values max_backward(const Values& u, const Values& x, int64_t rows, int64_t n, const Transport& t);

// ---------------------------------------------------------------------------------------
// softmax.cpp.

// softmax and log_softmax of each of `rows` rows of n values; smooth, the exact VJP always.
Values softmax_forward(const Values& x, int64_t rows, int64_t n);
Values softmax_backward(const Values& u, const Values& y, int64_t rows, int64_t n);
Values log_softmax_forward(const Values& x, int64_t rows, int64_t n);
Values log_softmax_backward(const Values& u, const Values& y, int64_t rows, int64_t n);

// ---------------------------------------------------------------------------------------
// attention.cpp.

// Per head h < heads: q (T, d), k (S, d), v (S, dv); A = softmax(q kᵀ·scale/τ, causal mask
// j > i), out = A v (heads, T, dv).
struct AttentionShape {
  int64_t heads, T, S, d, dv;
  double scale;
  bool causal;
};
// The pattern A (heads, T, S) at temperature τ (τ = 1: the forward pass's).
Values attention_pattern(const Values& q, const Values& k, const AttentionShape& s, double tau = 1);
Values attention_forward(const Values& q, const Values& k, const Values& v, const AttentionShape& s);
struct AttentionGrads {
  Values dq, dk, dv;
};
// Gradient (and Guided, DeepLift): through q, k and v. Pullback: A held fixed, dv = Aᵀu,
// nothing (zeros) to q and k. SoftPullback: the same with A recomputed at τ = tau.attention.
AttentionGrads attention_backward(const Values& u, const Values& q, const Values& k, const Values& v,
                                  const AttentionShape& s, const Transport& t);
// Aᵀu per head (heads, S, dv): the value cotangent of a pattern `a` held fixed.
Values pattern_transposed_times(const Values& a, const Values& u, const AttentionShape& s);

// ---------------------------------------------------------------------------------------
// elementwise.cpp. Smooth: one rule for every transport.

// Elementwise maps with their derivative: exp, log, tanh, sigmoid, abs, square root.
enum class Unary { Exp, Log, Tanh, Sigmoid, Abs, Sqrt };
Values unary_forward(const Values& x, Unary f);
Values unary_backward(const Values& u, const Values& x, Unary f);
// a·b elementwise: (u·b, u·a).
struct ProductGrads {
  Values da, db;
};
ProductGrads mul_backward(const Values& u, const Values& a, const Values& b);

// ---------------------------------------------------------------------------------------
// bilinear.cpp. The pullbacks take half the gradient's input cotangent.

// y = (L x̃) ⊙ (R x̃), x̃ = (1, x): x (M, d), L and R (h, d+1) → (M, h).
Values bilinear_forward(const Values& x, const Values& L, const Values& R, int64_t M, int64_t d, int64_t h);
struct BilinearGrads {
  Values dx, dL, dR;
};
BilinearGrads bilinear_backward(const Values& u, const Values& x, const Values& L, const Values& R, int64_t M,
                                int64_t d, int64_t h, const Transport& t);

// ---------------------------------------------------------------------------------------
// embedding.cpp and loss.cpp. Linear or smooth: one rule for every transport.

// Rows of weight (V, D) gathered by index; backward: the cotangent rows added back.
Values embedding_forward(const Values& weight, const std::vector<int64_t>& indices, int64_t D);
Values embedding_backward(const Values& u, const std::vector<int64_t>& indices, int64_t V, int64_t D);

// Mean cross-entropy of softmax(logits (N, C)) against labels, with label smoothing ε.
double cross_entropy_forward(const Values& logits, const std::vector<int64_t>& labels, int64_t N, int64_t C,
                             double smoothing = 0);
// d loss / d logits times the loss's cotangent u (a scalar): u·(softmax − target)/N.
Values cross_entropy_backward(double u, const Values& logits, const std::vector<int64_t>& labels, int64_t N,
                              int64_t C, double smoothing = 0);
// mean((a − b)²), and its cotangents u·2(a − b)/n, −u·2(a − b)/n.
double mse_forward(const Values& a, const Values& b);
ProductGrads mse_backward(double u, const Values& a, const Values& b);

// PIL's resize of an interleaved (h, w, channels) byte image to (out_h, out_w, channels):
// rows first, then columns, each output a fixed-point sum over its whole input axis.
std::vector<uint8_t> resample_uint8(const std::vector<uint8_t>& in, int64_t h, int64_t w, int64_t channels,
                                    int64_t out_h, int64_t out_w, ResampleFilter filter);

}  // namespace adjoint::reference
