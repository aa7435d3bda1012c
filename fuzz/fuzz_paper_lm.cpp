// The tensor-similarity paper's LM layout (models/paper_lm.h): a safetensors file read as the
// paper's parameter names, every shape checked.
#include "engine/error.h"
#include "engine/io/safetensors.h"
#include "fuzz/fuzz_input.h"
#include "models/paper_lm.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = adjoint::fuzz::write_input(data, size, "input.safetensors");
  try {
    const adjoint::SafetensorsFile file = adjoint::read_safetensors(path);
    adjoint::paper_lm_view(file.tensors, {2, 0.35}, 4, path);
  } catch (const adjoint::Error&) {
  }
  return 0;
}
