// Tensor storage and the C library's allocator: the memory a step frees is reused by the
// next without the kernel mapping, faulting in and zeroing its pages again
// (engine/tensor.cpp keep_freed_memory).
#include <doctest/doctest.h>

#include <sys/resource.h>

#include <cstdlib>

#include "engine/tensor.h"

using namespace adjoint;

namespace {

// Page faults the kernel has served this process so far (first touches of new pages).
long minor_faults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

}  // namespace

TEST_CASE("tensor memory: a freed block above 32 MiB is reused without faulting its pages in again") {
#if defined(__SANITIZE_ADDRESS__)
  MESSAGE("skipped: AddressSanitizer replaces the C library's allocator");
  return;
#endif
  for (const char* setting : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_MMAP_MAX_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"})
    if (std::getenv(setting) != nullptr) {
      MESSAGE("skipped: the environment sets the allocator's own ", setting);
      return;
    }
  // 48 MiB, as a VGG's activations at 224 pixels are above glibc's largest mmap threshold.
  const int64_t floats = int64_t(48) << 18;
  const long pages = long(floats * 4 / 4096);
  {
    Tensor first = Tensor::empty({floats});
    first.fill_(1.0f);
  }
  const long before = minor_faults();
  {
    Tensor second = Tensor::empty({floats});
    second.fill_(2.0f);
    CHECK(second.data()[floats - 1] == 2.0f);
  }
  const long faults = minor_faults() - before;
  CAPTURE(faults);
  CAPTURE(pages);
  CHECK(faults < pages / 10);
}
