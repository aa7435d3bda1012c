#include "engine/distributed.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "engine/error.h"

#ifdef ADJOINT_HAVE_MPI
#define OMPI_SKIP_MPICXX 1  // the C API only: no C++ bindings
#include <mpi.h>
#endif

namespace adjoint::distributed {

namespace {

// The ranks mpirun (Open MPI's launcher) announces to the processes it starts; 0 when the
// process was started some other way.
int launched_ranks() {
  const char* size = std::getenv("OMPI_COMM_WORLD_SIZE");
  return size ? std::atoi(size) : 0;
}

#ifdef ADJOINT_HAVE_MPI
struct Job {
  bool mpi = false;  // MPI started: a process launched by mpirun
  int rank = 0, size = 1;
};

void finish_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

void check_mpi(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw Error(cat("MPI ", what, " failed: ", std::string(text, size_t(length))));
}

// Started on first use, so that a process that never trains in parallel, and every
// process started without mpirun, never initialises MPI.
const Job& job() {
  static const Job the_job = [] {
    Job j;
    if (launched_ranks() == 0) return j;
    int provided = 0;
    check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided), "MPI_Init_thread");
    std::atexit(finish_mpi);
    // Errors come back as codes (then exceptions naming the call), not as MPI's own abort.
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    MPI_Comm_rank(MPI_COMM_WORLD, &j.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &j.size);
    j.mpi = true;
    return j;
  }();
  return the_job;
}

int checked_count(int64_t count) {
  check(count >= 0 && count <= std::numeric_limits<int>::max(), "distributed: ", count,
        " values in one collective; at most ", std::numeric_limits<int>::max());
  return int(count);
}

template <class T>
void allgather_values(const T* mine, int64_t count, T* all, MPI_Datatype type) {
  if (!job().mpi) {
    if (count > 0 && all != mine) std::memmove(all, mine, size_t(count) * sizeof(T));
    return;
  }
  check_mpi(MPI_Allgather(mine, checked_count(count), type, all, checked_count(count), type, MPI_COMM_WORLD),
            "MPI_Allgather");
}
#else
// Without MPI a process started by mpirun would think it is alone, and K copies of the same
// run would write the same files: refused.
struct Job {
  int rank = 0, size = 1;
};
const Job& job() {
  static const Job the_job = [] {
    const int ranks = launched_ranks();
    if (ranks > 1)
      throw Error(cat("this adjoint was built without MPI (Meson feature 'mpi'), but mpirun started it as one of ",
                      ranks, " ranks; install libopenmpi-dev and rebuild, or run it without mpirun"));
    return Job{};
  }();
  return the_job;
}
template <class T>
void allgather_values(const T* mine, int64_t count, T* all) {
  job();
  if (count > 0 && all != mine) std::memmove(all, mine, size_t(count) * sizeof(T));
}
#endif

}  // namespace

bool built_with_mpi() {
#ifdef ADJOINT_HAVE_MPI
  return true;
#else
  return false;
#endif
}

int rank() { return job().rank; }
int size() { return job().size; }

#ifdef ADJOINT_HAVE_MPI
void allgather(const float* mine, int64_t count, float* all) { allgather_values(mine, count, all, MPI_FLOAT); }
void allgather(const double* mine, int64_t count, double* all) { allgather_values(mine, count, all, MPI_DOUBLE); }

void broadcast(float* values, int64_t count, int root) {
  if (!job().mpi) return;
  check_mpi(MPI_Bcast(values, checked_count(count), MPI_FLOAT, root, MPI_COMM_WORLD), "MPI_Bcast");
}

void barrier() {
  if (job().mpi) check_mpi(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
}

void abort(int code, const char* message) {
  std::fprintf(stderr, "rank %d of %d: %s\n", job().rank, job().size, message);
  std::fflush(stderr);
  if (job().mpi) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}
#else
void allgather(const float* mine, int64_t count, float* all) { allgather_values(mine, count, all); }
void allgather(const double* mine, int64_t count, double* all) { allgather_values(mine, count, all); }
void broadcast(float*, int64_t, int) { job(); }
void barrier() { job(); }
void abort(int code, const char* message) {
  std::fprintf(stderr, "%s\n", message);
  std::exit(code);
}
#endif

}  // namespace adjoint::distributed
