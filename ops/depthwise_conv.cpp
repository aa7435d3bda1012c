#include "ops/depthwise_conv.h"

#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "engine/vectorize.h"

namespace adjoint {

namespace {

// Output rows per partial sum of the weight gradient: a partial (k²+1 rows of C) is written
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

// Output row r = (b, h) of y = bias + the depth-wise convolution of x with `taps`.
// Position by position: a position's C sums stay in L1 while its k·k taps add onto them
// (tap by tap over a whole row, the row's sums would go through L2 k·k times). Each sum
// still adds its taps in the order (i, j), so the bits do not depend on the loop order.
// With `act`, each position's outputs then go through that activation, while in L1.
[[gnu::always_inline]] inline void convolve_row(const Extents& e, const float* x, const float* taps,
                                                const float* bias, float* y, int64_t r,
                                                const Activation* act = nullptr) {
  const int64_t p = e.k / 2, row = e.W * e.C, b = r / e.H, h = r % e.H;
  // The taps' rows that lie inside the map: i in [i0, i1).
  const int64_t i0 = std::max<int64_t>(0, p - h), i1 = std::min<int64_t>(e.k, e.H + p - h);
  for (int64_t w = 0; w < e.W; ++w) {
    float* __restrict o = y + r * row + w * e.C;
    for (int64_t c = 0; c < e.C; ++c) o[c] = bias ? bias[c] : 0.0f;
    const int64_t j0 = std::max<int64_t>(0, p - w), j1 = std::min<int64_t>(e.k, e.W + p - w);
    for (int64_t i = i0; i < i1; ++i) {
      const float* in_row = x + (b * e.H + h + i - p) * row;
      for (int64_t j = j0; j < j1; ++j) {
        const float* __restrict in = in_row + (w + j - p) * e.C;
        const float* __restrict tap = taps + (i * e.k + j) * e.C;
        for (int64_t c = 0; c < e.C; ++c) o[c] += in[c] * tap[c];
      }
    }
    if (act) activation_values(o, o, e.C, *act);
  }
}

// y = bias + the depth-wise convolution of x with `taps` [then `act`], one output row a task.
void convolve(const Extents& e, const float* x, const float* taps, const float* bias, float* y,
              const Activation* act = nullptr) {
  parallel_for(e.B * e.H, std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(e.W * e.C * e.k * e.k, 1)),
               [&](int64_t r0, int64_t r1) {
    run_widest([&] {
      for (int64_t r = r0; r < r1; ++r) convolve_row(e, x, taps, bias, y, r, act);
    });
  });
}

// Adds output row r's terms of the weight and bias gradients to `acc`, k·k taps of C
// partial sums then the bias's C: tap (i, j) += u[r][w] · x[b][h + i − p][w + j − p],
// bias += u[r][w], position by position (a position's u and the partials stay in L1 across
// the taps; each partial still sums its positions in order).
[[gnu::always_inline]] inline void add_row_gradients(const Extents& e, const float* u, const float* x, int64_t r,
                                                     float* acc) {
  const int64_t k = e.k, p = k / 2, C = e.C, row = e.W * C, b = r / e.H, h = r % e.H;
  const int64_t i0 = std::max<int64_t>(0, p - h), i1 = std::min<int64_t>(k, e.H + p - h);
  float* __restrict bias_acc = acc + k * k * C;
  for (int64_t w = 0; w < e.W; ++w) {
    const float* __restrict uu = u + r * row + w * C;
    for (int64_t c = 0; c < C; ++c) bias_acc[c] += uu[c];
    const int64_t j0 = std::max<int64_t>(0, p - w), j1 = std::min<int64_t>(k, e.W + p - w);
    for (int64_t i = i0; i < i1; ++i) {
      const float* x_row = x + (b * e.H + h + i - p) * row;
      for (int64_t j = j0; j < j1; ++j) {
        float* __restrict tap = acc + (i * k + j) * C;
        const float* __restrict xx = x_row + (w + j - p) * C;
        for (int64_t c = 0; c < C; ++c) tap[c] += uu[c] * xx[c];
      }
    }
  }
}

class DepthwiseConvNode : public Node {
public:
  DepthwiseConvNode(Extents e, Tensor x, std::vector<float> flipped_taps, bool has_bias)
      : e_(e), x_(std::move(x)), flipped_taps_(std::move(flipped_taps)), has_bias_(has_bias) {}
  std::string name() const override { return "depthwise_conv2d_channels_last"; }
  std::vector<Tensor> vjp(const Tensor& cotangent, const Transport&) override {
    const Tensor u = cotangent.contiguous();
    const float* pu = u.data();
    std::vector<Tensor> out(has_bias_ ? 3 : 2);
    if (needs[0]) out[0] = Tensor::empty({e_.B, e_.H, e_.W, e_.C});
    if (needs[1] || (has_bias_ && needs[2])) {
      auto [dw, db] = parameter_gradients(pu, needs[0] ? out[0].data() : nullptr);
      if (needs[1]) out[1] = dw;
      if (has_bias_ && needs[2]) out[2] = db;
    } else if (needs[0]) {
      convolve(e_, pu, flipped_taps_.data(), nullptr, out[0].data());
    }
    return out;
  }
  void release() override {
    x_ = Tensor();
    flipped_taps_.clear();
  }

private:
  // dweight[c][0][i][j] = Σ_{b,h,w} u[b][h][w][c] · x[b][h + i − p][w + j − p][c] and
  // dbias[c] = Σ_{b,h,w} u[b][h][w][c], as a pair of Tensors; and, when `dx` is given, the
  // input gradient into it in the same pass, row by row, while the rows of u that both
  // read are in cache. Each chunk of kRowsPerChunk output rows sums its positions into a
  // partial of every tap; the partials are then added in chunk order. The chunks do not
  // depend on the thread count, so neither do the bits.
  std::pair<Tensor, Tensor> parameter_gradients(const float* pu, float* dx) const {
    const int64_t k = e_.k, C = e_.C, rows = e_.B * e_.H;
    const int64_t chunks = (rows + kRowsPerChunk - 1) / kRowsPerChunk, width = (k * k + 1) * C;
    const float* px = x_.data();
    std::vector<float> partial(size_t(chunks * width), 0.0f);
    parallel_for(chunks, 1, [&](int64_t q0, int64_t q1) {
      run_widest([&] {
        for (int64_t q = q0; q < q1; ++q)
          for (int64_t r = q * kRowsPerChunk; r < std::min(rows, (q + 1) * kRowsPerChunk); ++r) {
            if (dx) convolve_row(e_, pu, flipped_taps_.data(), nullptr, dx, r);
            add_row_gradients(e_, pu, px, r, partial.data() + q * width);
          }
      });
    });
    std::vector<float> total(size_t(width), 0.0f);
    parallel_for(width, 1024, [&](int64_t a, int64_t z) {
      for (int64_t q = 0; q < chunks; ++q)
        for (int64_t t = a; t < z; ++t) total[size_t(t)] += partial[size_t(q * width + t)];
    });
    Tensor dw = Tensor::empty({C, 1, k, k}), db = Tensor::empty({C});
    for (int64_t c = 0; c < C; ++c) {
      for (int64_t t = 0; t < k * k; ++t) dw.data()[c * k * k + t] = total[size_t(t * C + c)];
      db.data()[c] = total[size_t(k * k * C + c)];
    }
    return {dw, db};
  }

  Extents e_;
  Tensor x_;  // the input, kept when the weight or bias needs a gradient
  std::vector<float> flipped_taps_;
  bool has_bias_;
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

}  // namespace

Tensor depthwise_conv2d_channels_last(const Tensor& x_in, const Tensor& weight, const Tensor& bias_in) {
  const Extents e = checked_extents(x_in, weight, bias_in);
  const int64_t C = e.C;
  const Tensor x = x_in.contiguous();
  const Tensor bias = bias_in.defined() ? bias_in.contiguous() : bias_in;
  Tensor y = Tensor::empty(x.shape());
  convolve(e, x.data(), taps_of(weight, C, e.k, false).data(), bias.defined() ? bias.data() : nullptr, y.data());
  std::vector<Tensor> inputs = {x, weight};
  if (bias.defined()) inputs.push_back(bias);
  if (needs_grad(inputs)) {
    const bool weight_needs = needs_grad({weight}), x_needs = needs_grad({x});
    const bool bias_needs = bias.defined() && needs_grad({bias});
    attach(y,
           std::make_shared<DepthwiseConvNode>(e, weight_needs || bias_needs ? x : Tensor(),
                                               x_needs ? taps_of(weight, C, e.k, true) : std::vector<float>{},
                                               bias.defined()),
           inputs);
  }
  return y;
}

Tensor depthwise_conv2d_channels_last(const Tensor& x_in, const Tensor& weight, const Tensor& bias_in,
                                      Activation act) {
  if (needs_grad({x_in, weight, bias_in})) return activation(depthwise_conv2d_channels_last(x_in, weight, bias_in), act);
  const Extents e = checked_extents(x_in, weight, bias_in);
  const Tensor x = x_in.contiguous();
  const Tensor bias = bias_in.defined() ? bias_in.contiguous() : bias_in;
  Tensor y = Tensor::empty(x.shape());
  convolve(e, x.data(), taps_of(weight, e.C, e.k, false).data(), bias.defined() ? bias.data() : nullptr, y.data(),
           &act);
  return y;
}

}  // namespace adjoint
