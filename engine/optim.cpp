#include "engine/optim.h"

#include <cmath>

#include "engine/error.h"
#include "engine/threads.h"

namespace adjoint {

void Optimizer::zero_grad() {
  for (auto& [name, p] : params_) p.zero_grad();
}

namespace {

// Both optimizers apply an elementwise rule to (param, grad, state...) in parallel.
template <class Rule>
void for_each_element(int64_t n, Rule rule) {
  parallel_for(n, 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) rule(i);
  });
}

// Stores `tensors` under prefix + parameter name, skipping undefined ones.
void export_state(const std::string& prefix, const NamedTensors& params, const std::vector<Tensor>& tensors,
                  std::map<std::string, Tensor>& out) {
  for (size_t i = 0; i < params.size(); ++i)
    if (tensors[i].defined()) out[prefix + params[i].first] = tensors[i];
}

void import_state(const std::string& prefix, const NamedTensors& params, std::vector<Tensor>& tensors,
                  const std::map<std::string, Tensor>& in) {
  for (size_t i = 0; i < params.size(); ++i) {
    auto it = in.find(prefix + params[i].first);
    if (it == in.end()) {
      tensors[i] = Tensor();
      continue;
    }
    check(it->second.shape() == params[i].second.shape(), "optimizer state '", it->first, "' has shape ",
          it->second.shape(), " but the parameter has shape ", params[i].second.shape());
    tensors[i] = it->second.clone();
  }
}

}  // namespace

Sgd::Sgd(NamedTensors params, SgdOptions options)
    : Optimizer(std::move(params)), options_(options), velocity_(params_.size()) {
  lr_ = options.lr;
}

void Sgd::step() {
  const float lr = float(lr_), mu = float(options_.momentum), wd = float(options_.weight_decay);
  for (size_t k = 0; k < params_.size(); ++k) {
    Tensor& p = params_[k].second;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    g = g.contiguous();
    const bool first = !velocity_[k].defined();
    if (first && mu != 0) velocity_[k] = Tensor::empty(p.shape());
    float* w = p.data();
    const float* gr = g.data();
    float* v = mu != 0 ? velocity_[k].data() : nullptr;
    const bool nesterov = options_.nesterov;
    for_each_element(p.numel(), [&](int64_t i) {
      float d = gr[i] + wd * w[i];
      if (v) {
        v[i] = first ? d : mu * v[i] + d;  // torch: the first buffer is the gradient itself
        d = nesterov ? d + mu * v[i] : v[i];
      }
      w[i] -= lr * d;
    });
  }
}

std::map<std::string, Tensor> Sgd::state() const {
  std::map<std::string, Tensor> out;
  export_state("momentum.", params_, velocity_, out);
  return out;
}

void Sgd::set_state(const std::map<std::string, Tensor>& state) { import_state("momentum.", params_, velocity_, state); }

AdamW::AdamW(NamedTensors params, AdamWOptions options)
    : Optimizer(std::move(params)), options_(options), m_(params_.size()), v_(params_.size()) {
  lr_ = options.lr;
}

void AdamW::step() {
  ++steps_;
  const double bc1 = 1 - std::pow(options_.beta1, double(steps_));
  const double bc2 = 1 - std::pow(options_.beta2, double(steps_));
  const float b1 = float(options_.beta1), b2 = float(options_.beta2);
  const float step_size = float(lr_ / bc1), root_bc2 = float(std::sqrt(bc2)), eps = float(options_.eps);
  const float decay = float(1 - lr_ * options_.weight_decay);
  for (size_t k = 0; k < params_.size(); ++k) {
    Tensor& p = params_[k].second;
    Tensor g = p.grad();
    if (!g.defined()) continue;
    g = g.contiguous();
    if (!m_[k].defined()) m_[k] = Tensor::zeros(p.shape()), v_[k] = Tensor::zeros(p.shape());
    float *w = p.data(), *m = m_[k].data(), *v = v_[k].data();
    const float* gr = g.data();
    for_each_element(p.numel(), [&](int64_t i) {
      w[i] *= decay;
      m[i] = b1 * m[i] + (1 - b1) * gr[i];
      v[i] = b2 * v[i] + (1 - b2) * gr[i] * gr[i];
      w[i] -= step_size * m[i] / (std::sqrt(v[i]) / root_bc2 + eps);
    });
  }
}

std::map<std::string, Tensor> AdamW::state() const {
  std::map<std::string, Tensor> out;
  export_state("exp_avg.", params_, m_, out);
  export_state("exp_avg_sq.", params_, v_, out);
  out["step"] = Tensor::scalar(float(steps_));
  return out;
}

void AdamW::set_state(const std::map<std::string, Tensor>& state) {
  import_state("exp_avg.", params_, m_, state);
  import_state("exp_avg_sq.", params_, v_, state);
  auto it = state.find("step");
  steps_ = it == state.end() ? 0 : int64_t(it->second.item());
}

double Schedule::at(int64_t step) const {
  if (warmup > 0 && step < warmup) return base_lr * double(step + 1) / double(warmup);
  switch (kind) {
    case Constant: return base_lr;
    case Step: return base_lr * std::pow(gamma, double((step - warmup) / std::max<int64_t>(step_every, 1)));
    case Cosine: {
      const double span = double(std::max<int64_t>(total - warmup, 1));
      const double t = std::min(1.0, double(step - warmup) / span);
      return base_lr * (min_factor + (1 - min_factor) * 0.5 * (1 + std::cos(M_PI * t)));
    }
  }
  return base_lr;
}

}  // namespace adjoint
