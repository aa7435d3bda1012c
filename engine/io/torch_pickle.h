// Reading the state dict inside a file that PyTorch's torch.save wrote, without running it.
//
// Since PyTorch 1.6, torch.save writes a zip archive (engine/io/zip_archive.h):
//
//   <name>/data.pkl     the saved object, pickled (protocol 2); each tensor is a call of
//                       torch._utils._rebuild_tensor_v2 on a storage, an offset, a size and
//                       strides, each storage a persistent id ("storage", its typed class,
//                       its key, its device, its element count)
//   <name>/data/<key>   each storage's bytes
//   <name>/byteorder    "little" or "big" (PyTorch 1.13 writes none: little)
//   <name>/version      the format's version
//
// A pickle is a program: loading one with Python's pickle may call any function it names.
// This reader is a restricted unpickler, like torch.load(weights_only=True): it builds
// plain data (numbers, strings, tuples, lists, dicts) and calls only the few functions a
// state dict needs (collections.OrderedDict, torch._utils._rebuild_tensor_v2,
// _rebuild_tensor, _rebuild_parameter, torch.nn.Parameter, the typed storages of real
// numbers). It refuses every other global, naming it, before anything is built from it.
#pragma once
#include <string>

#include "engine/io/safetensors.h"
#include "engine/io/stored_tensor.h"

namespace adjoint {

// The tensors of the state dict saved in `path`, by name, not yet read: the file is checked
// (the pickle, each tensor's storage and view) and stays open for each tensor's read_into,
// which converts it from where it lies in the file and checks its storage's CRC-32 once.
// `key` and the errors as for read_torch_state_dict below, a damaged storage's when read.
StoredTensors open_torch_state_dict(const std::string& path, const std::string& key = "");

// The tensors of the state dict saved in `path`, by name, as float32, each with the dtype it
// was stored in (safetensors' names: "F32", "F16", "BF16", "I64", ...) in `dtypes`;
// `metadata` is empty. `key` "" takes the saved object itself; otherwise the saved object is
// a dict (a training script's {"model": state_dict, "epoch": 3, ...}) and `key` names the
// entry that holds the state dict. Strided views are gathered; big-endian files are
// swapped. Throws Error in one line naming `path` and what is wrong: a refused global (with
// a hint when the file holds a whole pickled module), a truncated or corrupt archive, a
// storage shorter than a tensor on it, a missing key.
SafetensorsFile read_torch_state_dict(const std::string& path, const std::string& key = "");

// True when the file starts as a zip archive does.
bool is_torch_zip_file(const std::string& path);
// True when the file starts as torch.save's legacy format (before PyTorch 1.6) does: a
// pickle (protocol 2) of the magic number 0x1950a86a20f9469cfc6c.
bool is_legacy_torch_file(const std::string& path);

}  // namespace adjoint
