// `adjoint bench explain`: the cost of the explanation methods relative to the gradient
// (tools/bench_explain.cpp). bench.cpp hands over to it when its first argument is "explain".
#pragma once
#include "tools/cli.h"

namespace adjoint {

int run_bench_explain(const cli::Args& args);

}  // namespace adjoint
