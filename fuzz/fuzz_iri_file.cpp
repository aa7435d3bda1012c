// A stitching sweep's IRI file (analysis/stitching/records.h): a safetensors file of four
// tensors, each validated (shapes, finite values, pixel range, start indices).
#include "analysis/stitching/records.h"
#include "engine/error.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = adjoint::fuzz::write_input(data, size, "iris.safetensors");
  try {
    adjoint::read_iri_file(path);
  } catch (const adjoint::Error&) {
  }
  return 0;
}
