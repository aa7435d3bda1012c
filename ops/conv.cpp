// conv2d: the op. Which algorithm runs a convolution, its one backward rule for every
// transport, and the shortcuts around it (dead kernel taps, a fused eval-mode BatchNorm).
// The algorithms live in ops/conv/, each with the constants that tune it:
//
//   ops/conv/geometry.h         what they share: the extents of a convolution, the epilogue
//                               applied to each output, the scratch pool, the GEMM call
//   ops/conv/im2col.h           im2col + GEMM (and col2im for the input gradient): any shape
//   ops/conv/winograd.h         Winograd F(2×2, 3×3): 3×3 kernels at stride 1
//   ops/conv/winograd_f4.h      Winograd F(4×4, 3×3): the same on maps of 14 and more
//   ops/conv/winograd_f4_weight_grad.h  F(4×4)'s weight gradient, in its transform domain
//   ops/conv/winograd_avx512.h  Winograd's transforms 16 tiles at a time, on AVX-512
//   ops/conv/direct.h           direct convolution kernels, on AVX-512: narrow layers,
//                               small maps, strided 3×3 layers
//
// The choice (forward and input gradient each choose; the weight gradient runs by F(4×4)
// where it applies, else through GEMMs): direct where its kernels suit the shape, else Winograd where it applies
// (F(4×4) on maps of 14 and more, else F(2×2)), else im2col. Why each rule sits where it
// does: ops/conv.h; the measurements behind the constants: docs/benchmarks.md,
// "Convolution tuning constants".
#include "ops/conv.h"

#include <utility>
#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/flops.h"
#include "engine/vectorize.h"
#include "ops/activation.h"
#include "ops/elementwise.h"
#include "ops/conv/direct.h"
#include "ops/conv/geometry.h"
#include "ops/conv/im2col.h"
#include "ops/conv/prepared_weights.h"
#include "ops/conv/winograd.h"
#include "ops/conv/winograd_f4.h"
#include "ops/conv/winograd_f4_weight_grad.h"
#include "ops/layout.h"
#include "ops/norm.h"

namespace adjoint {

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation) {
  const int64_t span = in + 2 * pad - dilation * (kernel - 1) - 1;
  return span < 0 ? 0 : span / stride + 1;
}

namespace {

using namespace conv;

// The direct kernels' view of a convolution (ops/conv/direct.h), forward or for its input
// gradient (the convolution of dY with the transposed, flipped kernel), when they run it.
std::optional<DirectConvShape> direct_shape(const ConvGeometry& g, bool input_gradient) {
  if (g.dh != 1 || g.dw != 1 || g.groups != 1) return std::nullopt;
  if (input_gradient && (g.sh != 1 || g.sw != 1)) return std::nullopt;  // a strided conv's adjoint is not one
  const DirectConvShape s =
      input_gradient
          ? DirectConvShape{g.N, g.O, g.OH, g.OW, g.C, g.KH, g.KW, g.KH - 1 - g.ph, g.KW - 1 - g.pw, g.H, g.W}
          : DirectConvShape{g.N, g.C, g.H, g.W, g.O, g.KH, g.KW, g.ph, g.pw, g.OH, g.OW, g.sh, g.sw};
  if (!direct_conv_runs(s)) return std::nullopt;
  return s;
}

// The choice rule, forward or for the input gradient: direct where its kernels suit the
// shape, else Winograd where it applies (F(4×4) where its tiles fit the map, else F(2×2)),
// else im2col. The input gradient by F(4×4) is the forward pass of its own convolution
// (winograd_f4_input_gradient_geometry). (The weight gradient runs by F(4×4) where it
// applies with enough tiles, else through F(2×2)'s GEMMs where Winograd does, else im2col's.)
ConvAlgorithm choose_algorithm(const ConvGeometry& g, bool input_gradient) {
  if (direct_shape(g, input_gradient)) return ConvAlgorithm::Direct;
  if (winograd_f4_applies(input_gradient ? winograd_f4_input_gradient_geometry(g) : g))
    return ConvAlgorithm::WinogradF4;
  return winograd_applies(g) ? ConvAlgorithm::Winograd : ConvAlgorithm::Im2col;
}

// Convolution is affine in x (and linear in w): one rule serves every transport. Inputs x,
// w, the bias and, when the convolution added one as it wrote its output, a residual (whose
// cotangent is the output's).
// With `keep_prepared`, the input gradient's forms of the weights are kept with them
// (ops/conv/prepared_weights.h).
class Conv2dNode : public Node {
 public:
  Conv2dNode(const ConvGeometry& g, Tensor x, Tensor w, bool keep_prepared)
      : g_(g), x_(std::move(x)), w_(std::move(w)), keep_prepared_(keep_prepared) {}
  std::string name() const override { return "conv2d"; }

  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override {
    const float* x = x_.defined() ? std::as_const(x_).data() : nullptr;  // read by dw alone
    const Tensor& w = w_;  // read only, so that its version (engine/tensor.h) stays
    const PreparedWeights kept = keep_prepared_ ? PreparedWeights(w) : PreparedWeights();
    Tensor dx, dw, db, dresidual;
    // A fresh handle, so that the engine copies before it adds into it.
    if (needs.size() > 3 && needs[3]) dresidual = u.detach();
    const auto cotangents = [&] {
      return needs.size() > 3 ? std::vector<Tensor>{dx, dw, db, dresidual} : std::vector<Tensor>{dx, dw, db};
    };
    const bool winograd = winograd_applies(g_);
    const ConvAlgorithm dx_algorithm = needs[0] ? choose_algorithm(g_, true) : ConvAlgorithm::Im2col;
    const std::optional<DirectConvShape> direct =
        dx_algorithm == ConvAlgorithm::Direct ? direct_shape(g_, true) : std::nullopt;
    const bool dx_f4 = dx_algorithm == ConvAlgorithm::WinogradF4;
    // conv_backward adds into dx, except for 1×1 kernels without padding, whose input
    // gradient it writes as winograd_backward, winograd_f4_input_gradient and direct_conv
    // do: every entry.
    if (needs[0])
      dx = winograd || direct || dx_f4 || col2im_writes_every_entry(g_) ? Tensor::empty(inputs[0].shape)
                                                                        : Tensor::zeros(inputs[0].shape);
    if (needs[1]) dw = Tensor::empty(w_.shape());
    if (needs.size() > 2 && needs[2]) db = Tensor::empty({g_.O});
    if (direct) direct_conv(*direct, u.data(), w.data(), true, dx.data(), [](float*, int64_t) {}, kept);
    if (dx_f4) winograd_f4_input_gradient(g_, w.data(), u.data(), dx.data(), kept);
    const bool dw_f4 = dw.defined() && winograd_f4_weight_gradient_applies(g_);
    if (dw_f4) winograd_f4_weight_gradient(g_, x, u.data(), dw.data());
    auto pointer = [](Tensor& t) { return t.defined() ? t.data() : nullptr; };
    // What the GEMM paths still compute.
    float* dx_left = direct || dx_f4 ? nullptr : pointer(dx);
    float* dw_left = dw_f4 ? nullptr : pointer(dw);
    if (!dx_left && !dw_left && !db.defined()) return cotangents();
    if (winograd)
      winograd_backward(g_, x, w.data(), u.data(), dx_left, dw_left, pointer(db), kept);
    else
      conv_backward(g_, x, w.data(), u.data(), dx_left, dw_left, pointer(db), kept);
    return cotangents();
  }

 private:
  void release() override { x_ = w_ = Tensor(); }

  ConvGeometry g_;
  Tensor x_, w_;
  bool keep_prepared_;
};

// The output of a convolution with `epilogue` (its bias pointer is set here, from `bias`,
// and its residual from `residual`, when defined), the weights' forms kept by `kept`.
Tensor convolve(const ConvGeometry& g, const Tensor& x, const Tensor& w, const Tensor& bias, Epilogue epilogue,
                const Tensor& residual, const PreparedWeights& kept) {
  Tensor out = Tensor::empty({g.N, g.O, g.OH, g.OW});
  count_multiply_adds(g.N * g.O * g.P * g.rows_g);
  epilogue.bias = bias.defined() ? bias.data() : nullptr;
  if (residual.defined()) epilogue.residual = residual.data(), epilogue.output = out.data();
  if (g.N == 0) return out;
  switch (choose_algorithm(g, false)) {
    case ConvAlgorithm::Direct:
      direct_conv(*direct_shape(g, false), x.data(), w.data(), false, out.data(), [&](float* plane, int64_t o) {
        run_widest([&] {
          if (epilogue.bias)
            for (int64_t p = 0; p < g.P; ++p) plane[p] += epilogue.bias[o];
          epilogue.finish_row(plane, g.P, o);
        });
      }, kept);
      break;
    case ConvAlgorithm::Winograd: winograd_forward(g, x.data(), w.data(), epilogue, out.data(), kept); break;
    case ConvAlgorithm::WinogradF4: winograd_f4_forward(g, x.data(), w.data(), epilogue, out.data(), kept); break;
    case ConvAlgorithm::Im2col: conv_forward(g, x.data(), w.data(), epilogue, out.data(), kept); break;
  }
  return out;
}

Tensor contiguous_or_undefined(const Tensor& t) { return t.defined() ? t.contiguous() : Tensor(); }

// How many kernel taps at each end of one axis read nothing but padding, for every output
// position (dilation 1). Cut symmetrically only, since the padding is symmetric.
int64_t dead_taps(int64_t in, int64_t out, int64_t kernel, int64_t stride, int64_t pad) {
  const auto live = [&](int64_t k) {
    for (int64_t o = 0; o < out; ++o)
      if (const int64_t i = o * stride - pad + k; i >= 0 && i < in) return true;
    return false;
  };
  int64_t cut = 0;
  while (2 * (cut + 1) < kernel && cut < pad && !live(cut) && !live(kernel - 1 - cut)) ++cut;
  return cut;
}

// A convolution whose outer kernel taps meet only padding equals the one with those taps
// cut from the kernel and the padding cut to match: a 3×3 convolution with padding 1 over
// a 1×1 map (VGG's last blocks on 28×28 images) is its centre tap, one GEMM where im2col
// multiplies nine taps and Winograd sixteen transformed ones. The cut is a recorded slice
// of the weight, so the cut taps' gradient is zero under every transport. Returns false
// (and leaves the outputs alone) when no tap is dead.
bool cut_dead_taps(const ConvGeometry& g, const Tensor& w, const Conv2dOptions& o, Tensor* cut_w, Conv2dOptions* cut_o) {
  if (g.dh != 1 || g.dw != 1) return false;
  const int64_t ch = dead_taps(g.H, g.OH, g.KH, g.sh, g.ph), cw = dead_taps(g.W, g.OW, g.KW, g.sw, g.pw);
  if (ch == 0 && cw == 0) return false;
  *cut_w = slice(slice(w, 2, ch, g.KH - ch), 3, cw, g.KW - cw);
  *cut_o = o;
  cut_o->pad_h -= ch;
  cut_o->pad_w -= cw;
  return true;
}

}  // namespace

const char* to_string(ConvAlgorithm algorithm) {
  switch (algorithm) {
    case ConvAlgorithm::Im2col: return "im2col";
    case ConvAlgorithm::Winograd: return "winograd";
    case ConvAlgorithm::WinogradF4: return "winograd-f4";
    case ConvAlgorithm::Direct: return "direct";
  }
  return "?";
}

ConvAlgorithm conv2d_algorithm(const Tensor& x, const Tensor& weight, const Conv2dOptions& options,
                               bool input_gradient) {
  const ConvGeometry g = make_geometry(x, weight, Tensor(), options);
  Tensor cut_w;
  Conv2dOptions cut_o;
  if (cut_dead_taps(g, weight, options, &cut_w, &cut_o)) return conv2d_algorithm(x, cut_w, cut_o, input_gradient);
  return choose_algorithm(g, input_gradient);
}

namespace {

// conv2d_add; with `keep_prepared`, the forms prepared from the weights, forward and for the
// input gradient, are kept with them (ops/conv/prepared_weights.h): for weights that stay
// the same from call to call (eval mode).
Tensor convolve_add(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Conv2dOptions& options,
                    const Tensor& residual_in, bool keep_prepared) {
  const ConvGeometry g = make_geometry(x_in, weight_in, bias_in, options);
  Tensor cut_w;
  Conv2dOptions cut_o;
  if (cut_dead_taps(g, weight_in, options, &cut_w, &cut_o))
    return convolve_add(x_in, cut_w, bias_in, cut_o, residual_in, keep_prepared);
  if (residual_in.defined()) {
    check(residual_in.shape() == Shape{g.N, g.O, g.OH, g.OW}, "conv2d: residual ", residual_in.shape(),
          " does not match the output [", g.N, ", ", g.O, ", ", g.OH, ", ", g.OW, "]");
    // Winograd finishes its rows in a staging copy (F(2×2)) or scatters them (F(4×4)),
    // without the residual: the addition runs after it, as its own op.
    if (const ConvAlgorithm a = choose_algorithm(g, false); a == ConvAlgorithm::Winograd || a == ConvAlgorithm::WinogradF4)
      return add(convolve_add(x_in, weight_in, bias_in, options, Tensor(), keep_prepared), residual_in);
  }
  const Tensor x = x_in.contiguous(), w = weight_in.contiguous(), bias = contiguous_or_undefined(bias_in);
  const Tensor residual = contiguous_or_undefined(residual_in);
  const bool record = needs_grad({x, w, bias, residual});
  Tensor out = convolve(g, x, w, bias, Epilogue{}, residual, keep_prepared ? PreparedWeights(w) : PreparedWeights());
  if (record)
    // The input is kept for the weight's gradient alone: a convolution is linear in x.
    attach(out, std::make_shared<Conv2dNode>(g, needs_grad({w}) ? x.detach() : Tensor(), w.detach(), keep_prepared),
           residual.defined() ? std::vector<Tensor>{x, w, bias, residual} : std::vector<Tensor>{x, w, bias});
  return out;
}

}  // namespace

Tensor conv2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Conv2dOptions& options) {
  return convolve_add(x_in, weight_in, bias_in, options, Tensor(), false);
}

Tensor conv2d_add(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Conv2dOptions& options,
                  const Tensor& residual_in) {
  return convolve_add(x_in, weight_in, bias_in, options, residual_in, false);
}

Tensor conv2d_batch_norm_eval(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in,
                              const Conv2dOptions& options, const EvalBatchNorm& bn, bool then_relu,
                              const Tensor& residual) {
  // What follows the BatchNorm when it runs as its own op: + residual, then the ReLU.
  const auto finish = [&](const Tensor& y) {
    if (!residual.defined()) return then_relu ? relu(y) : y;
    return then_relu ? add_relu(y, residual) : add(y, residual);
  };
  if (needs_grad({x_in, weight_in, bias_in, bn.weight, bn.bias, residual})) {
    // In a graph the BatchNorm is the map z ↦ scale·z + shift under every transport, so it
    // folds into the convolution, w·scale per output channel and b·scale + shift: one op,
    // and a pass over the output each way, less. The same values up to rounding (the
    // products are scaled before summing). Parameters that take part in the graph get their
    // gradients back through the fold (ops/norm.h).
    const FoldedConvolution folded =
        fold_eval_batch_norm(weight_in, bias_in, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps);
    const Tensor y = convolve_add(x_in, folded.weight, folded.bias, options, residual, true);
    return then_relu ? relu(y) : y;
  }
  const ConvGeometry g = make_geometry(x_in, weight_in, bias_in, options);
  Tensor cut_w;
  Conv2dOptions cut_o;
  if (cut_dead_taps(g, weight_in, options, &cut_w, &cut_o))
    return conv2d_batch_norm_eval(x_in, cut_w, bias_in, cut_o, bn, then_relu, residual);
  const ChannelAffine affine = eval_batch_norm_affine(g.O, bn.weight, bn.bias, bn.running_mean, bn.running_var, bn.eps);
  const Epilogue epilogue{nullptr, affine.scale.data(), affine.shift.data()};
  const Tensor x = x_in.contiguous(), w = weight_in.contiguous(), bias = contiguous_or_undefined(bias_in);
  if (residual.defined()) {
    check(residual.shape() == Shape{g.N, g.O, g.OH, g.OW}, "conv2d_batch_norm_eval: residual ", residual.shape(),
          " does not match the output [", g.N, ", ", g.O, ", ", g.OH, ", ", g.OW, "]");
    // Winograd finishes its rows in a staging copy (F(2×2)) or scatters them (F(4×4)),
    // without the residual: the addition runs after it.
    if (const ConvAlgorithm a = choose_algorithm(g, false); a == ConvAlgorithm::Winograd || a == ConvAlgorithm::WinogradF4)
      return finish(convolve(g, x, w, bias, epilogue, Tensor(), PreparedWeights(w)));
  }
  Epilogue fused = epilogue;
  fused.relu = then_relu;
  return convolve(g, x, w, bias, fused, contiguous_or_undefined(residual), PreparedWeights(w));
}

}  // namespace adjoint
