// The `adjoint` executable the suite runs as a program. tests/meson.build compiles this one
// file once for each test binary: adjoint_tests runs the build with MPI, and
// adjoint_tests_without_mpi the build without it, so one set of test objects serves both.
#include "tests/support.h"

namespace adjoint::testing {

std::string adjoint_exe() { return ADJOINT_EXE; }

}  // namespace adjoint::testing
