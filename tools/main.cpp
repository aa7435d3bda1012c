// The `adjoint` executable. Each subcommand registers itself from its own file
// (tools/cli.h); main only hands over to the dispatcher.
#include "tools/cli.h"

int main(int argc, char** argv) { return adjoint::cli::run(argc, argv); }
