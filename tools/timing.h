// Timing for benchmarks: medians, because machines are noisy.
#pragma once
#include <cstdint>
#include <functional>

namespace adjoint::cli {

// Median wall time in seconds of `repeats` runs, after `warmup` untimed runs.
double median_seconds(int64_t repeats, const std::function<void()>& run, int64_t warmup = 1);

}  // namespace adjoint::cli
