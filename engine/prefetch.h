// Software prefetch of data a loop will read soon. A layer's input streams in from memory in
// short runs (a plane's band of rows, then the next plane's), too short for the hardware
// prefetchers to run ahead; asking for the next run while this one computes hides the wait.
#pragma once
#include <cstdint>

namespace adjoint {

// Asks for the `count` floats at `data` to be brought into L2, a cache line at a time.
inline void prefetch(const float* data, int64_t count) {
  for (int64_t i = 0; i < count; i += 16) __builtin_prefetch(data + i, 0, 2);
}

}  // namespace adjoint
