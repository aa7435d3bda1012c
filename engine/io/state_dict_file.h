// A state dict from a weights file of either kind people have: safetensors (timm, Hugging
// Face, adjoint's own) or PyTorch's torch.save, told apart by content, not by extension.
#pragma once
#include <string>

#include "engine/io/safetensors.h"
#include "engine/io/stored_tensor.h"

namespace adjoint {

// The tensors of the state dict in `path`, as float32, with their stored dtypes.
//
// `key` "" takes the file's state dict as it is. Otherwise: in a PyTorch file, the entry
// `key` of the saved dict ({"model": state_dict, "epoch": ...}); in a safetensors file, the
// tensors named "<key>.*", with that prefix dropped (adjoint's checkpoints keep the model's
// under "model."). When every name starts with "module." (a model wrapped in
// DistributedDataParallel or DataParallel when saved), that prefix is dropped.
//
// Refuses, in one line naming `path`: PyTorch's legacy format from before 1.6 (with how to
// re-save it), and whatever read_safetensors and read_torch_state_dict refuse.
SafetensorsFile read_state_dict(const std::string& path, const std::string& key = "");

// The same state dict with its tensors not yet read (engine/io/stored_tensor.h), so that each
// is converted once, into the memory that keeps it: a torch.save file's straight from the
// file (read_into checks its storage's CRC-32), a safetensors file's from memory after
// read_safetensors. The same names and the same errors, a damaged storage's when it is read.
StoredTensors open_state_dict(const std::string& path, const std::string& key = "");

}  // namespace adjoint
