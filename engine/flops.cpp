#include "engine/flops.h"

#include <atomic>

#include "engine/error.h"

namespace adjoint {

namespace {

// Whether a count is running, and its tally. Atomic: ops may run on any thread, and the
// check costs one load per op when nothing counts.
std::atomic<bool> counting{false};
std::atomic<int64_t> tally{0};

}  // namespace

FlopCount::FlopCount() {
  check(!counting.exchange(true), "FlopCount: another count is already running");
  tally = 0;
}

FlopCount::~FlopCount() { counting = false; }

int64_t FlopCount::total() const { return tally.load(); }

void count_multiply_adds(int64_t multiply_adds) {
  if (counting.load(std::memory_order_relaxed)) tally.fetch_add(2 * multiply_adds, std::memory_order_relaxed);
}

}  // namespace adjoint
