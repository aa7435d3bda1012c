// Module: a named collection of parameters, buffers and sub-modules. Names are dotted
// paths ("layer1.0.conv1.weight") so state dicts match torchvision/timm naming.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tensor.h"

namespace adjoint {

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

class Module {
public:
  virtual ~Module() = default;

  // Registers a leaf that requires grad (the optimizer updates it in place).
  Tensor register_parameter(const std::string& name, Tensor value);
  // Registers state that is saved but not trained (BatchNorm running statistics).
  Tensor register_buffer(const std::string& name, Tensor value);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    children_.emplace_back(name, module);
    return module;
  }

  NamedTensors named_parameters() const;  // recursive, in registration order
  NamedTensors named_buffers() const;
  std::vector<Tensor> parameters() const;
  // Parameters and buffers by name, as torch's state_dict().
  std::map<std::string, Tensor> state_dict() const;
  const std::vector<std::pair<std::string, std::shared_ptr<Module>>>& children() const { return children_; }

  // Training mode switches BatchNorm to batch statistics and enables dropout.
  void train(bool on = true);
  bool training() const { return training_; }
  void zero_grad();
  // Freezes the module for analysis (stitching, IRIs, adversarial attacks, explanations):
  // eval mode, so BatchNorm reads its running statistics and dropout is off, and no
  // parameter asks for a gradient any more, so a backward pass to the inputs computes no
  // weight gradient and no optimizer can move it. Parameters are not copied: a model
  // shared with other code is frozen for it too.
  void freeze();

private:
  void collect(const std::string& prefix, bool buffers, NamedTensors& out) const;

  NamedTensors parameters_;
  NamedTensors buffers_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
  bool training_ = true;
};

}  // namespace adjoint
