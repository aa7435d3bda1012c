// The config.json of a folder of the tensor-similarity paper's LM checkpoints
// (models/paper_lm.h): the model's sizes read from a "model" block or the top level.
#include "engine/error.h"
#include "fuzz/fuzz_input.h"
#include "models/paper_lm.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = adjoint::fuzz::write_input(data, size, "config.json");
  try {
    adjoint::read_paper_lm_config(path);
  } catch (const adjoint::Error&) {
  }
  return 0;
}
