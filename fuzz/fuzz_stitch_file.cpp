// A stitch file (analysis/stitching/records.h): weight, bias (finite), the models, blocks
// and record in the metadata.
#include "analysis/stitching/records.h"
#include "engine/error.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = adjoint::fuzz::write_input(data, size, "stitch.safetensors");
  try {
    adjoint::read_stitch_file(path);
  } catch (const adjoint::Error&) {
  }
  try {
    adjoint::read_stitch_parameters(path);
  } catch (const adjoint::Error&) {
  }
  return 0;
}
