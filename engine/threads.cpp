#include "engine/threads.h"

#include <cblas.h>
#include <tbb/blocked_range.h>
#include <tbb/global_control.h>
#include <tbb/info.h>
#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <memory>
#include <mutex>

namespace adjoint {

namespace {
std::mutex control_mutex;
std::unique_ptr<tbb::global_control> control;
int current = 0;

int all_cores() { return std::max(1, tbb::info::default_concurrency()); }

// Applied on first use when nobody called set_num_threads.
void ensure_initialised() {
  std::lock_guard<std::mutex> lock(control_mutex);
  if (current != 0) return;
  current = all_cores();
  openblas_set_num_threads(1);
  control = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, current);
}
}  // namespace

void set_num_threads(int n) {
  std::lock_guard<std::mutex> lock(control_mutex);
  current = n > 0 ? n : all_cores();
  openblas_set_num_threads(1);
  control.reset();
  control = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, current);
}

int num_threads() {
  ensure_initialised();
  return std::min(current, tbb::this_task_arena::max_concurrency());
}

void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  ensure_initialised();
  if (n <= grain || num_threads() == 1) {
    // Same chunk boundaries as the parallel path, so reductions inside a chunk match.
    for (int64_t b = 0; b < n; b += grain) body(b, std::min(n, b + grain));
    return;
  }
  const int64_t chunks = (n + grain - 1) / grain;
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, chunks, 1),
      [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t c = r.begin(); c < r.end(); ++c) body(c * grain, std::min(n, (c + 1) * grain));
      },
      tbb::simple_partitioner());
}

void run_concurrently(int64_t n, const std::function<void(int64_t)>& task) {
  if (n <= 0) return;
  ensure_initialised();
  tbb::parallel_for(
      tbb::blocked_range<int64_t>(0, n, 1),
      [&](const tbb::blocked_range<int64_t>& r) {
        for (int64_t i = r.begin(); i < r.end(); ++i) {
          tbb::task_arena one_thread(1);  // the calling thread alone works in it
          one_thread.execute([&] { task(i); });
        }
      },
      tbb::simple_partitioner());
}

}  // namespace adjoint
