#include "ops/depthwise_conv.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "engine/vectorize.h"
#include "ops/elementwise.h"

namespace adjoint {

namespace {

// Output rows per partial sum of the parameters' gradients: a partial (k²+2 rows of C) is written
// once per chunk, so chunks of a few rows keep the partials small beside the data they sum.
constexpr int64_t kRowsPerChunk = 4;

struct Extents {
  int64_t B, H, W, C, k;
};

// The kernel as k·k taps of C weights each, tap (i, j) at (i·k + j)·C, so that a tap's
// weights lie along the channels as the map's values do. `flipped` reverses the taps: the
// kernel of the input gradient.
std::vector<float> taps_of(const Tensor& weight, int64_t C, int64_t k, bool flipped) {
  const Tensor w = weight.contiguous();
  const float* pw = w.data();
  std::vector<float> taps(size_t(k * k * C));
  for (int64_t c = 0; c < C; ++c)
    for (int64_t t = 0; t < k * k; ++t) taps[size_t((flipped ? k * k - 1 - t : t) * C + c)] = pw[c * k * k + t];
  return taps;
}

// What a pass adds around the convolution's sums: the output's bias, and a bias added to
// every input value as it is read (that of the linear layer that made x, so that x plus
// its bias is never written out as a map of its own).
struct Terms {
  const float* taps;
  const float* bias = nullptr;        // (C), or null
  const float* input_bias = nullptr;  // (C), or null
};

// Output row r = (b, h) of y = bias + the depth-wise convolution of (x + input_bias) with
// the taps, into `out` (the row's W·C values). Position by position: a position's C sums
// stay in L1 while its k·k taps add onto them (tap by tap over a whole row, the row's sums
// would go through L2 k·k times). Each sum still adds its taps in the order (i, j), so the
// bits do not depend on the loop order. With `act`, each position's outputs then go
// through that activation, while in L1, into `activated` (which may be `out`); with
// `derivatives` too, the activation's derivative at them replaces them in `out`.
[[gnu::always_inline]] inline void convolve_row(const Extents& e, const float* x, const Terms& terms, int64_t r,
                                                float* out, const Activation* act = nullptr,
                                                float* activated = nullptr, bool derivatives = false) {
  const int64_t p = e.k / 2, C = e.C, row = e.W * C, b = r / e.H, h = r % e.H;
  // The taps' rows that lie inside the map: i in [i0, i1).
  const int64_t i0 = std::max<int64_t>(0, p - h), i1 = std::min<int64_t>(e.k, e.H + p - h);
  const float* __restrict in_bias = terms.input_bias;
  for (int64_t w = 0; w < e.W; ++w) {
    float* __restrict o = out + w * C;
    for (int64_t c = 0; c < C; ++c) o[c] = terms.bias ? terms.bias[c] : 0.0f;
    const int64_t j0 = std::max<int64_t>(0, p - w), j1 = std::min<int64_t>(e.k, e.W + p - w);
    for (int64_t i = i0; i < i1; ++i) {
      const float* in_row = x + (b * e.H + h + i - p) * row;
      for (int64_t j = j0; j < j1; ++j) {
        const float* __restrict in = in_row + (w + j - p) * C;
        const float* __restrict tap = terms.taps + (i * e.k + j) * C;
        if (in_bias)
          for (int64_t c = 0; c < C; ++c) o[c] += (in[c] + in_bias[c]) * tap[c];
        else
          for (int64_t c = 0; c < C; ++c) o[c] += in[c] * tap[c];
      }
    }
    if (act && derivatives) activation_values_and_derivatives(o, activated + w * C, o, C, *act);
    else if (act) activation_values(o, activated + w * C, C, *act);
  }
}

// y = the convolution, one output row a task; with `act`, y = act(z) and the
// pre-activation z written to `z` too (a recorded graph keeps it), or act'(z) in its place
// with `derivatives`, or neither when z is null.
void convolve(const Extents& e, const float* x, const Terms& terms, float* y, const Activation* act = nullptr,
              float* z = nullptr, bool derivatives = false) {
  const int64_t row = e.W * e.C;
  parallel_for(e.B * e.H, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(row * e.k * e.k, 1)),
               [&](int64_t r0, int64_t r1) {
    run_widest([&] {
      for (int64_t r = r0; r < r1; ++r)
        convolve_row(e, x, terms, r, (z ? z : y) + r * row, act, y + r * row, derivatives);
    });
  });
}

// Adds output row r's terms of the weight and bias gradients to `acc`, k·k taps of C
// partial sums then the bias's C: tap (i, j) += u[r][w] · (x + input_bias)[b][h + i − p][w + j − p],
// bias += u[r][w], position by position (a position's u and the partials stay in L1 across
// the taps; each partial still sums its positions in order). `u` is the cotangent's row r.
[[gnu::always_inline]] inline void add_row_gradients(const Extents& e, const float* u, const float* x,
                                                     const float* input_bias, int64_t r, float* acc) {
  const int64_t k = e.k, p = k / 2, C = e.C, row = e.W * C, b = r / e.H, h = r % e.H;
  const int64_t i0 = std::max<int64_t>(0, p - h), i1 = std::min<int64_t>(k, e.H + p - h);
  const float* __restrict in_bias = input_bias;
  float* __restrict bias_acc = acc + k * k * C;
  for (int64_t w = 0; w < e.W; ++w) {
    const float* __restrict uu = u + w * C;
    for (int64_t c = 0; c < C; ++c) bias_acc[c] += uu[c];
    const int64_t j0 = std::max<int64_t>(0, p - w), j1 = std::min<int64_t>(k, e.W + p - w);
    for (int64_t i = i0; i < i1; ++i) {
      const float* x_row = x + (b * e.H + h + i - p) * row;
      for (int64_t j = j0; j < j1; ++j) {
        float* __restrict tap = acc + (i * k + j) * C;
        const float* __restrict xx = x_row + (w + j - p) * C;
        if (in_bias)
          for (int64_t c = 0; c < C; ++c) tap[c] += uu[c] * (xx[c] + in_bias[c]);
        else
          for (int64_t c = 0; c < C; ++c) tap[c] += uu[c] * xx[c];
      }
    }
  }
}

// Depth-wise convolution [then an activation] as one recorded op:
//   y = act(z), z = bias + the convolution of (x + input_bias) with the kernel.
// It keeps z, or in a training step (GradientOnly) act'(z) when the activation's gradient
// multiplies, so that backward need not evaluate the activation's derivative again.
// Its backward makes z's cotangent (the activation's rule), then in one pass over the rows
// the input's cotangent and the weight's, the bias's and the input bias's terms, the last
// from the input's cotangent rows while they are in cache.
class DepthwiseConvNode : public Node {
public:
  DepthwiseConvNode(Extents e, Tensor x, Tensor z, bool z_is_derivative, std::optional<Activation> act,
                    std::vector<float> flipped_taps, Tensor input_bias)
      : e_(e), x_(std::move(x)), z_(std::move(z)), z_is_derivative_(z_is_derivative), act_(act),
        flipped_taps_(std::move(flipped_taps)), input_bias_(std::move(input_bias)) {}
  std::string name() const override {
    return act_ ? cat("depthwise_conv2d_channels_last+", to_string(*act_)) : "depthwise_conv2d_channels_last";
  }
  // Inputs: x, weight, bias, input_bias (the last two possibly undefined).
  std::vector<Tensor> vjp(const Tensor& cotangent, const Transport& t) override {
    // z's cotangent. With an activation it is this op's own map, and the input's cotangent
    // is written over it, each row once no later row reads it (one map fewer alive at once,
    // as when the activation's node let go of its cotangent before the convolution's ran).
    const bool in_place = act_.has_value();
    check(!z_is_derivative_ || t.kind == TransportKind::Gradient, name(),
          ": this graph was recorded under GradientOnly (a training step), which keeps the ", to_string(*act_),
          "'s derivative, not its input; the ", to_string(t.kind),
          " transport needs the input, so record the forward outside GradientOnly");
    Tensor dz = z_is_derivative_ ? mul(z_, cotangent.contiguous())
                : in_place       ? activation_vjp(z_, cotangent, *act_, t)
                                 : cotangent.contiguous();
    std::vector<Tensor> out(4);
    const bool params = needs[1] || needs[2] || needs[3], dx_needed = needs[0] || needs[3];
    if (dx_needed) out[0] = in_place ? dz : Tensor::empty({e_.B, e_.H, e_.W, e_.C});
    if (!dx_needed && !params) return out;
    const int64_t k = e_.k, p = k / 2, C = e_.C, row = e_.W * C;
    const int64_t image_chunks = (e_.H + kRowsPerChunk - 1) / kRowsPerChunk, chunks = e_.B * image_chunks;
    // Partials of each chunk (an image's rows, kRowsPerChunk at a time): k·k taps of C, the
    // bias's C, the input bias's C.
    const int64_t width = params ? (k * k + 2) * C : 0;
    std::vector<float> partial(size_t(chunks * width), 0.0f);
    const float* in_bias = input_bias_.defined() ? input_bias_.data() : nullptr;
    const Terms flipped{flipped_taps_.data()};
    float* pz = dz.data();
    // An image a task, its rows in order: the input's cotangent row h reads z's rows h − p …
    // h + p of the same image, so in place its row h waits in `lag` until row h + p is made.
    parallel_for(e_.B, 1, [&](int64_t b0, int64_t b1) {
      Tensor lag_rows = in_place && dx_needed ? Tensor::empty({p + 1, row}) : Tensor();
      float* lag = lag_rows.defined() ? lag_rows.data() : nullptr;
      run_widest([&] {
        for (int64_t b = b0; b < b1; ++b) {
          for (int64_t h = 0; h < e_.H; ++h) {
            const int64_t r = b * e_.H + h;
            float* acc = params ? partial.data() + (b * image_chunks + h / kRowsPerChunk) * width : nullptr;
            if (dx_needed) {
              float* dx_row = lag ? lag + (h % (p + 1)) * row : out[0].data() + r * row;
              convolve_row(e_, pz, flipped, r, dx_row);
              if (acc && in_bias) add_row_sums(dx_row, acc + (k * k + 1) * C);
            }
            if (acc) add_row_gradients(e_, pz + r * row, x_.data(), in_bias, r, acc);
            if (lag && h >= p) std::copy_n(lag + ((h - p) % (p + 1)) * row, row, pz + (r - p) * row);
          }
          if (lag)
            for (int64_t h = std::max<int64_t>(0, e_.H - p); h < e_.H; ++h)
              std::copy_n(lag + (h % (p + 1)) * row, row, pz + (b * e_.H + h) * row);
        }
      });
    });
    if (!params) {
      if (!needs[0]) out[0] = Tensor();
      return out;
    }
    std::vector<float> total(size_t(width), 0.0f);
    parallel_for(width, 1024, [&](int64_t a, int64_t z) {
      for (int64_t q = 0; q < chunks; ++q)
        for (int64_t i = a; i < z; ++i) total[size_t(i)] += partial[size_t(q * width + i)];
    });
    if (needs[1]) {
      out[1] = Tensor::empty({C, 1, k, k});
      for (int64_t c = 0; c < C; ++c)
        for (int64_t i = 0; i < k * k; ++i) out[1].data()[c * k * k + i] = total[size_t(i * C + c)];
    }
    if (needs[2]) out[2] = Tensor::empty({C}), std::copy_n(total.data() + k * k * C, C, out[2].data());
    if (needs[3]) out[3] = Tensor::empty({C}), std::copy_n(total.data() + (k * k + 1) * C, C, out[3].data());
    if (!needs[0]) out[0] = Tensor();
    return out;
  }
  void release() override {
    x_ = z_ = input_bias_ = Tensor();
    flipped_taps_.clear();
  }

private:
  // acc[c] += Σ_w row[w][c]: the input bias's gradient, the input's cotangent summed over positions.
  void add_row_sums(const float* row, float* acc) const {
    for (int64_t w = 0; w < e_.W; ++w) {
      const float* __restrict v = row + w * e_.C;
      float* __restrict a = acc;
      for (int64_t c = 0; c < e_.C; ++c) a[c] += v[c];
    }
  }

  Extents e_;
  Tensor x_;  // the input, kept when a parameter needs a gradient
  Tensor z_;  // the pre-activation, kept when an activation follows, or its derivative there
  bool z_is_derivative_;
  std::optional<Activation> act_;
  std::vector<float> flipped_taps_;  // the kernel of the input's cotangent
  Tensor input_bias_;
};

// The extents of a call, after checking its shapes (the message names them).
Extents checked_extents(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  check(x.dim() == 4, "depthwise_conv2d_channels_last: x must be (B, H, W, C), got ", x.shape());
  const int64_t C = x.size(3);
  check(weight.dim() == 4 && weight.size(0) == C && weight.size(1) == 1 && weight.size(2) == weight.size(3) &&
            weight.size(2) % 2 == 1,
        "depthwise_conv2d_channels_last: weight must be (", C, ", 1, k, k) with k odd for x ", x.shape(), ", got ",
        weight.shape());
  if (bias.defined())
    check(bias.shape() == Shape{C}, "depthwise_conv2d_channels_last: bias must be (", C, "), got ", bias.shape());
  return {x.size(0), x.size(1), x.size(2), C, weight.size(2)};
}

// The op, with or without an activation after it and a bias on its input.
Tensor depthwise_op(const Tensor& x_in, const Tensor& weight, const Tensor& bias_in, std::optional<Activation> act,
                    const Tensor& input_bias_in) {
  const Extents e = checked_extents(x_in, weight, bias_in);
  if (input_bias_in.defined())
    check(input_bias_in.shape() == Shape{e.C}, "depthwise_conv2d_channels_last: input_bias must be (", e.C, "), got ",
          input_bias_in.shape());
  const Tensor x = x_in.contiguous();
  const Tensor bias = bias_in.defined() ? bias_in.contiguous() : bias_in;
  const Tensor input_bias = input_bias_in.defined() ? input_bias_in.contiguous() : input_bias_in;
  const std::vector<float> taps = taps_of(weight, e.C, e.k, false);
  const Terms terms{taps.data(), bias.defined() ? bias.data() : nullptr,
                    input_bias.defined() ? input_bias.data() : nullptr};
  const bool record = needs_grad({x, weight, bias, input_bias});
  const bool derivatives = record && act && *act != Activation::Relu && recording_gradient_only();
  Tensor y = Tensor::empty(x.shape());
  Tensor z = act && record ? Tensor::empty(x.shape()) : Tensor();
  convolve(e, x.data(), terms, y.data(), act ? &*act : nullptr, z.defined() ? z.data() : nullptr, derivatives);
  if (record) {
    const bool params_need = needs_grad({weight, bias, input_bias});
    attach(y,
           std::make_shared<DepthwiseConvNode>(e, params_need ? x.detach() : Tensor(), z, derivatives, act,
                                               needs_grad({x, input_bias}) ? taps_of(weight, e.C, e.k, true)
                                                                           : std::vector<float>{},
                                               input_bias.defined() ? input_bias.detach() : Tensor()),
           {x, weight, bias, input_bias});
  }
  return y;
}

}  // namespace

Tensor depthwise_conv2d_channels_last(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return depthwise_op(x, weight, bias, std::nullopt, Tensor());
}

Tensor depthwise_conv2d_channels_last(const Tensor& x, const Tensor& weight, const Tensor& bias, Activation act,
                                      const Tensor& input_bias) {
  return depthwise_op(x, weight, bias, act, input_bias);
}

}  // namespace adjoint
