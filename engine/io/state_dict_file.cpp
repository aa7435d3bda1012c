#include "engine/io/state_dict_file.h"

#include <algorithm>
#include <cstring>

#include "engine/error.h"
#include "engine/io/torch_pickle.h"

namespace adjoint {

namespace {

// `file` with only the names that start with `prefix` kept,
// that prefix dropped.
SafetensorsFile drop_prefix(SafetensorsFile file, const std::string& prefix) {
  SafetensorsFile out;
  out.metadata = std::move(file.metadata);
  for (auto& [name, tensor] : file.tensors) {
    if (!name.starts_with(prefix)) continue;
    const std::string own = name.substr(prefix.size());
    out.tensors.emplace(own, std::move(tensor));
    out.dtypes.emplace(own, file.dtypes[name]);
  }
  return out;
}

// The prefix of every name of a model saved wrapped in DistributedDataParallel or DataParallel.
constexpr const char* kWrapperPrefix = "module.";

// True when every name starts with kWrapperPrefix.
template <typename Tensors>
bool saved_wrapped(const Tensors& tensors) {
  bool wrapped = !tensors.empty();
  for (const auto& [name, tensor] : tensors) wrapped = wrapped && name.starts_with(kWrapperPrefix);
  return wrapped;
}

}  // namespace

StoredTensors open_state_dict(const std::string& path, const std::string& key) {
  if (!is_torch_zip_file(path)) {  // read whole, as read_safetensors reads: each tensor copied from memory
    StoredTensors stored;
    const SafetensorsFile file = read_state_dict(path, key);
    for (const auto& [name, tensor] : file.tensors) {
      const Tensor values = tensor.contiguous();
      stored.emplace(name, StoredTensor{values.shape(), file.dtypes.count(name) ? file.dtypes.at(name) : "F32",
                                        [values](float* out) { std::copy_n(values.data(), values.numel(), out); }});
    }
    return stored;
  }
  StoredTensors stored = open_torch_state_dict(path, key);
  if (!saved_wrapped(stored)) return stored;
  StoredTensors unwrapped;
  for (auto& [name, tensor] : stored) unwrapped.emplace(name.substr(std::strlen(kWrapperPrefix)), std::move(tensor));
  return unwrapped;
}

SafetensorsFile read_state_dict(const std::string& path, const std::string& key) {
  SafetensorsFile file;
  if (is_torch_zip_file(path)) {
    file = read_torch_state_dict(path, key);
  } else if (is_legacy_torch_file(path)) {
    throw Error(cat("torch file ", path, ": written in PyTorch's legacy format (before 1.6), which is not read; "
                    "load it in PyTorch and save it again with torch.save(state_dict, FILE)"));
  } else {
    file = read_safetensors(path);
    if (!key.empty()) {
      const size_t before = file.tensors.size();
      file = drop_prefix(std::move(file), key + ".");
      if (file.tensors.empty())
        throw Error(cat(path, ": none of its ", before, " tensors is named '", key, ".*' (--weights-key ", key, ")"));
    }
  }
  if (saved_wrapped(file.tensors)) file = drop_prefix(std::move(file), kWrapperPrefix);
  return file;
}

}  // namespace adjoint
