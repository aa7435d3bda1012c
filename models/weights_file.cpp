#include "models/weights_file.h"

#include <regex>

#include "engine/error.h"
#include "engine/io/state_dict_file.h"
#include "models/checkpoint.h"

namespace adjoint {

std::map<std::string, Tensor> rename_weights(std::map<std::string, Tensor> tensors, const NameRules& rules,
                                             const std::string& source) {
  if (rules.empty()) return tensors;
  std::vector<std::pair<std::regex, std::string>> compiled;
  for (const auto& [pattern, replacement] : rules) compiled.emplace_back(std::regex(pattern), replacement);
  std::map<std::string, Tensor> renamed;
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
    renamed.emplace(own, std::move(tensor));
  }
  return renamed;
}

void load_weights_file(Model& model, const std::string& path, const std::string& key) {
  const SafetensorsFile weights = read_state_dict(path, key);
  for (const auto& [name, t] : weights.tensors)  // torch stores BatchNorm's counter as int64
    if (!name.ends_with("num_batches_tracked")) require_floating_point(weights, name, path);
  load_state_dict(model, rename_weights(weights.tensors, model.facts().weight_file_names, path), path);
}

}  // namespace adjoint
