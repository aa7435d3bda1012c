// The processes of one job and the few collective operations data-parallel training needs.
//
// Every call to MPI (Open MPI's C API) lives in engine/distributed.cpp, behind this small
// interface. A process started without mpirun, or a build without MPI (the Meson feature
// `mpi`), is a job of one: rank 0 of size 1, and every collective copies its own buffer.
// MPI is started on first use and finished when the process exits normally.
//
// Collectives are called from the main thread only, by every rank in the same order.
#pragma once
#include <cstdint>

namespace adjoint::distributed {

// Whether this build can talk to other processes (compiled with MPI).
bool built_with_mpi();

// This process's index in the job, 0 … size() − 1, and the number of processes.
int rank();
int size();

// Every rank gives `count` values; `all` (size() · count values) receives them in rank
// order: rank r's values at all[r · count …]. The same count on every rank.
void allgather(const float* mine, int64_t count, float* all);
void allgather(const double* mine, int64_t count, double* all);

// Rank `root`'s `count` values copied into `values` on every rank.
void broadcast(float* values, int64_t count, int root = 0);

// Returns when every rank has called it.
void barrier();

// Ends the whole job with `code` (every rank), after one line on stderr naming this rank.
[[noreturn]] void abort(int code, const char* message);

}  // namespace adjoint::distributed
