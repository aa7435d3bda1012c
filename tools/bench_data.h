// `adjoint bench data`: whether the model waits for its images (tools/bench_data.cpp).
// bench.cpp hands over to it when its first argument is "data".
#pragma once
#include "tools/cli.h"

namespace adjoint {

int run_bench_data(const cli::Args& args);

}  // namespace adjoint
