#include "engine/autograd.h"
#include "engine/recording_scope.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "engine/backward_hooks.h"
#include "engine/error.h"
#include "engine/threads.h"

namespace adjoint {

const char* to_string(TransportKind kind) {
  switch (kind) {
    case TransportKind::Gradient: return "gradient";
    case TransportKind::Pullback: return "pullback";
    case TransportKind::SoftPullback: return "soft_pullback";
    case TransportKind::Guided: return "guided";
    case TransportKind::DeepLift: return "deeplift";
  }
  return "?";
}

namespace {
thread_local bool recording = true;
thread_local bool gradient_only = false;

// Sums b into a (allocating a when it is empty). Its own loop: the engine's add op would
// record, and this runs with recording off anyway.
void accumulate(Tensor& a, const Tensor& b) {
  if (!a.defined()) {
    a = b.is_contiguous() ? b : b.contiguous();
    return;
  }
  // Never add in place into memory someone else sees: another handle on the same tensor
  // (a node may pass its cotangent through unchanged, as a residual connection's does) or a
  // view of the same storage. Then the sum goes to new memory, in the same single pass.
  const bool shared = a.impl_ptr().use_count() > 1 || a.impl()->storage.use_count() > 1;
  Tensor sum = shared ? Tensor::empty(a.shape()) : a;
  Tensor bc = b.contiguous();
  const float *pa = a.data(), *pb = bc.data();
  float* ps = sum.data();
  parallel_for(a.numel(), 1 << 16, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) ps[i] = pa[i] + pb[i];
  });
  a = sum;
}

// Where a tensor's cotangent is kept: its node for op outputs, its impl for leaves.
const void* key_of(const Tensor& t) {
  return t.grad_fn() ? static_cast<const void*>(t.grad_fn().get()) : static_cast<const void*>(t.impl());
}

// Runs the transport. `wanted` holds the keys whose cotangents the caller needs (leaves
// or nodes); `deliver` receives their cotangents: a node's once, final; a leaf's in parts,
// one per edge into it, to be summed. `hooks` (engine/backward_hooks.h), when set, are told
// the plan and each node's turn.
void run(const Tensor& output, const Tensor& cotangent, const Transport& transport,
         const std::unordered_set<const void*>& wanted,
         const std::function<void(const void*, const Tensor&)>& deliver, bool release_graph,
         const BackwardHooks& hooks = {}) {
  check(output.defined(), "backward: the output tensor is undefined");
  Tensor seed = cotangent;
  if (!seed.defined()) {
    check(output.numel() == 1, "backward: an output of shape ", output.shape(),
          " needs an explicit cotangent (only one-element outputs default to 1)");
    seed = Tensor::ones(output.shape());
  }
  check(seed.shape() == output.shape(), "backward: cotangent shape ", seed.shape(),
        " differs from output shape ", output.shape());
  if (!output.grad_fn()) {  // the output is itself a leaf
    if (wanted.count(output.impl())) deliver(output.impl(), seed);
    return;
  }

  // Reverse topological order by iterative depth-first search. `order` owns its nodes:
  // releasing a node lets go of its inputs, which may hold the last reference to a node
  // still to be processed.
  std::vector<std::shared_ptr<Node>> order;
  std::unordered_set<Node*> seen;
  std::vector<std::pair<std::shared_ptr<Node>, size_t>> stack{{output.grad_fn(), 0}};
  seen.insert(output.grad_fn().get());
  while (!stack.empty()) {
    auto& [node, next] = stack.back();
    if (node->released)
      throw Error(cat("backward: the graph through ", node->name(),
                      " was already consumed by backward(); run the forward again (grad() and vjp() keep the graph)"));
    if (next < node->inputs.size()) {
      const std::shared_ptr<Node>& child = node->inputs[next++].node;
      if (child && seen.insert(child.get()).second) stack.push_back({child, 0});
    } else {
      order.push_back(node);
      stack.pop_back();
    }
  }
  // `order` is post-order (inputs before users); a node reaches a wanted key when it is
  // wanted itself or any input does.
  std::unordered_set<const void*> reaches;
  for (const auto& owned : order) {
    Node* node = owned.get();
    bool any = wanted.count(node) > 0;
    node->needs.assign(node->inputs.size(), false);
    for (size_t i = 0; i < node->inputs.size(); ++i) {
      const Edge& in = node->inputs[i];
      if (!in.requires_grad()) continue;
      if (wanted.count(in.key()) || reaches.count(in.key())) node->needs[i] = any = true;
    }
    if (any) reaches.insert(node);
  }
  if (hooks.planned) hooks.planned(order);

  NoGrad no_grad;
  std::unordered_map<const void*, Tensor> pending{{output.grad_fn().get(), seed}};
  // Transports the cotangent through one node (if any reaches it) to its inputs.
  auto transport_through = [&](Node* node) {
    auto found = pending.find(node);
    if (found == pending.end()) return;  // nothing flows through this node
    Tensor cot = std::move(found->second);
    pending.erase(found);
    if (wanted.count(node)) deliver(node, cot);
    if (!reaches.count(node)) return;
    bool any_need = std::any_of(node->needs.begin(), node->needs.end(), [](bool b) { return b; });
    if (!any_need) return;
    std::vector<Tensor> cots = node->vjp(cot, transport);
    check(cots.size() == node->inputs.size(), "backward: ", node->name(), " returned ", cots.size(),
          " cotangents for ", node->inputs.size(), " inputs");
    for (size_t i = 0; i < cots.size(); ++i) {
      if (!node->needs[i] || !cots[i].defined()) continue;
      const Edge& in = node->inputs[i];
      check(cots[i].shape() == in.shape, "backward: ", node->name(), " returned a cotangent of shape ",
            cots[i].shape(), " for input ", i, " of shape ", in.shape);
      if (in.node) accumulate(pending[in.key()], cots[i]);
      else deliver(in.key(), cots[i]);
    }
    if (release_graph) {
      node->release();
      node->inputs.clear();
      node->released = true;
    }
  };
  for (auto it = order.rbegin(); it != order.rend(); ++it) {
    transport_through(it->get());
    if (hooks.ran) hooks.ran(it->get());
  }
}

}  // namespace

bool grad_enabled() { return recording; }
NoGrad::NoGrad() : ScopedSwitch(recording, false) {}
bool recording_gradient_only() { return gradient_only; }
GradientOnly::GradientOnly() : ScopedSwitch(gradient_only, true) {}

namespace {
thread_local const TensorImpl* recording_for = nullptr;  // the RecordingFor scope's leaf, if any
}  // namespace

RecordingFor::RecordingFor(const Tensor& leaf) : previous_(recording_for) { recording_for = leaf.impl(); }
RecordingFor::~RecordingFor() { recording_for = previous_; }

bool takes_part(const Tensor& t) {
  if (!t.requires_grad()) return false;
  return t.grad_fn() || !recording_for || t.impl() == recording_for;
}

bool needs_grad(std::initializer_list<Tensor> inputs) {
  if (!recording) return false;
  for (const Tensor& t : inputs)
    if (takes_part(t)) return true;
  return false;
}
bool needs_grad(const std::vector<Tensor>& inputs) {
  if (!recording) return false;
  for (const Tensor& t : inputs)
    if (takes_part(t)) return true;
  return false;
}

Edge::Edge(const Tensor& input) {
  if (!input.defined()) return;
  shape = input.shape();
  if (input.grad_fn()) node = input.grad_fn();
  else if (takes_part(input)) leaf = input.impl_ptr();
}

void attach(Tensor& out, std::shared_ptr<Node> node, std::vector<Tensor> inputs) {
  node->inputs.clear();
  for (const Tensor& in : inputs) node->inputs.emplace_back(in);
  out.impl()->grad_fn = std::move(node);
}

void backward(const Tensor& output, const Tensor& cotangent, const Transport& transport) {
  // Every leaf that requires grad is wanted; collect them from the graph.
  std::unordered_set<const void*> leaves;
  std::unordered_map<const void*, TensorImpl*> impl_of;
  std::vector<Node*> stack;
  std::unordered_set<Node*> seen;
  if (output.defined() && output.grad_fn()) {
    stack.push_back(output.grad_fn().get());
    seen.insert(stack.back());
  } else if (output.defined() && output.requires_grad()) {
    leaves.insert(output.impl());
    impl_of[output.impl()] = output.impl();
  }
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    for (const Edge& in : node->inputs) {
      if (in.node) {
        if (seen.insert(in.node.get()).second) stack.push_back(in.node.get());
      } else if (in.leaf) {
        leaves.insert(in.leaf.get());
        impl_of[in.leaf.get()] = in.leaf.get();
      }
    }
  }
  run(
      output, cotangent, transport, leaves,
      [&](const void* key, const Tensor& cot) {
        TensorImpl* leaf = impl_of.at(key);
        Tensor g(leaf->grad);
        accumulate(g, cot);
        leaf->grad = g.impl_ptr();
      },
      /*release_graph=*/true);
}

std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& wrt, const Tensor& cotangent,
                         const Transport& transport, bool keep_graph) {
  return grad(output, wrt, GradientReady{}, cotangent, transport, keep_graph);
}

std::vector<Tensor> grad(const Tensor& output, const std::vector<Tensor>& wrt, const GradientReady& on_ready,
                         const Tensor& cotangent, const Transport& transport, bool keep_graph) {
  std::unordered_set<const void*> wanted;
  std::unordered_map<const void*, std::vector<size_t>> indices_of;  // an input may be given twice
  for (size_t i = 0; i < wrt.size(); ++i) {
    check(wrt[i].defined(), "grad: an undefined tensor among the inputs to differentiate");
    wanted.insert(key_of(wrt[i]));
    indices_of[key_of(wrt[i])].push_back(i);
  }
  std::vector<Tensor> result(wrt.size());
  std::unordered_map<const void*, Tensor> got;
  BackwardHooks hooks;
  if (on_ready)
    hooks = final_cotangent_hooks(wanted, [&](const void* key) {
      for (size_t i : indices_of.at(key)) {
        auto it = got.find(key);
        result[i] = it == got.end() ? Tensor::zeros(wrt[i].shape()) : it->second;
        on_ready(i, result[i]);
      }
    });
  run(
      output, cotangent, transport, wanted, [&](const void* key, const Tensor& cot) { accumulate(got[key], cot); },
      /*release_graph=*/!keep_graph, hooks);
  for (size_t i = 0; i < wrt.size(); ++i) {  // those no node reached (or the output itself), in order
    if (result[i].defined()) continue;
    auto it = got.find(key_of(wrt[i]));
    result[i] = it == got.end() ? Tensor::zeros(wrt[i].shape()) : it->second;
    if (on_ready) on_ready(i, result[i]);
  }
  return result;
}

std::vector<Tensor> vjp(const std::function<Tensor(const std::vector<Tensor>&)>& f,
                        const std::vector<Tensor>& primals, const Tensor& cotangent,
                        const Transport& transport) {
  std::vector<Tensor> leaves;
  for (const Tensor& p : primals) {
    Tensor leaf = p.detach();
    leaf.requires_grad_();
    leaves.push_back(leaf);
  }
  Tensor out = f(leaves);
  return grad(out, leaves, cotangent, transport);
}

}  // namespace adjoint
