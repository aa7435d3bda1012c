#include "tools/timing.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "engine/error.h"

namespace adjoint::cli {

namespace {
double now_seconds(BenchClock clock) {
  if (clock == BenchClock::Cpu) {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

BenchClock bench_clock(const std::string& name, int threads) {
  if (name != "wall" && name != "cpu") throw UsageError(cat("option --clock expects wall or cpu, got '", name, "'"));
  if (name == "cpu" && threads != 1)
    throw UsageError(cat("option --clock cpu measures durations only with --threads 1 (", threads, " threads)"));
  return name == "cpu" ? BenchClock::Cpu : BenchClock::Wall;
}

double median_seconds(int64_t repeats, const std::function<void()>& run, const TimingOptions& o) {
  const auto warm_until = std::chrono::steady_clock::now() + std::chrono::duration<double>(o.warmup_seconds);
  for (int64_t w = 0; w < o.warmup_runs || (o.warmup_runs > 0 && std::chrono::steady_clock::now() < warm_until); ++w)
    run();
  std::vector<double> times;
  for (int64_t r = 0; r < repeats; ++r) {
    const double start = now_seconds(o.clock);
    run();
    times.push_back(now_seconds(o.clock) - start);
  }
  if (times.empty()) return 0;
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  return n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
}

}  // namespace adjoint::cli
