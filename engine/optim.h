// Optimizers and learning-rate schedules. Updates happen in place on the parameter
// tensors, outside autograd. State tensors are named so checkpoints can save them.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/module.h"

namespace adjoint {

class Optimizer {
public:
  explicit Optimizer(NamedTensors params) : params_(std::move(params)) {}
  virtual ~Optimizer() = default;
  // Applies one update from the parameters' .grad (parameters without grad are skipped).
  virtual void step() = 0;
  void zero_grad();
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  // Named state ("exp_avg.layer1.0.conv1.weight", "step") for checkpoints; set_state
  // checks every name and shape and throws naming the first mismatch.
  virtual std::map<std::string, Tensor> state() const = 0;
  virtual void set_state(const std::map<std::string, Tensor>& state) = 0;

protected:
  NamedTensors params_;
  double lr_ = 0;
};

struct SgdOptions {
  double lr = 0.1, momentum = 0.9, weight_decay = 5e-4;
  bool nesterov = false;
};

// SGD as torch.optim.SGD: decoupled from nothing; L2 weight decay added to the gradient.
class Sgd : public Optimizer {
public:
  Sgd(NamedTensors params, SgdOptions options);
  void step() override;
  std::map<std::string, Tensor> state() const override;
  void set_state(const std::map<std::string, Tensor>& state) override;

private:
  SgdOptions options_;
  std::vector<Tensor> velocity_;  // undefined until the first step, as in torch
};

struct AdamWOptions {
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.01;
};

// AdamW as torch.optim.AdamW (decoupled weight decay, bias-corrected moments).
class AdamW : public Optimizer {
public:
  AdamW(NamedTensors params, AdamWOptions options);
  void step() override;
  std::map<std::string, Tensor> state() const override;
  void set_state(const std::map<std::string, Tensor>& state) override;

private:
  AdamWOptions options_;
  std::vector<Tensor> m_, v_;
  int64_t steps_ = 0;
};

// Learning rate at `step` of `total`: linear warm-up over `warmup` steps from 0, then
// cosine decay to `min_factor`·base, or step decay by `gamma` every `step_every` steps.
struct Schedule {
  enum Kind { Constant, Cosine, Step } kind = Cosine;
  double base_lr = 0.1;
  int64_t warmup = 0;
  int64_t total = 1;
  double min_factor = 0.0;
  int64_t step_every = 1;
  double gamma = 0.1;
  double at(int64_t step) const;
};

}  // namespace adjoint
