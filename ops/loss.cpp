// cross_entropy (fused log_softmax + smoothed NLL) and mse_loss.
#include "ops/loss.h"

#include <algorithm>
#include <cmath>
#include <memory>
#include <string>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "ops/softmax.h"

namespace adjoint {

namespace {

constexpr int64_t kGrain = 16384;

// u·(softmax − target)/N, from the saved log-probabilities.
class CrossEntropyNode : public Node {
public:
  CrossEntropyNode(Tensor log_probs, std::vector<int64_t> labels, float smoothing)
      : log_probs_(std::move(log_probs)), labels_(std::move(labels)), smoothing_(smoothing) {}
  std::string name() const override { return "cross_entropy"; }
  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override {
    const int64_t n = log_probs_.size(0), c = log_probs_.size(1);
    const float scale = u.item() / float(n);
    const float off = smoothing_ / float(c);   // target mass on every class
    const float on = 1.0f - smoothing_ + off;  // ... and on the label's class
    Tensor g = Tensor::empty(log_probs_.shape());
    const float* lp = log_probs_.data();
    float* pg = g.data();
    parallel_for(n, std::max<int64_t>(1, kGrain / std::max<int64_t>(c, 1)), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        for (int64_t k = 0; k < c; ++k) pg[i * c + k] = scale * (std::exp(lp[i * c + k]) - off);
        pg[i * c + labels_[i]] -= scale * (on - off);
      }
    });
    return {g};
  }

private:
  Tensor log_probs_;  // (N, C), detached
  std::vector<int64_t> labels_;
  float smoothing_;
};

// u·2(a − b)/n for a and its negative for b.
class MseNode : public Node {
public:
  explicit MseNode(Tensor diff) : diff_(std::move(diff)) {}
  std::string name() const override { return "mse_loss"; }
  std::vector<Tensor> vjp(const Tensor& u, const Transport&) override {
    const float scale = 2.0f * u.item() / float(diff_.numel());
    std::vector<Tensor> result(2);
    for (int side = 0; side < 2; ++side) {
      if (!needs[side]) continue;
      const float s = side == 0 ? scale : -scale;
      Tensor g = Tensor::empty(diff_.shape());
      const float* pd = diff_.data();
      float* pg = g.data();
      parallel_for(g.numel(), kGrain, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) pg[i] = s * pd[i];
      });
      result[side] = g;
    }
    return result;
  }

private:
  Tensor diff_;  // a − b, detached
};

}  // namespace

Tensor cross_entropy(const Tensor& logits, const std::vector<int64_t>& labels, float label_smoothing) {
  check(logits.dim() == 2, "cross_entropy: logits must be (N, C), got ", logits.shape());
  const int64_t n = logits.size(0), c = logits.size(1);
  check(n > 0 && c > 0, "cross_entropy: empty logits ", logits.shape());
  check(int64_t(labels.size()) == n, "cross_entropy: ", labels.size(), " labels for logits ", logits.shape());
  check(label_smoothing >= 0.0f && label_smoothing <= 1.0f, "cross_entropy: label_smoothing ", label_smoothing,
        " is outside [0, 1]");
  for (int64_t i = 0; i < n; ++i)
    check(labels[i] >= 0 && labels[i] < c, "cross_entropy: label ", labels[i], " at index ", i, " is out of range for ",
          c, " classes (logits ", logits.shape(), ")");

  Tensor log_probs;
  {
    NoGrad no_grad;  // the fused node below is the only record
    log_probs = log_softmax(logits.detach(), 1);
  }
  const float* lp = log_probs.data();
  const double eps = label_smoothing;
  double total = 0;  // in a fixed order: the batch is small next to the work in the logits
  for (int64_t i = 0; i < n; ++i) {
    double row = 0;
    if (eps > 0)
      for (int64_t k = 0; k < c; ++k) row += lp[i * c + k];
    total -= (1.0 - eps) * lp[i * c + labels[i]] + eps / double(c) * row;
  }
  Tensor out = Tensor::scalar(float(total / double(n)));
  if (needs_grad({logits}))
    attach(out, std::make_shared<CrossEntropyNode>(log_probs, labels, label_smoothing), {logits});
  return out;
}

Tensor mse_loss(const Tensor& a_in, const Tensor& b_in) {
  check(a_in.shape() == b_in.shape(), "mse_loss: shapes ", a_in.shape(), " and ", b_in.shape(), " differ");
  check(a_in.numel() > 0, "mse_loss: empty inputs ", a_in.shape());
  const Tensor a = a_in.detach().contiguous(), b = b_in.detach().contiguous();
  Tensor diff = Tensor::empty(a.shape());
  const float *pa = a.data(), *pb = b.data();
  float* pd = diff.data();
  const int64_t n = a.numel();
  // Per-chunk partial sums in double, added in chunk order: independent of the thread count.
  const int64_t chunks = (n + kGrain - 1) / kGrain;
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
  parallel_for(n, kGrain, [&](int64_t begin, int64_t end) {
    double s = 0;
    for (int64_t i = begin; i < end; ++i) {
      pd[i] = pa[i] - pb[i];
      s += double(pd[i]) * pd[i];
    }
    partial[begin / kGrain] = s;
  });
  double total = 0;
  for (double s : partial) total += s;
  Tensor out = Tensor::scalar(float(total / double(n)));
  if (needs_grad({a_in, b_in})) attach(out, std::make_shared<MseNode>(diff), {a_in, b_in});
  return out;
}

}  // namespace adjoint
