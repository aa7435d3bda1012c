// Timing for benchmarks: medians, because machines are noisy.
#pragma once
#include <cstdint>
#include <functional>
#include <string>

namespace adjoint::cli {

// Wall-clock time, or the CPU time of the whole process (immune to other programs
// taking the cores of a shared machine, but only a duration at one thread).
enum class BenchClock { Wall, Cpu };

// The clock called `name` (the benchmarks' --clock: wall or cpu). A UsageError for any
// other name, and for cpu at more than one thread, where CPU time is no duration.
BenchClock bench_clock(const std::string& name, int threads);

struct TimingOptions {
  BenchClock clock = BenchClock::Wall;
  // Untimed runs first: at least `warmup_runs`, and until `warmup_seconds` have passed
  // (caches, page tables and the CPU clock settle). 0 and 0: no warm-up.
  int64_t warmup_runs = 1;
  double warmup_seconds = 0.1;
};

// Median time in seconds of `repeats` timed runs.
double median_seconds(int64_t repeats, const std::function<void()>& run, const TimingOptions& options = {});

}  // namespace adjoint::cli
