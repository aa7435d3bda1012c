// safetensors read/write (the format of torch/timm/Hugging Face weight files).
// Reading converts every numeric dtype to float32 and remembers the original dtype;
// writing is atomic (temporary file, then rename).
#pragma once
#include <map>
#include <string>

#include "engine/io/files.h"
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

}  // namespace adjoint
