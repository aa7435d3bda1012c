// IDX arrays (MNIST's format), plain or gzip-compressed (the reader inflates either).
#include "engine/data/idx.h"
#include "engine/error.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = adjoint::fuzz::write_input(data, size, "input.idx");
  try {
    adjoint::IdxArray array = adjoint::read_idx(path);
    (void)array;
  } catch (const adjoint::Error&) {
  }
  return 0;
}
