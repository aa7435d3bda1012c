// `adjoint bench tensorsim`: the cost of tensor similarity's closed forms and second-moment
// recursion beside a Monte-Carlo estimate of the same number (tools/bench_tensorsim.cpp).
#pragma once
#include "tools/cli.h"

namespace adjoint {

int run_bench_tensorsim(const cli::Args& args);

}  // namespace adjoint
