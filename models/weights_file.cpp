#include "models/weights_file.h"

#include <regex>

#include "engine/error.h"
#include "engine/io/state_dict_file.h"
#include "models/checkpoint.h"

namespace adjoint {

namespace {

template <typename Tensor_>
std::map<std::string, Tensor_> renamed(std::map<std::string, Tensor_> tensors, const NameRules& rules,
                                       const std::string& source) {
  if (rules.empty()) return tensors;
  std::vector<std::pair<std::regex, std::string>> compiled;
  for (const auto& [pattern, replacement] : rules) compiled.emplace_back(std::regex(pattern), replacement);
  std::map<std::string, Tensor_> out;
  std::map<std::string, std::string> origin;  // the file's name of each new name, for the message
  for (auto& [name, tensor] : tensors) {
    std::string own = name;
    for (const auto& [pattern, replacement] : compiled)
      if (std::regex_search(name, pattern)) {
        own = std::regex_replace(name, pattern, replacement, std::regex_constants::format_first_only);
        break;
      }
    auto [it, added] = origin.emplace(own, name);
    if (!added) throw Error(cat(source, ": tensors '", it->second, "' and '", name, "' both stand for '", own, "'"));
    out.emplace(own, std::move(tensor));
  }
  return out;
}

}  // namespace

std::map<std::string, Tensor> rename_weights(std::map<std::string, Tensor> tensors, const NameRules& rules,
                                             const std::string& source) {
  return renamed(std::move(tensors), rules, source);
}

StoredTensors rename_weights(StoredTensors tensors, const NameRules& rules, const std::string& source) {
  return renamed(std::move(tensors), rules, source);
}

void load_weights_file(Model& model, const std::string& path, const std::string& key) {
  StoredTensors weights = open_state_dict(path, key);
  for (const auto& [name, t] : weights)  // torch stores BatchNorm's counter as int64
    if (!name.ends_with("num_batches_tracked")) require_floating_point(t.dtype, name, path);
  load_state_dict(model, rename_weights(std::move(weights), model.facts().weight_file_names, path), path);
}

}  // namespace adjoint
