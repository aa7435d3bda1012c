// The `adjoint` executable. Each subcommand registers itself from its own file
// (tools/cli.h); main only hands over to the dispatcher, once OpenBLAS runs without its
// thread pool.
//
// Debian's OpenBLAS (the pthread build) starts one worker per core when it is loaded, before
// main, sized by OPENBLAS_NUM_THREADS. The engine never uses them: it calls OpenBLAS one
// thread at a time from inside its own TBB tasks (engine/threads.h). Idle, they cost memory;
// under an address-space limit (ulimit -v of about 200 MB) a worker spins forever failing to
// map its buffer and exit waits for it, so every command hung after printing its answer.
// The variable is read only at load time, so when it is unset the executable starts itself
// again with OPENBLAS_NUM_THREADS=1: no worker is ever created. The serial build of OpenBLAS
// is no substitute: built without locking it is not safe to call from several threads at
// once, and `adjoint bench` lets OpenBLAS run its own threads as the raw peer (it grows the
// pool then, through openblas_set_num_threads). A user's own OPENBLAS_NUM_THREADS is left
// alone, and the variable this sets is removed again, so that the programs a command starts
// (the PyTorch and NumPy peers) see the environment the user gave.
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "tools/cli.h"

namespace {

constexpr const char* kMarker = "ADJOINT_OPENBLAS_SINGLE_THREADED";

void start_without_blas_pool(char** argv) {
  if (std::getenv(kMarker) != nullptr) {
    unsetenv("OPENBLAS_NUM_THREADS");
    unsetenv(kMarker);
    return;
  }
  if (std::getenv("OPENBLAS_NUM_THREADS") != nullptr) return;
  setenv("OPENBLAS_NUM_THREADS", "1", 1);
  setenv(kMarker, "1", 1);
  execv("/proc/self/exe", argv);
  // No /proc (or no exec): run on with the pool; only a tight memory limit makes it matter.
  unsetenv("OPENBLAS_NUM_THREADS");
  unsetenv(kMarker);
}

}  // namespace

int main(int argc, char** argv) {
  start_without_blas_pool(argv);
  return adjoint::cli::run(argc, argv);
}
