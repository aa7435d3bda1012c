// The one place that sets how many threads the engine uses.
//
// TBB runs every parallel loop; OpenBLAS is pinned to one thread so that a GEMM issued
// from inside a TBB task never spawns threads of its own (oversubscription, deadlocks).
// Large GEMMs are split into TBB tasks by engine/gemm.cpp instead.
#pragma once
#include <cstdint>
#include <functional>

namespace adjoint {

// Sets the thread count for TBB and OpenBLAS. n <= 0 means all cores.
void set_num_threads(int n);
// The threads available to work started here: the engine's count, or 1 inside a task of
// run_concurrently.
int num_threads();

// Runs body(begin, end) over [0, n) in chunks of `grain` items. The chunking depends only
// on n and grain, never on the thread count or on scheduling, so a body whose chunks
// write disjoint outputs gives bitwise-identical results at any thread count.
void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& body);

// Runs task(0) … task(n − 1) at the same time, each confined to one thread: its parallel
// loops and GEMMs run serially inside it. For work that splits into independent parts
// better than its loops do (data-parallel training: one part of the batch per core).
void run_concurrently(int64_t n, const std::function<void(int64_t)>& task);

}  // namespace adjoint
