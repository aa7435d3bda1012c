// Define-by-run autograd. Each op that records attaches a Node to its output; the Node
// keeps an edge to each input and whatever forward state it needs, and maps the output's
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

class Node;

// One input of a node as the graph sees it: where the input's cotangent goes, not its
// values. Keeping the input tensor itself would keep every intermediate activation alive
// until backward; each op saves exactly the values its vjp reads instead.
struct Edge {
  std::shared_ptr<Node> node;        // the input's history, when it is an op output in a graph
  std::shared_ptr<TensorImpl> leaf;  // the input itself, when it is a leaf that requires grad
  Shape shape;

  Edge() = default;
  explicit Edge(const Tensor& input);
  // Some cotangent can flow to this input (it is a graph output or a grad-requiring leaf).
  bool requires_grad() const { return node || leaf; }
  // Identity of the input for the transport: its node, or its leaf's impl.
  const void* key() const { return node ? static_cast<const void*>(node.get()) : static_cast<const void*>(leaf.get()); }
};

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

  std::vector<Edge> inputs;
  bool released = false;  // set once backward() has consumed this node
  std::vector<bool> needs;  // needs[i]: some cotangent must reach inputs[i]; set before vjp
};

// Sets a per-thread switch for a scope and restores its previous value at exit; the
// scopes below are the engine's two switches.
class ScopedSwitch {
public:
  ScopedSwitch(const ScopedSwitch&) = delete;
  ScopedSwitch& operator=(const ScopedSwitch&) = delete;

protected:
  ScopedSwitch(bool& setting, bool value) : setting_(setting), previous_(setting) { setting = value; }
  ~ScopedSwitch() { setting_ = previous_; }

private:
  bool& setting_;
  bool previous_;
};

// Recording switch (per thread). NoGrad turns it off for a scope.
bool grad_enabled();
class NoGrad : ScopedSwitch {
public:
  NoGrad();
};

// What a recorded graph will be transported by. A training step only ever takes the exact
// gradient, so inside a GradientOnly scope ops may keep less state (a ReLU keeps its
// output, which the next op keeps anyway, instead of its input). A graph recorded there
// refuses the transports that would need the dropped values, with an error saying so.
bool recording_gradient_only();
class GradientOnly : ScopedSwitch {
public:
  GradientOnly();
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
// tensors of the graph; zeros where nothing reaches) and touches no .grad. The graph is
// kept for another pass unless keep_graph is false (then it is freed on the way, as
// backward does).
std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& wrt,
                         const Tensor& cotangent = {}, const Transport& transport = {}, bool keep_graph = true);

// Called by grad() with the index i of wrt[i] and its final cotangent (the value grad()
// returns for it), as soon as nothing more will be added to it: for a leaf, right after
// the last node with an edge into it has run, while backward goes on through the nodes
// nearer the inputs (a network's early layers finish last). Once per index; an input that
// nothing reaches gets its zeros at the end. Runs on the thread that called grad(), so a
// caller can start work on a finished gradient (send it to other processes, say) while the
// rest of backward runs.
using GradientReady = std::function<void(size_t index, const Tensor& gradient)>;
std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& wrt, const GradientReady& on_ready,
                         const Tensor& cotangent = {}, const Transport& transport = {}, bool keep_graph = true);

// Functional form: evaluates f at fresh leaves holding `primals`' values and returns the
// input cotangents of `cotangent` under `transport`. Parameters' .grad are untouched.
std::vector<Tensor> vjp(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                        const std::vector<Tensor>& primals, const Tensor& cotangent,
                        const Transport& transport = {});

}  // namespace adjoint
