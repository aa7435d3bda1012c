#include "analysis/common/input_search.h"

#include <algorithm>
#include <cmath>
#include <memory>

#include "engine/autograd.h"
#include "engine/error.h"
#include "engine/threads.h"
#include "ops/reduce.h"

namespace adjoint {

namespace {

// One step rule: moves x (contiguous, owning its storage) downhill along the loss's
// cotangent g, in place. Projection and clamping are the loop's.
class StepRule {
public:
  virtual ~StepRule() = default;
  virtual void descend(Tensor& x, const Tensor& g, float step) = 0;
};

// x ← x − α·g/‖g‖₂ for every example (row of the batch).
class NormalisedL2 : public StepRule {
public:
  void descend(Tensor& x, const Tensor& g, float step) override {
    const Tensor d = g.contiguous();
    const int64_t N = x.size(0), D = N > 0 ? x.numel() / N : 0;
    const float* pd = d.data();
    float* px = x.data();
    parallel_for(N, 1, [&](int64_t begin, int64_t end) {
      for (int64_t n = begin; n < end; ++n) {
        double norm2 = 0;
        for (int64_t i = n * D; i < (n + 1) * D; ++i) norm2 += double(pd[i]) * pd[i];
        const float scale = norm2 > 0 ? static_cast<float>(-step / std::sqrt(norm2)) : 0.0f;
        for (int64_t i = n * D; i < (n + 1) * D; ++i) px[i] += scale * pd[i];
      }
    });
  }
};

// x ← x − α·sign(g) per pixel; a pixel whose cotangent is zero stays (sign(0) = 0, as torch).
class SignStep : public StepRule {
public:
  void descend(Tensor& x, const Tensor& g, float step) override {
    const Tensor d = g.contiguous();
    const float* pd = d.data();
    float* px = x.data();
    parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) px[i] -= step * float((pd[i] > 0) - (pd[i] < 0));
    });
  }
};

class Adam : public StepRule {
public:
  void descend(Tensor& x, const Tensor& g, float step) override {
    if (!m_.defined()) m_ = Tensor::zeros(x.shape()), v_ = Tensor::zeros(x.shape());
    ++t_;
    const double c1 = 1.0 - std::pow(kBeta1, double(t_)), c2 = 1.0 - std::pow(kBeta2, double(t_));
    const Tensor gc = g.contiguous();
    const float* pg = gc.data();
    float *px = x.data(), *pm = m_.data(), *pv = v_.data();
    parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        pm[i] = float(kBeta1 * pm[i] + (1 - kBeta1) * pg[i]);
        pv[i] = float(kBeta2 * pv[i] + (1 - kBeta2) * double(pg[i]) * pg[i]);
        px[i] -= float(step * (pm[i] / c1) / (std::sqrt(pv[i] / c2) + 1e-8));
      }
    });
  }

private:
  static constexpr double kBeta1 = 0.9, kBeta2 = 0.999;
  Tensor m_, v_;
  int64_t t_ = 0;
};

struct RuleEntry {
  const char* name;
  std::unique_ptr<StepRule> (*make)();
};
const RuleEntry kRules[] = {
    {"l2", [] { return std::unique_ptr<StepRule>(new NormalisedL2); }},
    {"sign", [] { return std::unique_ptr<StepRule>(new SignStep); }},
    {"adam", [] { return std::unique_ptr<StepRule>(new Adam); }},
};

std::unique_ptr<StepRule> make_rule(const std::string& name) {
  for (const RuleEntry& r : kRules)
    if (name == r.name) return r.make();
  std::string names;
  for (const RuleEntry& r : kRules) names += cat(names.empty() ? "" : ", ", r.name);
  throw UsageError(cat("unknown input step rule '", name, "'; rules: ", names));
}

void clamp_into(Tensor& x, const InputRange& range) {
  float* p = x.data();
  parallel_for(x.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) p[i] = std::clamp(p[i], range.lo, range.hi);
  });
}

}  // namespace

InputSearchResult minimise_per_example(const std::function<Tensor(const Tensor&)>& losses, const Tensor& x0,
                                       const InputSearchOptions& o) {
  check(o.steps >= 0, "input search: the number of steps must be non-negative, got ", o.steps);
  check(o.step > 0, "input search: the step must be positive, got ", o.step);
  check(x0.defined() && x0.dim() >= 1 && x0.size(0) > 0, "input search: expects a non-empty batch");
  std::unique_ptr<StepRule> rule = make_rule(o.rule);
  const int64_t N = x0.size(0), D = x0.numel() / N;
  Tensor x = x0.contiguous().clone();
  if (o.clamp) clamp_into(x, o.range);
  InputSearchResult r{x.clone(), {}, {}};
  if (o.keep_best) r.best_loss.assign(size_t(N), INFINITY);
  // Without keep_best the last iterate is returned unevaluated.
  const int64_t evaluations = o.keep_best ? o.steps + 1 : o.steps;
  for (int64_t step = 0; step < evaluations; ++step) {
    Tensor leaf = x.detach();
    leaf.requires_grad_();
    const Tensor loss = losses(leaf);
    check(loss.numel() == N, "input search: the loss gave ", loss.shape(), " for a batch of ", N);
    const std::vector<float> values = loss.to_vector();
    if (step == 0) r.start_loss.assign(values.begin(), values.end());
    if (o.keep_best)
      for (int64_t n = 0; n < N; ++n)
        if (values[size_t(n)] < r.best_loss[size_t(n)]) {
          r.best_loss[size_t(n)] = values[size_t(n)];
          std::copy(x.data() + n * D, x.data() + (n + 1) * D, r.best.data() + n * D);
        }
    if (step == o.steps) break;
    // Examples are independent (eval mode), so the cotangent of the sum is each example's own.
    const Tensor g = grad(sum(loss), {leaf}, {}, o.transport, false)[0];
    rule->descend(x, g, o.step);
    if (o.project) o.project(x);
    if (o.clamp) clamp_into(x, o.range);
  }
  if (!o.keep_best) r.best = x;
  return r;
}

}  // namespace adjoint
