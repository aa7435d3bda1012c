// The `adjoint` executable under a tight address-space limit (ulimit -v), as on a shared
// machine or in a container: a command prints its answer and exits. OpenBLAS's pthread
// build starts a pool of workers when it is loaded, and under such a limit a worker can
// spin forever failing to map its buffer while exit waits for it; the executable keeps
// OpenBLAS from starting that pool (tools/main.cpp). The limit is applied by the shell that
// runs the program, under `timeout`, so a hang fails the test rather than stalling the suite.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;

namespace {

// `adjoint ARGUMENTS` under `ulimit -v` of `kib` KiB, killed after 20 s: its exit code (124
// when it was killed) and output.
ProgramRun run_limited(const std::string& arguments, int kib, const TempDir& dir) {
  const std::string log = dir.file("limited.log");
  const std::string script = "ulimit -v " + std::to_string(kib) + " && exec timeout -k 5 20 " + adjoint_exe() + " " +
                             arguments + " > " + log + " 2>&1";
  const int status = std::system(("bash -c '" + script + "'").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(log)};
}

}  // namespace

TEST_CASE("memory limit: --help and info exit under ulimit -v of 200 MB") {
#if defined(__SANITIZE_ADDRESS__)
  // AddressSanitizer reserves terabytes of address space for its shadow memory at start-up,
  // so no program built with it starts under an address-space limit.
  MESSAGE("skipped: an AddressSanitizer build cannot start under ulimit -v");
  return;
#endif
  TempDir dir;
  const std::string run = dir.file("run");
  train_tiny_bilinear(1, [&](TrainOptions& o) { o.out_dir = run; });
  constexpr int kib = 200 * 1000;
  const ProgramRun help = run_limited("--help", kib, dir);
  CAPTURE(help.output);
  CHECK(help.exit_code == 0);
  CHECK(contains(help.output, "usage: adjoint"));
  const ProgramRun info = run_limited("info " + run + "/checkpoint.safetensors", kib, dir);
  CAPTURE(info.output);
  CHECK(info.exit_code == 0);
  CHECK(contains(info.output, "bilinear_mlp"));
}
