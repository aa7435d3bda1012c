// CIFAR-10 binary batches: the input is test_batch.bin; every example is read.
#include <vector>

#include "engine/data/cifar.h"
#include "engine/error.h"
#include "fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  adjoint::fuzz::write_input(data, size, "test_batch.bin");
  try {
    auto set = adjoint::cifar10(adjoint::fuzz::folder(), "test");
    std::vector<float> input(static_cast<size_t>(adjoint::numel(set->shape())));
    int64_t label = 0;
    for (int64_t i = 0; i < set->size(); ++i) set->get(i, input.data(), &label);
  } catch (const adjoint::Error&) {
  }
  return 0;
}
