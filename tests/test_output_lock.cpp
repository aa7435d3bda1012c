// Two runs into one output folder at once: every command that writes a folder holds an
// exclusive lock on it (tools/folder_lock.h), and the second run refuses in one line that
// names the holder, before writing anything. Here the holder is this test process and the
// second run the real `adjoint` executable (another process), or the command run in this
// process (an flock conflicts with a second open of the same file in one process too).
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <string>

#include "tests/support.h"
#include "tools/folder_lock.h"

using namespace adjoint;
using adjoint::testing::CommandOutcome;
using adjoint::testing::TempDir;
using adjoint::testing::contains;
using adjoint::testing::run_adjoint;
namespace fs = std::filesystem;

namespace {

// The one line a run into a held folder prints, naming this process as the holder.
void check_refused(int code, const std::string& output, const std::string& dir) {
  CAPTURE(output);
  CHECK(code == 1);
  CHECK(contains(output, "adjoint: error: " + dir + " is in use by another run (pid " + std::to_string(::getpid()) + ": "));
  CHECK(contains(output, "give another --out"));
}

}  // namespace

TEST_CASE("output lock: a second train into a held folder refuses in one line naming the holder") {
  TempDir dir;
  const std::string out = dir.file("run");
  const std::string train = "train --model bilinear_mlp --hidden 8 --data modadd:7 --batch 4 --epochs 1 --threads 1 --out " + out;
  {
    const cli::FolderLock held(out);
    const adjoint::testing::ProgramRun second = adjoint::testing::run_adjoint_program(train, dir);
    check_refused(second.exit_code, second.output, out);
    CHECK_FALSE(fs::exists(out + "/checkpoint.safetensors"));  // it wrote nothing
  }
  // Once the holder is gone the folder is free again, and the lock names the new holder.
  const adjoint::testing::ProgramRun after = adjoint::testing::run_adjoint_program(train, dir);
  CAPTURE(after.output);
  CHECK(after.exit_code == 0);
  CHECK(fs::exists(out + "/checkpoint.safetensors"));
  CHECK(contains(adjoint::testing::read_text(out + "/.lock"), "train --model bilinear_mlp --hidden 8"));
  // The lock file is no result: the folder's page does not link it.
  CHECK_FALSE(contains(adjoint::testing::read_text(out + "/index.html"), ".lock"));
}

TEST_CASE("output lock: stitch, tensorsim --run and reproduce refuse a held folder too") {
  TempDir dir;
  const std::string run = dir.file("run");
  adjoint::testing::train_tiny_bilinear(1, [&](TrainOptions& o) {
    o.out_dir = run;
    o.keep_checkpoints = "every:2";
  });
  const std::string checkpoint = run + "/checkpoint.safetensors";
  const std::string out = dir.file("out");
  const cli::FolderLock held(out);
  const auto refused = [&](const std::vector<std::string>& words) {
    const CommandOutcome r = run_adjoint(words);
    CAPTURE(words.front());
    check_refused(r.code, r.err, out);
  };
  refused({"tensorsim", "--run", run, "--out", out});
  refused({"tensorsim", checkpoint, checkpoint, "--out", out});
  refused({"stitch", "--front", checkpoint, "--end", checkpoint, "--blocks", "1", "--out", out});
  refused({"reproduce", "stitching", "--out", out});
  refused({"train", "--model", "bilinear_mlp", "--hidden", "8", "--data", "modadd:7", "--out", out});
  // Nothing but the lock file was written.
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(out)) CHECK(e.path().filename() == ".lock");
}
