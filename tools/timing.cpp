#include "tools/timing.h"

#include <algorithm>
#include <chrono>
#include <vector>

namespace adjoint::cli {

double median_seconds(int64_t repeats, const std::function<void()>& run, int64_t warmup) {
  for (int64_t w = 0; w < warmup; ++w) run();
  std::vector<double> times;
  for (int64_t r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    run();
    times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  const size_t n = times.size();
  if (n == 0) return 0;
  return n % 2 ? times[n / 2] : 0.5 * (times[n / 2 - 1] + times[n / 2]);
}

}  // namespace adjoint::cli
