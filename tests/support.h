// Shared test machinery: finite-difference gradient checks, PyTorch golden fixtures,
// tensor comparison with a readable failure message, fresh leaves and temporary folders.
#pragma once
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/io/safetensors.h"
#include "engine/tensor.h"
#include "engine/transport.h"
#include "models/training.h"

namespace adjoint::testing {

// The inputs of a function under test, and such a function.
using Args = std::vector<Tensor>;
using Fn = std::function<Tensor(const Args&)>;

struct GradCheckOptions {
  double eps = 1e-2;   // central-difference step (inputs are float32)
  double rtol = 2e-2;  // |analytic - numeric| <= atol + rtol * |numeric|, elementwise
  double atol = 2e-3;
  uint64_t seed = 1234;  // seeds the random cotangent
};

// Checks the Gradient transport of f at `inputs` against central differences of
// ⟨u, f(x)⟩ with a random cotangent u, accumulated in double. Fails (doctest CHECK) on
// any mismatch and when the numerical gradient of an input is identically zero.
// Only the inputs flagged in `check_input` (default all) are perturbed.
void check_gradients(const Fn& f, const std::vector<Tensor>& inputs, GradCheckOptions options = {},
                     std::vector<bool> check_input = {});

// The fixture tests/goldens/<name>.safetensors, read once per process.
const SafetensorsFile& fixture(const std::string& name);
// A tensor of a fixture, with an error naming the fixture and tensor when missing.
Tensor golden(const std::string& fixture_name, const std::string& tensor_name);

// CHECKs that `actual` matches `expected` in shape and, elementwise, within
// atol + rtol·|expected|; the message names `what` and the worst element.
void check_close(const Tensor& actual, const Tensor& expected, double rtol, double atol, const std::string& what);

// The largest |entry| (0 for an empty tensor).
double max_abs(const Tensor& t);

// A random tensor with entries in [lo, hi) from a seeded generator.
Tensor random_tensor(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f);

// A batch of maps (N, C, H, W) as (N, H, W, C), contiguous, and back: the channels-last ops'
// layout beside the reference ops' one.
Tensor channels_last(const Tensor& nchw);
Tensor channels_first(const Tensor& nhwc);

// The tests' small BatchNorm model: a ResNet-18 of `width` on grey size×size images.
ModelConfig grey_resnet18(double width, int64_t size, int64_t classes);

// How many prepared forms (Tensor::prepared) a tensor's storage keeps.
size_t forms_kept(const Tensor& t);

// Kept forms follow every write to the weights: an eval-mode model of `config` (drawn from
// `seed`) runs x, then an SGD step, then a load of other weights (those whose names contain
// `rescaled` halved); after each, its outputs equal those of a fresh model given the same
// weights, and after the step no parameter keeps a form. `forms_expected`: the first pass must
// have kept some. Returns the model, with the loaded weights, for further checks.
std::shared_ptr<Model> check_kept_forms_follow_writes(const ModelConfig& config, uint64_t seed, const Tensor& x,
                                                      const std::string& rescaled, bool forms_expected);
// n grey size×size images of N(0, 1) noise from `seed`, labelled i mod classes, indices 0…n−1.
Batch random_grey_batch(int64_t n, int64_t size, int64_t classes, uint64_t seed);

// Fresh leaves holding the values of `values` (each a copy, requiring grad).
std::vector<Tensor> leaves(const std::vector<Tensor>& values);

// What a command printed and returned.
struct CommandOutcome {
  int code = -1;
  std::string out, err;  // everything written to the stdout and stderr file descriptors
};

// Runs `adjoint <words…>` in this process through cli::run, with the real commands of
// tools/ linked in (train, predict, eval, explain, ...). Output is captured at the file
// descriptor level, so printf and std::cout alike end up in `out`. Unless the words set
// --threads, the current thread count is passed on.
CommandOutcome run_adjoint(std::vector<std::string> words);
// The same without capturing: cli::run's exit code, the output going where it goes.
int run_adjoint_words(std::vector<std::string> words);

bool contains(const std::string& text, const std::string& part);

// The whole text of a file (empty when it cannot be read; the caller's checks say so).
std::string read_text(const std::filesystem::path& path);

// A fresh folder under the system temp dir, unique to this process and object, removed
// with everything in it at scope exit.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  // The path of `name` inside the folder (the file need not exist).
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Runs the built `adjoint` executable, not in-process as run_adjoint does, with `arguments`
// (shell words; stdout and stderr together through `dir`/cli.log): for commands that start
// processes of their own from their executable. exit_code is -1 when it did not exit.
struct ProgramRun {
  int exit_code = -1;
  std::string output;
};
ProgramRun run_adjoint_program(const std::string& arguments, const TempDir& dir);

// A bilinear MLP (hidden 8, seed `seed`) trained on modadd:7 with AdamW at a constant lr 1e-2:
// 15 training pairs, batch 4, so 3 steps an epoch. `adjust` sets anything else (epochs,
// out_dir, keep_checkpoints, continue_from, ...) before training. For tests of runs and of
// the analyses that read their checkpoints.
std::shared_ptr<Model> train_tiny_bilinear(uint64_t seed, const std::function<void(TrainOptions&)>& adjust);

// 320 train and 60 test images of 1×8×8 in Fashion-MNIST's files under `dir`: noise, and a
// bright 2×2 square whose position is the label (0…9). Returns the data spec.
std::string write_square_images(const TempDir& dir);

// The `adjoint` executable this test binary runs (tests/executable_path.cpp): the build with
// MPI's, or the build without MPI's.
std::string adjoint_exe();

// Whether mpirun is on the PATH.
bool mpirun_available();
// True, with a doctest MESSAGE saying why, when this build or machine cannot run mpirun tests.
bool mpi_tests_skipped();

// `adjoint ARGS` in one process (ranks 0: run_adjoint_program), or under mpirun with `ranks`
// ranks (on loopback, oversubscribing the cores, as root where the tests run as root);
// `environment` is passed to every rank (`-x NAME=VALUE`). Output through `dir`/mpirun.log.
// `limit_seconds` > 0: the job is ended after that long (exit code 124), so that a test of a
// deadline fails rather than hangs when the deadline does not work.
ProgramRun adjoint_run(const std::string& args, int ranks, const TempDir& dir, const std::string& environment = "",
                       int limit_seconds = 0);

}  // namespace adjoint::testing
