#include "engine/module.h"

#include "engine/error.h"

namespace adjoint {

Tensor Module::register_parameter(const std::string& name, Tensor value) {
  check(value.defined(), "Module: parameter '", name, "' is undefined");
  value.requires_grad_(true);
  parameters_.emplace_back(name, value);
  return value;
}

Tensor Module::register_buffer(const std::string& name, Tensor value) {
  check(value.defined(), "Module: buffer '", name, "' is undefined");
  buffers_.emplace_back(name, value);
  return value;
}

void Module::collect(const std::string& prefix, bool buffers, NamedTensors& out) const {
  for (const auto& [name, t] : buffers ? buffers_ : parameters_) out.emplace_back(prefix + name, t);
  for (const auto& [name, child] : children_) child->collect(prefix + name + ".", buffers, out);
}

NamedTensors Module::named_parameters() const {
  NamedTensors out;
  collect("", false, out);
  return out;
}

NamedTensors Module::named_buffers() const {
  NamedTensors out;
  collect("", true, out);
  return out;
}

std::vector<Tensor> Module::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, t] : named_parameters()) out.push_back(t);
  return out;
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> out;
  for (auto& [name, t] : named_parameters()) out.emplace(name, t);
  for (auto& [name, t] : named_buffers()) out.emplace(name, t);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [name, child] : children_) child->train(on);
}

void Module::freeze() {
  train(false);
  for (auto& [name, t] : named_parameters()) t.requires_grad_(false);
}

void Module::zero_grad() {
  for (auto& [name, t] : named_parameters()) t.zero_grad();
}

}  // namespace adjoint
