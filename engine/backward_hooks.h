// What a backward pass (engine/autograd.cpp, run) tells someone watching it, and the one
// watcher the engine has: the hook that says when a wanted cotangent is final, so that
// grad()'s GradientReady can hand each parameter's gradient on (to be sent to other
// processes, say) while backward goes on. The traversal itself knows nothing of it.
#pragma once
#include <functional>
#include <memory>
#include <unordered_set>
#include <vector>

#include "engine/autograd.h"

namespace adjoint {

struct BackwardHooks {
  // The graph's nodes in post-order (inputs before users; they run last to first), once
  // every node's `needs` is set and before any runs.
  std::function<void(const std::vector<std::shared_ptr<Node>>& post_order)> planned;
  // After `node`'s turn: its cotangent passed on, or nothing reached it.
  std::function<void(Node* node)> ran;
};

// Hooks that call final(key) once for every wanted key, as soon as nothing more will reach
// it: a node's right after its turn, a leaf's right after the last node with an edge into it
// that some cotangent must cross (needs) has run. Keys no node reaches are left to the caller.
BackwardHooks final_cotangent_hooks(const std::unordered_set<const void*>& wanted,
                                    std::function<void(const void* key)> final);

}  // namespace adjoint
