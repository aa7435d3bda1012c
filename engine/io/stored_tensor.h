// A tensor of a weights file known by its shape and stored dtype before its values are read:
// loading a model reads each one once, from the file straight into the parameter it fills.
#pragma once
#include <functional>
#include <map>
#include <string>

#include "engine/shape.h"

namespace adjoint {

struct StoredTensor {
  Shape shape;
  std::string dtype;  // as stored, in safetensors' names ("F32", "F16", "BF16", "I64", ...)
  // Writes the tensor's numel(shape) values, as float32 in row-major order, to `out`;
  // throws Error naming the file and the tensor when its bytes are damaged (a failed
  // CRC). Keeps what it reads from open; safe to call for different tensors at once.
  std::function<void(float* out)> read_into;
};

using StoredTensors = std::map<std::string, StoredTensor>;

}  // namespace adjoint
