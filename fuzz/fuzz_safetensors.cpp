// safetensors: header (length, JSON, dtypes, shapes, offsets) and body.
#include "engine/error.h"
#include "engine/io/safetensors.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = adjoint::fuzz::write_input(data, size, "input.safetensors");
  try {
    adjoint::SafetensorsFile file = adjoint::read_safetensors(path);
    for (const auto& [name, tensor] : file.tensors) adjoint::require_floating_point(file, name, path);
  } catch (const adjoint::Error&) {
  }
  return 0;
}
