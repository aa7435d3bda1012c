// `adjoint bench models`: training and inference throughput of the model zoo.
#pragma once
#include "tools/cli.h"

namespace adjoint {
int run_bench_models(const cli::Args& args);
}
