// `adjoint bench stitch`: one IRI step and one stitch-training step, the loops of stitching.
#pragma once
#include "tools/cli.h"

namespace adjoint {
int run_bench_stitch(const cli::Args& args);
}
