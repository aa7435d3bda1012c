// Define-by-run autograd. Each op that records attaches a Node to its output; the Node
// keeps the op's inputs and whatever forward state it needs, and maps the output's
// cotangent to the inputs' cotangents under a chosen transport.
#pragma once
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "engine/tensor.h"
#include "engine/transport.h"

namespace adjoint {

class Node {
public:
  virtual ~Node() = default;
  virtual std::string name() const = 0;
  // Cotangents for each of `inputs`, in order, each of its input's shape; an undefined
  // Tensor stands for "nothing flows there" (and must be returned where needs[i] is false
  // if the op wants to skip the work). Runs with recording off.
  virtual std::vector<Tensor> vjp(const Tensor& cotangent, const Transport& transport) = 0;
  // Drops the forward state kept for vjp. backward() calls it (and lets go of `inputs`)
  // as soon as a node has passed its cotangents on, so activations are freed during the
  // backward pass, as in PyTorch; the graph cannot be transported again afterwards.
  virtual void release() {}

  std::vector<Tensor> inputs;
  bool released = false;  // set once backward() has consumed this node
  std::vector<bool> needs;  // needs[i]: some cotangent must reach inputs[i]; set before vjp
};

// Recording switch (per thread). NoGrad turns it off for a scope.
bool grad_enabled();
class NoGrad {
public:
  NoGrad();
  ~NoGrad();
  NoGrad(const NoGrad&) = delete;
  NoGrad& operator=(const NoGrad&) = delete;

private:
  bool previous_;
};

// True when recording is on and some input takes part in a graph: ops build their Node
// (and save state) only then.
bool needs_grad(std::initializer_list<Tensor> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Makes `node` the history of `out`, with `inputs` as its inputs.
void attach(Tensor& out, std::shared_ptr<Node> node, std::vector<Tensor> inputs);

// Transports `cotangent` (ones for a one-element output when undefined) from `output` back
// through the graph and accumulates the result into the .grad of every leaf that requires
// grad (parameters and inputs). Frees the graph's saved state on the way: run the forward
// again for a second pass (grad() and vjp() keep the graph).
void backward(const Tensor& output, const Tensor& cotangent = {}, const Transport& transport = {});

// Like backward, but returns the cotangents that reach `wrt` (leaves or intermediate
// tensors of the graph; zeros where nothing reaches) and touches no .grad.
std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& wrt,
                         const Tensor& cotangent = {}, const Transport& transport = {});

// Functional form: evaluates f at fresh leaves holding `primals`' values and returns the
// input cotangents of `cotangent` under `transport`. Parameters' .grad are untouched.
std::vector<Tensor> vjp(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                        const std::vector<Tensor>& primals, const Tensor& cotangent,
                        const Transport& transport = {});

}  // namespace adjoint
