#include "ops/norm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/lane_sum.h"
#include "engine/threads.h"
#include "engine/vectorize.h"
#include "ops/activation.h"
#include "ops/gate_bits.h"

namespace adjoint {

namespace {

// Items per parallel chunk for items of `length` values: about 4K values per chunk.
int64_t grain_for(int64_t length) { return std::max<int64_t>(1, 4096 / std::max<int64_t>(length, 1)); }
// Rows per partial sum in the γ/β column reductions (bounds the partials' memory).
constexpr int64_t kReduceGrain = 128;

// Mean and biased variance of the values p[b·stride + i], b < blocks, i < length: one
// channel of a batch (N blocks of L values) or one layer-norm row (a single block). Two
// passes, the second about the mean, so that a large common offset does not cancel.
struct Moments {
  double mean = 0, var = 0;
};
Moments moments(const float* p, int64_t blocks, int64_t length, int64_t stride) {
  const double count = double(blocks) * double(length);
  double sum = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* row = p + b * stride;
    sum += lane_sum(length, [row](int64_t i) { return row[i]; });
  }
  const double mean = sum / count;
  const float m = float(mean);
  double ss = 0;
  for (int64_t b = 0; b < blocks; ++b) {
    const float* row = p + b * stride;
    ss += lane_sum(length, [row, m](int64_t i) { return (row[i] - m) * (row[i] - m); });
  }
  return {mean, ss / count};
}

// Values of an optional per-feature parameter, or `fallback` everywhere when undefined.
std::vector<float> values_or(const Tensor& t, int64_t n, float fallback) {
  if (!t.defined()) return std::vector<float>(static_cast<size_t>(n), fallback);
  return t.to_vector();
}

// ---------------------------------------------------------------------------------------
// BatchNorm. x is viewed as (N, C, L), L the product of the trailing dims. Its loops run a
// channel at a time: a channel's N rows of L values (a few hundred KiB at most in the
// networks here) are read from memory once and stay in the core's cache for the passes
// that follow, so the statistics, the normalisation and the tail (ops/norm.h) cost one
// read of x and one write of the output; backward, one read of x and of the cotangent and
// one write of each input's cotangent.

struct ChannelLayout {
  int64_t N, C, L;
};

// y = x·scale + shift for channel c: scale = γ·invstd, shift = β − μ·scale.
std::pair<float, float> channel_scale_shift(float mean, float invstd, float gamma, float beta) {
  const float scale = gamma * invstd;
  return {scale, beta - mean * scale};
}

class BatchNormNode : public Node {
public:
  // `gate` holds the ReLU's input z, or under GradientOnly its output (whose sign is the
  // gate; the next op keeps it anyway); undefined without a ReLU. Under GradientOnly
  // `gate_bits` holds the same gate as bits (ops/gate_bits.h), which the gradient's and the
  // pullback's select read instead.
  BatchNormNode(Tensor x, ChannelLayout layout, std::vector<float> mean, std::vector<float> invstd,
                std::vector<float> gamma, bool batch_statistics, Tensor gate, bool gate_is_output,
                std::unique_ptr<uint16_t[]> gate_bits)
      : x_(std::move(x)),
        layout_(layout),
        mean_(std::move(mean)),
        invstd_(std::move(invstd)),
        gamma_(std::move(gamma)),
        batch_statistics_(batch_statistics),
        gate_(std::move(gate)),
        gate_is_output_(gate_is_output),
        gate_bits_(std::move(gate_bits)) {}
  std::string name() const override { return gate_.defined() ? "batch_norm_relu" : "batch_norm"; }

  // Cotangents of x, γ, β and the residual (inputs 0–3).
  std::vector<Tensor> vjp(const Tensor& u_in, const Transport& t) override {
    const Tensor u = u_in.contiguous();
    const bool wants_residual = needs.size() > 3 && needs[3];
    std::vector<Tensor> out(needs.size());
    if (!gate_.defined()) {
      // A slope of 1 to the residual: a fresh handle, so that the engine copies before it
      // adds into it.
      if (wants_residual) out[3] = u.detach();
      normalisation_vjp(u.data(), nullptr, t, out);
      return out;
    }
    if (t.kind != TransportKind::Gradient && t.kind != TransportKind::Pullback) {
      // The rules that are not a plain select (soft, guided, DeepLift) from the ReLU's own
      // table, on the saved z; the result is the residual's cotangent as it is.
      check(!gate_is_output_ || t.kind == TransportKind::Guided, name(),
            ": this graph was recorded under GradientOnly (a training step), which keeps only the ReLU's output; the ",
            to_string(t.kind), " transport needs its input, so record the forward outside GradientOnly");
      const Tensor g = activation_vjp(gate_, u, Activation::Relu, t);
      if (wants_residual) out[3] = g;
      normalisation_vjp(g.data(), nullptr, t, out);
      return out;
    }
    // The ReLU's select, written channel by channel inside the loop that then reads it
    // back from cache: into the residual's cotangent when it has one.
    Tensor g = wants_residual ? Tensor::empty(u.shape()) : Tensor();
    normalisation_vjp(u.data(), gate_.data(), t, out, wants_residual ? g.data() : nullptr,
                      gate_bits_.get());
    if (wants_residual) out[3] = g;
    return out;
  }

private:
  // The cotangents of x, γ and β into out[0..2] (where needed) for the cotangent u of the
  // normalised values, or, with `gate`, for the ReLU's select relu_gate(gate, u). The
  // select is written out first, a channel at a time, into `keep` (of u's layout) when
  // given, else into a scratch channel; the reductions then read plain rows, which
  // vectorise. With `gate_bits` the select reads the gate from them (ops/gate_bits.h).
  void normalisation_vjp(const float* u, const float* gate, const Transport& t, std::vector<Tensor>& out,
                         float* keep = nullptr, const uint16_t* gate_bits = nullptr) const {
    const auto [N, C, L] = layout_;
    const float* px = x_.data();
    const double count = double(N) * double(L);
    // Statistics are differentiated only when they came from this batch and the
    // transport is the exact gradient; otherwise the map is x ↦ (γ/σ)·x + const.
    const bool exact = batch_statistics_ && t.is_gradient();
    // Per channel: Σu (the β gradient) and Σu·x̂ (the γ gradient); both also feed the
    // exact input gradient's centring terms. A frozen eval-mode layer (stitching's models,
    // explanations) needs neither: a pass over u and x saved.
    const bool sums = needs[1] || needs[2] || (needs[0] && exact);
    std::vector<double> sum_u(C), sum_u_xhat(C);
    Tensor dx = needs[0] ? Tensor::empty(x_.shape()) : Tensor();
    float* pd = needs[0] ? dx.data() : nullptr;
    parallel_for(C, 1, [&](int64_t c0, int64_t c1) {
      thread_local std::vector<float> scratch;
      if (gate && !keep) scratch.resize(size_t(N * L));
      run_widest([&] {  // the passes after the first read the channel from cache
        for (int64_t c = c0; c < c1; ++c) {
          // Row n of the channel's cotangent is cot + n·stride.
          const float* cot = u + c * L;
          int64_t stride = C * L;
          if (gate) {
            float* selected = keep ? keep + c * L : scratch.data();
            stride = keep ? C * L : L;
            for (int64_t n = 0; n < N; ++n) {
              const float *gr = gate + (n * C + c) * L, *ur = u + (n * C + c) * L;
              float* sr = selected + n * stride;
              if (gate_bits) {
                select_by_gate_bits(gate_bits + (n * C + c) * gate_words(L), ur, L, sr);
                continue;
              }
              for (int64_t l = 0; l < L; ++l) sr[l] = relu_gate(gr[l], ur[l]);
            }
            cot = selected;
          }
          const float mean = mean_[c], invstd = invstd_[c];
          if (sums) {
            double su = 0, sux = 0;  // Σu and Σu·(x − μ)
            for (int64_t n = 0; n < N; ++n) {
              const float *xr = px + (n * C + c) * L, *ur = cot + n * stride;
              const auto [u_sum, ux_sum] = lane_sums(
                  L, [ur](int64_t l) { return ur[l]; }, [ur, xr, mean](int64_t l) { return ur[l] * (xr[l] - mean); });
              su += u_sum, sux += ux_sum;
            }
            sum_u[c] = su, sum_u_xhat[c] = sux * invstd;
          }
          if (!pd) continue;
          const float k = gamma_[c] * invstd;
          // dx = (γ/σ)·(u − mean(u) − x̂·mean(u·x̂)), means over the channel's batch.
          const float mean_u = float(sum_u[c] / count), mean_ux = float(sum_u_xhat[c] / count);
          for (int64_t n = 0; n < N; ++n) {
            const float *xr = px + (n * C + c) * L, *ur = cot + n * stride;
            float* dr = pd + (n * C + c) * L;
            if (!exact) {
              for (int64_t l = 0; l < L; ++l) dr[l] = k * ur[l];
              continue;
            }
            for (int64_t l = 0; l < L; ++l) {
              const float xhat = (xr[l] - mean) * invstd;
              dr[l] = k * (ur[l] - mean_u - xhat * mean_ux);
            }
          }
        }
      });
    });
    if (needs[0]) out[0] = dx;
    if (needs[1]) out[1] = to_tensor(sum_u_xhat);
    if (needs[2]) out[2] = to_tensor(sum_u);
  }

  static Tensor to_tensor(const std::vector<double>& v) {
    Tensor t = Tensor::empty({int64_t(v.size())});
    for (size_t i = 0; i < v.size(); ++i) t.data()[i] = float(v[i]);
    return t;
  }

  void release() override {
    x_ = gate_ = Tensor();
    gate_bits_.reset();
  }

  Tensor x_;
  ChannelLayout layout_;
  std::vector<float> mean_, invstd_, gamma_;  // γ is 1 when there is no affine weight
  bool batch_statistics_;                     // training mode: μ, σ are functions of x
  Tensor gate_;
  bool gate_is_output_;
  std::unique_ptr<uint16_t[]> gate_bits_;
};

void check_channel_vector(const Tensor& t, const char* what, int64_t C, const Shape& x_shape) {
  if (!t.defined()) return;
  check(t.shape() == Shape{C}, "batch_norm: ", what, " ", t.shape(), " does not match the ", C,
        " channels of input ", x_shape);
}

// The statistics of eval mode: the running mean, and 1/sqrt(running_var + eps).
void running_statistics(const Tensor& running_mean, const Tensor& running_var, float eps, std::vector<float>& mean,
                        std::vector<float>& invstd) {
  const std::vector<float> rm = running_mean.to_vector(), rv = running_var.to_vector();
  for (size_t c = 0; c < rm.size(); ++c)
    mean[c] = rm[c], invstd[c] = float(1.0 / std::sqrt(double(rv[c]) + double(eps)));
}

// y = x·scale + shift per channel: scale = γ·invstd, shift = β − μ·scale.
ChannelAffine channel_affine(const std::vector<float>& mean, const std::vector<float>& invstd,
                             const std::vector<float>& gamma, const std::vector<float>& beta) {
  ChannelAffine a{std::vector<float>(mean.size()), std::vector<float>(mean.size())};
  for (size_t c = 0; c < mean.size(); ++c)
    std::tie(a.scale[c], a.shift[c]) = channel_scale_shift(mean[c], invstd[c], gamma[c], beta[c]);
  return a;
}

// One channel's output rows: y = x·scale + shift, + the residual, then the ReLU, in the
// separate ops' order; `pre` (when not null) receives the ReLU's input, `bits` (when not
// null) the ReLU's gate as bits, read from each row while it is in cache.
void write_channel(const float* px, const float* residual, float scale, float shift, bool relu, float* po,
                   float* pre, uint16_t* bits, const ChannelLayout& layout, int64_t c) {
  const auto [N, C, L] = layout;
  for (int64_t n = 0; n < N; ++n) {
    const int64_t row = (n * C + c) * L;
    const float *xr = px + row, *rr = residual ? residual + row : nullptr;
    float *yr = po + row, *zr = pre ? pre + row : nullptr;
    if (!rr && !relu) {
      for (int64_t l = 0; l < L; ++l) yr[l] = xr[l] * scale + shift;
    } else if (!rr) {
      for (int64_t l = 0; l < L; ++l) yr[l] = relu_value(xr[l] * scale + shift);
    } else if (!relu) {
      for (int64_t l = 0; l < L; ++l) yr[l] = xr[l] * scale + shift + rr[l];
    } else {
      for (int64_t l = 0; l < L; ++l) yr[l] = relu_value(xr[l] * scale + shift + rr[l]);
    }
    if (zr) {  // only outside a training step, for the transports that read z
      for (int64_t l = 0; l < L; ++l) zr[l] = rr ? xr[l] * scale + shift + rr[l] : xr[l] * scale + shift;
    }
    if (bits) write_gate_bits(yr, L, bits + (n * C + c) * gate_words(L));
  }
}

// ---------------------------------------------------------------------------------------
// LayerNorm. x is viewed as (M, D): M rows, each normalised over its D features.

class LayerNormNode : public Node {
public:
  LayerNormNode(Tensor x, Shape features, int64_t M, std::vector<float> mean, std::vector<float> invstd,
                std::vector<float> gamma)
      : x_(std::move(x)),
        features_(std::move(features)),
        M_(M),
        D_(numel(features_)),
        mean_(std::move(mean)),
        invstd_(std::move(invstd)),
        gamma_(std::move(gamma)) {}
  std::string name() const override { return "layer_norm"; }

  std::vector<Tensor> vjp(const Tensor& u, const Transport& t) override {
    const float *px = x_.data(), *pu = u.data();
    const int64_t M = M_, D = D_;
    const bool exact = t.is_gradient();
    const float* gamma = gamma_.data();
    Tensor dx = needs[0] ? Tensor::empty(x_.shape()) : Tensor();
    float* pd = needs[0] ? dx.data() : nullptr;
    // Row r of the input's cotangent.
    const auto input_row = [&](int64_t r) {
      const float *xr = px + r * D, *ur = pu + r * D;
      float* dr = pd + r * D;
      const float mu = mean_[r], is = invstd_[r];
      if (!exact) {  // μ, σ frozen: (γ/σ)·u
        for (int64_t j = 0; j < D; ++j) dr[j] = gamma[j] * is * ur[j];
        return;
      }
      // With g = γ·u: dx = (1/σ)·(g − mean(g) − x̂·mean(g·x̂)), means over the row. The
      // sums run in lanes: a single running double sum would wait on each add.
      const auto [sg, sgx] = lane_sums(
          D, [&](int64_t j) { return gamma[j] * ur[j]; }, [&](int64_t j) { return gamma[j] * ur[j] * ((xr[j] - mu) * is); });
      const float mean_g = float(sg / double(D)), mean_gx = float(sgx / double(D));
      for (int64_t j = 0; j < D; ++j) {
        const float xhat = (xr[j] - mu) * is;
        dr[j] = is * (gamma[j] * ur[j] - mean_g - xhat * mean_gx);
      }
    };
    std::vector<Tensor> out(3);
    if (!needs[1] && !needs[2]) {
      if (needs[0]) parallel_for(M, grain_for(D), [&](int64_t r0, int64_t r1) {
        run_widest([&] {
          for (int64_t r = r0; r < r1; ++r) input_row(r);
        });
      });
      out[0] = dx;
      return out;
    }
    {
      // Column sums over rows of u·x̂ (γ) and u (β). Each chunk of rows sums into its own
      // partial row; the partials are then added in chunk order, so the result does not
      // depend on the thread count. The input's cotangent, when needed, is made in the
      // same pass, a row while it is in cache.
      const int64_t chunks = (M + kReduceGrain - 1) / kReduceGrain;
      std::vector<double> part_gx(size_t(chunks * D), 0.0), part_g(size_t(chunks * D), 0.0);
      parallel_for(M, kReduceGrain, [&](int64_t r0, int64_t r1) {
        double *pgx = &part_gx[size_t(r0 / kReduceGrain * D)], *pg = &part_g[size_t(r0 / kReduceGrain * D)];
        run_widest([&] {  // the columns' sums side by side, a vector of doubles at a time
          for (int64_t r = r0; r < r1; ++r) {
            if (pd) input_row(r);
            const float *xr = px + r * D, *ur = pu + r * D;
            const float mu = mean_[r], is = invstd_[r];
            for (int64_t j = 0; j < D; ++j) {
              pgx[j] += double(ur[j]) * ((xr[j] - mu) * is);
              pg[j] += ur[j];
            }
          }
        });
      });
      Tensor dgamma = Tensor::zeros(features_), dbeta = Tensor::zeros(features_);
      for (int64_t c = 0; c < chunks; ++c)
        for (int64_t j = 0; j < D; ++j) {
          dgamma.data()[j] += float(part_gx[size_t(c * D + j)]);
          dbeta.data()[j] += float(part_g[size_t(c * D + j)]);
        }
      if (needs[1]) out[1] = dgamma;
      if (needs[2]) out[2] = dbeta;
    }
    out[0] = dx;
    return out;
  }

public:
  void release() override { x_ = Tensor(); }

private:
  Tensor x_;
  Shape features_;  // the normalised trailing shape (that of γ and β)
  int64_t M_, D_;
  std::vector<float> mean_, invstd_, gamma_;  // γ is 1 when there is no affine weight
};

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor running_mean,
                  Tensor running_var, bool training, float momentum, float eps, const BatchNormTail& tail) {
  check(x.defined(), "batch_norm: the input is undefined");
  check(x.dim() >= 2, "batch_norm: input ", x.shape(), " needs at least 2 dims (N, C, ...)");
  const int64_t N = x.size(0), C = x.size(1), L = x.numel() / std::max<int64_t>(N * C, 1);
  check_channel_vector(weight, "weight", C, x.shape());
  check_channel_vector(bias, "bias", C, x.shape());
  check_channel_vector(running_mean, "running_mean", C, x.shape());
  check_channel_vector(running_var, "running_var", C, x.shape());
  check(running_mean.defined() == running_var.defined(),
        "batch_norm: running_mean and running_var must be given together");
  if (!training)
    check(running_mean.defined(), "batch_norm: eval mode on input ", x.shape(), " needs running statistics");
  if (tail.residual.defined())
    check(tail.residual.shape() == x.shape(), "batch_norm: residual ", tail.residual.shape(),
          " does not match the input ", x.shape());
  const int64_t count = N * L;
  if (training)
    check(count > 1, "batch_norm: training needs more than one value per channel, input is ", x.shape());

  const Tensor xc = x.contiguous();
  const Tensor residual = tail.residual.defined() ? tail.residual.contiguous() : Tensor();
  const bool record = needs_grad({xc, weight, bias, residual});
  // The ReLU's gate for the backward pass: its output under GradientOnly (kept by the next
  // op anyway), else its input z, which the soft, guided and DeepLift rules read.
  const bool keep_pre_activation = record && tail.relu && !recording_gradient_only();
  // Under GradientOnly, also the gate as bits for the gradient's select (1/32 of the output).
  // Every word is written below, so the words start uninitialised.
  std::unique_ptr<uint16_t[]> gate_bits;
  if (record && tail.relu && !keep_pre_activation) gate_bits.reset(new uint16_t[size_t(N * C * gate_words(L))]);
  std::vector<float> gamma = values_or(weight, C, 1.0f);
  const std::vector<float> beta = values_or(bias, C, 0.0f);
  std::vector<float> mean(C), invstd(C);
  std::vector<double> var(C);
  if (!training) running_statistics(running_mean, running_var, eps, mean, invstd);
  Tensor out = Tensor::empty(x.shape()), pre = keep_pre_activation ? Tensor::empty(x.shape()) : Tensor();
  const float* px = xc.data();
  const float* pr = residual.defined() ? residual.data() : nullptr;
  float *po = out.data(), *pz = pre.defined() ? pre.data() : nullptr;
  parallel_for(C, 1, [&](int64_t c0, int64_t c1) {
    run_widest([&] {  // the passes after the first read the channel from cache
      for (int64_t c = c0; c < c1; ++c) {
        if (training) {
          const Moments m = moments(px + c * L, N, L, C * L);
          mean[c] = float(m.mean), var[c] = m.var;
          invstd[c] = float(1.0 / std::sqrt(var[c] + double(eps)));
        }
        const auto [scale, shift] = channel_scale_shift(mean[c], invstd[c], gamma[c], beta[c]);
        write_channel(px, pr, scale, shift, tail.relu, po, pz, gate_bits.get(), {N, C, L}, c);
      }
    });
  });
  if (training && running_mean.defined()) {
    check(running_mean.is_contiguous() && running_var.is_contiguous(),
          "batch_norm: running statistics must be contiguous to be updated in place");
    float *rm = running_mean.data(), *rv = running_var.data();
    const double unbias = double(count) / double(count - 1);
    for (int64_t c = 0; c < C; ++c) {
      rm[c] = (1.0f - momentum) * rm[c] + momentum * mean[c];
      rv[c] = (1.0f - momentum) * rv[c] + momentum * float(var[c] * unbias);
    }
  }

  if (record) {
    const Tensor gate = !tail.relu ? Tensor() : keep_pre_activation ? pre : out.detach();
    attach(out,
           std::make_shared<BatchNormNode>(xc.detach(), ChannelLayout{N, C, L}, std::move(mean), std::move(invstd),
                                           std::move(gamma), training, gate, !keep_pre_activation,
                                           std::move(gate_bits)),
           residual.defined() ? std::vector<Tensor>{xc, weight, bias, residual} : std::vector<Tensor>{xc, weight, bias});
  }
  return out;
}

ChannelAffine eval_batch_norm_affine(int64_t C, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                                     const Tensor& running_var, float eps) {
  const Shape shape{1, C};  // for the messages: C channels
  check_channel_vector(weight, "weight", C, shape);
  check_channel_vector(bias, "bias", C, shape);
  check(running_mean.defined() && running_var.defined(), "batch_norm: eval mode needs running statistics");
  check_channel_vector(running_mean, "running_mean", C, shape);
  check_channel_vector(running_var, "running_var", C, shape);
  std::vector<float> mean(C), invstd(C);
  running_statistics(running_mean, running_var, eps, mean, invstd);
  return channel_affine(mean, invstd, values_or(weight, C, 1.0f), values_or(bias, C, 0.0f));
}

namespace {

// w' = w·scale[o] per output channel o, scale = γ·invstd: the cotangents of w (u·scale) and
// of γ (invstd·Σ u·w over the channel's weights).
class FoldedWeightNode : public Node {
public:
  FoldedWeightNode(Tensor w, std::vector<float> scale, std::vector<float> invstd)
      : w_(std::move(w)), scale_(std::move(scale)), invstd_(std::move(invstd)) {}
  std::string name() const override { return "fold_batch_norm_weight"; }

  std::vector<Tensor> vjp(const Tensor& u_in, const Transport&) override {
    const Tensor u = u_in.contiguous();
    const int64_t O = int64_t(scale_.size()), per_channel = O > 0 ? w_.numel() / O : 0;
    std::vector<Tensor> out(needs.size());
    const bool wants_w = needs[0], wants_gamma = needs.size() > 1 && needs[1];
    if (wants_w) out[0] = Tensor::empty(w_.shape());
    if (wants_gamma) out[1] = Tensor::empty({O});
    parallel_for(O, 1, [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        const float* ur = u.data() + o * per_channel;
        if (wants_w) {
          float* dr = out[0].data() + o * per_channel;
          for (int64_t k = 0; k < per_channel; ++k) dr[k] = ur[k] * scale_[o];
        }
        if (wants_gamma) {
          const float* wr = w_.data() + o * per_channel;
          out[1].data()[o] = float(invstd_[o] * lane_sum(per_channel, [ur, wr](int64_t k) { return ur[k] * wr[k]; }));
        }
      }
    });
    return out;
  }

private:
  void release() override { w_ = Tensor(); }
  Tensor w_;
  std::vector<float> scale_, invstd_;
};

// b' = b·scale + shift per channel, shift = β − μ·scale, scale = γ·invstd: the cotangents
// of b (u·scale), γ (u·(b − μ)·invstd) and β (u).
class FoldedBiasNode : public Node {
public:
  FoldedBiasNode(std::vector<float> conv_bias, std::vector<float> mean, std::vector<float> invstd,
                 std::vector<float> scale)
      : conv_bias_(std::move(conv_bias)), mean_(std::move(mean)), invstd_(std::move(invstd)), scale_(std::move(scale)) {}
  std::string name() const override { return "fold_batch_norm_bias"; }

  std::vector<Tensor> vjp(const Tensor& u_in, const Transport&) override {
    const std::vector<float> u = u_in.to_vector();
    const size_t O = u.size();
    std::vector<float> d_bias(O), d_gamma(O);
    for (size_t o = 0; o < O; ++o) {
      d_bias[o] = u[o] * scale_[o];
      d_gamma[o] = u[o] * (conv_bias_[o] - mean_[o]) * invstd_[o];
    }
    std::vector<Tensor> out(needs.size());
    if (needs[0]) out[0] = Tensor::from_vector({int64_t(O)}, d_bias);
    if (needs.size() > 1 && needs[1]) out[1] = Tensor::from_vector({int64_t(O)}, d_gamma);
    if (needs.size() > 2 && needs[2]) out[2] = u_in.contiguous().clone();
    return out;
  }

private:
  std::vector<float> conv_bias_, mean_, invstd_, scale_;
};

}  // namespace

namespace {
// The first word of the folded weight's key among a weight's prepared forms (engine/tensor.h);
// ops/conv/prepared_weights.h numbers the convolution's forms from 0.
constexpr uint64_t kFoldedWeightForm = 1000;

struct FoldedWeight {
  Tensor weight;
  uint64_t version;  // the folded weight's own, when made
};
}  // namespace

FoldedConvolution fold_eval_batch_norm(const Tensor& conv_weight, const Tensor& conv_bias, const Tensor& weight,
                                       const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                                       float eps) {
  check(conv_weight.defined() && conv_weight.dim() >= 1, "fold_eval_batch_norm: the convolution's weight is undefined");
  const int64_t O = conv_weight.size(0);
  const ChannelAffine affine = eval_batch_norm_affine(O, weight, bias, running_mean, running_var, eps);
  check_channel_vector(conv_bias, "the convolution's bias", O, Shape{1, O});
  const Tensor w = conv_weight.contiguous();
  const std::vector<float> conv_b = values_or(conv_bias, O, 0.0f);
  // The folded weight depends on the weight, γ, the running variance and eps only. It is
  // kept with the weight (PreparedForms, engine/tensor.h) while none of them changes, so
  // that an eval-mode model's passes fold once, and the convolution's own prepared forms
  // of it (ops/conv/prepared_weights.h) are kept in turn.
  const auto identity = [](const Tensor& t) {
    return std::pair<uint64_t, uint64_t>{t.defined() ? t.impl()->storage->id() : 0, t.defined() ? t.version() : 0};
  };
  const auto [gamma_id, gamma_version] = identity(weight);
  const auto [var_id, var_version] = identity(running_var);
  uint32_t eps_bits;
  std::memcpy(&eps_bits, &eps, sizeof eps_bits);
  const auto fold = [&] {
    Tensor folded = Tensor::empty(w.shape());
    float* out = folded.data();
    const int64_t per_channel = O > 0 ? w.numel() / O : 0;
    parallel_for(O, std::max<int64_t>(1, 16384 / std::max<int64_t>(per_channel, 1)), [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        const float* wr = w.data() + o * per_channel;
        float* fr = out + o * per_channel;
        for (int64_t k = 0; k < per_channel; ++k) fr[k] = wr[k] * affine.scale[o];
      }
    });
    // A tensor counts its own bytes.
    return std::pair{std::make_shared<const FoldedWeight>(FoldedWeight{folded, folded.version()}), int64_t(0)};
  };
  std::shared_ptr<const FoldedWeight> kept =
      w.prepared<FoldedWeight>({kFoldedWeightForm, gamma_id, gamma_version, var_id, var_version, eps_bits}, fold);
  // Handed out to be read only; should anything have written it since, it is folded afresh.
  if (kept->weight.version() != kept->version) kept = fold().first;
  Tensor folded_w = kept->weight.detach(), folded_b = Tensor::empty({O});
  for (int64_t o = 0; o < O; ++o) folded_b.data()[o] = conv_b[o] * affine.scale[o] + affine.shift[o];
  if (needs_grad({conv_weight, conv_bias, weight, bias})) {
    std::vector<float> mean(O), invstd(O);
    running_statistics(running_mean, running_var, eps, mean, invstd);
    attach(folded_w, std::make_shared<FoldedWeightNode>(w.detach(), affine.scale, invstd), {w, weight});
    attach(folded_b, std::make_shared<FoldedBiasNode>(conv_b, mean, invstd, affine.scale), {conv_bias, weight, bias});
  }
  return {folded_w, folded_b};
}

Tensor layer_norm(const Tensor& x, int64_t normalized_dims, const Tensor& weight, const Tensor& bias, float eps) {
  check(x.defined(), "layer_norm: the input is undefined");
  check(normalized_dims >= 1 && normalized_dims <= x.dim(), "layer_norm: cannot normalise the last ",
        normalized_dims, " dims of input ", x.shape());
  const Shape features(x.shape().end() - normalized_dims, x.shape().end());
  for (const auto& [param, what] : {std::pair{&weight, "weight"}, std::pair{&bias, "bias"}})
    if (param->defined())
      check(param->shape() == features, "layer_norm: ", what, " ", param->shape(),
            " does not match the normalised shape ", features, " of input ", x.shape());
  const int64_t D = numel(features), M = D > 0 ? x.numel() / D : 0;

  Tensor xc = x.contiguous();
  const float* px = xc.data();
  std::vector<float> mean(M), invstd(M);
  std::vector<float> gamma = values_or(weight, D, 1.0f), beta = values_or(bias, D, 0.0f);
  Tensor out = Tensor::empty(x.shape());
  float* po = out.data();
  parallel_for(M, grain_for(D), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const Moments m = moments(px + r * D, 1, D, D);
      mean[r] = float(m.mean), invstd[r] = float(1.0 / std::sqrt(m.var + double(eps)));
      for (int64_t j = 0; j < D; ++j) po[r * D + j] = (px[r * D + j] - mean[r]) * invstd[r] * gamma[j] + beta[j];
    }
  });

  if (needs_grad({xc, weight, bias}))
    attach(out,
           std::make_shared<LayerNormNode>(xc.detach(), features, M, std::move(mean), std::move(invstd),
                                           std::move(gamma)),
           {xc, weight, bias});
  return out;
}

}  // namespace adjoint
