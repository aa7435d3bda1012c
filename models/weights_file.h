// Loading a weights file (a state dict saved by PyTorch, timm or adjoint) into a model.
#pragma once
#include <map>
#include <string>

#include "engine/io/stored_tensor.h"
#include "models/model.h"

namespace adjoint {

// `tensors` with each name renamed by the first rule that matches it (models/model.h's
// NameRules). Throws an Error naming `source` when two names end up the same.
std::map<std::string, Tensor> rename_weights(std::map<std::string, Tensor> tensors, const NameRules& rules,
                                             const std::string& source);
StoredTensors rename_weights(StoredTensors tensors, const NameRules& rules, const std::string& source);

// Reads the state dict in `path` (safetensors or torch.save's zip, by content:
// engine/io/state_dict_file.h; `key` reaches one nested in a saved dict), refuses integer
// tensors other than BatchNorm's counters, renames the names the model's family publishes
// differently (ModelFacts::weight_file_names) and loads it (models/checkpoint.h's
// load_state_dict, which names every missing, unexpected or mis-shaped tensor): each tensor
// is read from the file straight into the model's own (engine/io/state_dict_file.h's
// open_state_dict).
void load_weights_file(Model& model, const std::string& path, const std::string& key = "");

}  // namespace adjoint
