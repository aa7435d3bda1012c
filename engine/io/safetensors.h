// safetensors read/write (the format of torch/timm/Hugging Face weight files).
// Reading converts every numeric dtype to float32 and remembers the original dtype;
// writing is atomic (temporary file, then rename).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "engine/io/files.h"
#include "engine/shape.h"
#include "engine/tensor.h"

namespace adjoint {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> dtypes;    // original dtype per tensor ("F32", "I64", ...)
  std::map<std::string, std::string> metadata;  // the "__metadata__" string map
};

// Bytes per element of a dtype as safetensors names it ("F32", "F16", "BF16", "I64", ...);
// 0 for a name it does not know.
int64_t dtype_size(const std::string& dtype);
// Converts `count` little-endian elements of `dtype` (a name dtype_size knows) at `src`,
// which need not be aligned, to float32.
void convert_to_float(const std::string& dtype, const unsigned char* src, float* dst, size_t count);

// Throws Error naming the file and the tensor at fault for a missing, truncated or
// malformed file.
SafetensorsFile read_safetensors(const std::string& path);
// Throws Error naming `path`, the tensor and its dtype unless tensor `name` was stored as a
// floating-point dtype: integer and boolean values (token ids, masks, counters) read
// as floats would pass silently as weights or inputs.
void require_floating_point(const SafetensorsFile& file, const std::string& name, const std::string& path);
// The same for a tensor stored as `dtype`.
void require_floating_point(const std::string& dtype, const std::string& name, const std::string& path);

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});
// The same into an open temporary that the caller commits: to publish several files
// together only once all of them are written.
void write_safetensors(AtomicFile& file, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// A float32 safetensors file written in parts, in any order and from several threads at
// once: the header (from the tensors' names and shapes) when it is made, each tensor's values
// in ranges as they become known (the maps of a batch while the next is being made), the
// last part and commit() at the end. The file is the same bytes as write_safetensors writes
// for the same tensors, and like it appears whole or not at all: commit() refuses a file with
// a value unwritten, and a writer destroyed uncommitted removes its temporary.
class SafetensorsWriter {
public:
  SafetensorsWriter(std::string path, const std::map<std::string, Shape>& shapes,
                    const std::map<std::string, std::string>& metadata = {});
  // Writes `values` (any shape) as tensor `name`'s elements from element `first` on, and starts
  // their disk writes. Ranges must not overlap.
  void write(const std::string& name, int64_t first, const Tensor& values);
  // Syncs and renames the file onto its path once every value is written.
  void commit();
  const std::string& path() const { return file_.path(); }

private:
  struct Part {
    int64_t offset = 0;    // in the file, in bytes
    int64_t elements = 0;  // of the whole tensor
    int64_t written = 0;   // elements written so far
  };
  AtomicFile file_;
  std::map<std::string, Part> parts_;  // its keys are fixed when made; `written` under `mutex_`
  std::mutex mutex_;
};

}  // namespace adjoint
