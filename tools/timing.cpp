#include "tools/timing.h"

#include <time.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "engine/error.h"
#include "engine/threads.h"
#include "tools/cli.h"

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

BenchClock bench_clock(const Args& args) {
  const std::string clock = args.text("clock");
  if (clock != "wall" && clock != "cpu") throw UsageError(cat("option --clock expects wall or cpu, got '", clock, "'"));
  if (clock == "cpu" && num_threads() != 1)
    throw UsageError(cat("option --clock cpu measures durations only with --threads 1 (", num_threads(), " threads)"));
  return clock == "cpu" ? BenchClock::Cpu : BenchClock::Wall;
}

}  // namespace adjoint::cli
