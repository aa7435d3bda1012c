// `adjoint bench scaling`: data-parallel training and a stitch sweep over 1, 2 and 4 ranks
// of mpirun on this machine, against one process using every core.
#pragma once
#include "tools/cli.h"

namespace adjoint {
int run_bench_scaling(const cli::Args& args);
}
