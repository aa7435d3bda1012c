#include "engine/backward_hooks.h"

#include <unordered_map>

namespace adjoint {

BackwardHooks final_cotangent_hooks(const std::unordered_set<const void*>& wanted,
                                    std::function<void(const void* key)> final) {
  struct State {
    std::unordered_set<const void*> wanted, finished;
    // The wanted leaves whose last edge (in the order the nodes run) leaves each node.
    std::unordered_map<Node*, std::vector<const void*>> leaves_last_fed_by;
    std::function<void(const void*)> final;
    void finish(const void* key) {
      if (finished.insert(key).second) final(key);
    }
  };
  auto state = std::make_shared<State>();
  state->wanted = wanted;
  state->final = std::move(final);
  BackwardHooks hooks;
  hooks.planned = [state](const std::vector<std::shared_ptr<Node>>& post_order) {
    std::unordered_set<const void*> placed;
    for (const auto& owned : post_order) {  // the nodes that run last come first
      for (size_t i = 0; i < owned->inputs.size(); ++i) {
        const Edge& in = owned->inputs[i];
        if (in.leaf && owned->needs[i] && state->wanted.count(in.key()) && placed.insert(in.key()).second)
          state->leaves_last_fed_by[owned.get()].push_back(in.key());
      }
    }
  };
  hooks.ran = [state](Node* node) {
    if (state->wanted.count(node)) state->finish(node);
    auto last = state->leaves_last_fed_by.find(node);
    if (last != state->leaves_last_fed_by.end())
      for (const void* leaf : last->second) state->finish(leaf);
  };
  return hooks;
}

}  // namespace adjoint
