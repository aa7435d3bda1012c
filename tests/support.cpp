#include "tests/support.h"

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>

#include "engine/autograd.h"
#include "engine/data/idx.h"
#include "engine/distributed/ranks.h"
#include "engine/error.h"
#include "engine/optim.h"
#include "engine/random.h"
#include "engine/threads.h"
#include "models/checkpoint.h"
#include "models/model.h"
#include "ops/elementwise.h"
#include "ops/layout.h"
#include "ops/reduce.h"
#include "tools/cli.h"

namespace adjoint::testing {

double max_abs(const Tensor& t) {
  double m = 0;
  for (float v : t.to_vector()) m = std::max(m, double(std::fabs(v)));
  return m;
}

size_t forms_kept(const Tensor& t) { return t.impl()->storage->prepared().size(); }

std::shared_ptr<Model> check_kept_forms_follow_writes(const ModelConfig& config, uint64_t seed, const Tensor& x,
                                                      const std::string& rescaled, bool forms_expected) {
  Generator gen(seed);
  auto model = make_model(config, gen);
  model->train(false);
  const auto same_as_fresh = [&] {
    Generator other(seed + 1);
    auto fresh = make_model(config, other);
    std::map<std::string, Tensor> state;
    for (const auto& [name, t] : model->state_dict()) state[name] = t.clone();
    load_state_dict(*fresh, state, "the stepped weights");
    fresh->train(false);
    NoGrad off;
    const std::vector<float> ours = model->forward(x).to_vector();
    CHECK(ours == fresh->forward(x).to_vector());
    return ours;
  };
  std::vector<float> first;
  {
    NoGrad off;
    first = model->forward(x).to_vector();
  }
  CHECK(same_as_fresh() == first);
  size_t kept = 0;
  for (const auto& [name, p] : model->named_parameters()) kept += forms_kept(p);
  if (forms_expected) CHECK(kept > 0);
  Sgd sgd(model->named_parameters(), SgdOptions{0.05, 0.0, 0.0, false});
  backward(sum(model->forward(x)));
  sgd.step();
  // The step wrote every weight: nothing kept from the old values stays in memory.
  for (const auto& [name, p] : model->named_parameters()) {
    CAPTURE(name);
    CHECK(forms_kept(p) == 0);
  }
  CHECK(same_as_fresh() != first);
  std::map<std::string, Tensor> other;
  for (const auto& [name, t] : model->state_dict()) other[name] = t.clone();
  for (auto& [name, t] : other)
    if (name.find(rescaled) != std::string::npos) t = mul_scalar(t, 0.5f);
  load_state_dict(*model, other, "other weights");
  same_as_fresh();
  return model;
}

ModelConfig grey_resnet18(double width, int64_t size, int64_t classes) {
  ModelConfig c;
  c.arch = "resnet18";
  c.width = width;
  c.in_channels = 1;
  c.image_size = size;
  c.num_classes = classes;
  return c;
}

Batch random_grey_batch(int64_t n, int64_t size, int64_t classes, uint64_t seed) {
  Generator gen(seed);
  Batch batch;
  batch.inputs = normal({n, 1, size, size}, 0.0f, 1.0f, gen);
  for (int64_t i = 0; i < n; ++i) batch.labels.push_back(i % classes), batch.indices.push_back(i);
  return batch;
}

Tensor random_tensor(const Shape& shape, uint64_t seed, float lo, float hi) {
  Generator gen(seed);
  return uniform(shape, lo, hi, gen);
}

Tensor channels_last(const Tensor& nchw) { return permute(nchw, {0, 2, 3, 1}).contiguous(); }
Tensor channels_first(const Tensor& nhwc) { return permute(nhwc, {0, 3, 1, 2}).contiguous(); }

std::vector<Tensor> leaves(const std::vector<Tensor>& values) {
  std::vector<Tensor> out;
  for (const Tensor& v : values) out.push_back(v.clone().requires_grad_());
  return out;
}

TempDir::TempDir() {
  static std::atomic<int> counter{0};
  path_ = std::filesystem::temp_directory_path() / cat("adjoint_test_", ::getpid(), "_", counter++);
  std::filesystem::remove_all(path_);  // a leftover of an earlier process with the same id
  std::filesystem::create_directories(path_);
}

TempDir::~TempDir() {
  std::error_code ignored;  // a destructor must not throw
  std::filesystem::remove_all(path_, ignored);
}

namespace {
// ⟨u, f(x)⟩ in double.
double project(const Fn& f, const std::vector<Tensor>& inputs, const std::vector<float>& u) {
  Tensor out = f(inputs);
  std::vector<float> v = out.to_vector();
  double s = 0;
  for (size_t i = 0; i < v.size(); ++i) s += double(u[i]) * double(v[i]);
  return s;
}
}  // namespace

void check_gradients(const Fn& f, const std::vector<Tensor>& inputs, GradCheckOptions options,
                     std::vector<bool> check_input) {
  if (check_input.empty()) check_input.assign(inputs.size(), true);
  Tensor probe;
  {
    NoGrad no_grad;
    probe = f(inputs);
  }
  Tensor u = random_tensor(probe.shape(), options.seed);
  std::vector<float> uv = u.to_vector();
  std::vector<Tensor> analytic = vjp(f, inputs, u, Transport::gradient());

  NoGrad no_grad;
  for (size_t k = 0; k < inputs.size(); ++k) {
    if (!check_input[k]) continue;
    Tensor x = inputs[k].clone();
    std::vector<Tensor> args = inputs;
    args[k] = x;
    // Each write through data() of its own, so that the version of x moves with it: ops
    // keep forms prepared from their inputs per version (engine/tensor.h).
    const auto set = [&](int64_t i, float value) { x.data()[i] = value; };
    std::vector<float> a = analytic[k].to_vector();
    double numeric_norm = 0, worst = 0;
    int64_t worst_at = -1, bad = 0;
    double worst_num = 0, worst_ana = 0;
    for (int64_t i = 0; i < x.numel(); ++i) {
      const float saved = std::as_const(x).data()[i];
      set(i, static_cast<float>(saved + options.eps));
      const double plus = project(f, args, uv);
      set(i, static_cast<float>(saved - options.eps));
      const double minus = project(f, args, uv);
      set(i, saved);
      const double numeric = (plus - minus) / (2 * options.eps);
      numeric_norm += numeric * numeric;
      const double err = std::abs(a[i] - numeric);
      const double allowed = options.atol + options.rtol * std::abs(numeric);
      if (err > allowed) ++bad;
      if (err - allowed > worst) worst = err - allowed, worst_at = i, worst_num = numeric, worst_ana = a[i];
    }
    INFO("input ", k, " of shape ", to_string(x.shape()), ": ", bad, " mismatches; worst at ", worst_at,
         " analytic ", worst_ana, " numeric ", worst_num);
    CHECK(bad == 0);
    CHECK_MESSAGE(numeric_norm > 0, "numerical gradient of input ", k, " is identically zero");
  }
}

const SafetensorsFile& fixture(const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, SafetensorsFile> cache;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = cache.find(name);
  if (it == cache.end())
    it = cache.emplace(name, read_safetensors(std::string(ADJOINT_SOURCE_DIR) + "/tests/goldens/" + name +
                                              ".safetensors"))
             .first;
  return it->second;
}

Tensor golden(const std::string& fixture_name, const std::string& tensor_name) {
  const SafetensorsFile& file = fixture(fixture_name);
  auto it = file.tensors.find(tensor_name);
  check(it != file.tensors.end(), "fixture ", fixture_name, ": no tensor named '", tensor_name, "'");
  return it->second;
}

void check_close(const Tensor& actual, const Tensor& expected, double rtol, double atol, const std::string& what) {
  INFO(what, ": shapes ", to_string(actual.shape()), " vs expected ", to_string(expected.shape()));
  REQUIRE(actual.shape() == expected.shape());
  std::vector<float> a = actual.to_vector(), e = expected.to_vector();
  int64_t bad = 0, worst_at = -1;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double err = std::abs(double(a[i]) - double(e[i]));
    const double allowed = atol + rtol * std::abs(double(e[i]));
    if (!(err <= allowed)) ++bad;  // NaN counts as bad
    if (!(err - allowed <= worst)) worst = std::isnan(err) ? INFINITY : err - allowed, worst_at = int64_t(i);
  }
  INFO(what, ": ", bad, " of ", a.size(), " elements differ; worst at ", worst_at,
       worst_at >= 0 ? cat(" (actual ", a[worst_at], ", expected ", e[worst_at], ")") : std::string());
  CHECK(bad == 0);
}

std::shared_ptr<Model> train_tiny_bilinear(uint64_t seed, const std::function<void(TrainOptions&)>& adjust) {
  const DataSource data = open_data("modadd:7");
  ModelConfig config;
  config.arch = "bilinear_mlp", config.hidden = 8;
  fit_config_to_data(config, data);
  Generator gen(seed);
  auto model = make_model(config, gen);
  TrainOptions o;
  o.optimizer = "adamw", o.lr = 1e-2, o.weight_decay = 0, o.schedule = "constant";
  o.batch_size = 4, o.epochs = 2, o.augment = false, o.seed = seed;
  adjust(o);
  train(*model, data, o);
  return model;
}

namespace {

// Points a file descriptor (1 or 2) at a fresh temporary file until destroyed, then
// restores it; text() is what was written meanwhile.
class CaptureDescriptor {
 public:
  explicit CaptureDescriptor(int fd) : fd_(fd), file_(std::tmpfile()) {
    std::fflush(nullptr);
    saved_ = ::dup(fd_);
    ::dup2(::fileno(file_), fd_);
  }
  ~CaptureDescriptor() {
    restore();
    std::fclose(file_);
  }
  std::string text() {
    restore();
    std::string out;
    std::rewind(file_);
    char buffer[4096];
    for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, file_)) > 0;) out.append(buffer, n);
    return out;
  }

 private:
  void restore() {
    if (saved_ < 0) return;
    std::fflush(nullptr);
    std::cout.flush();
    std::cerr.flush();
    ::dup2(saved_, fd_);
    ::close(saved_);
    saved_ = -1;
  }
  int fd_;
  std::FILE* file_;
  int saved_ = -1;
};

}  // namespace

int run_adjoint_words(std::vector<std::string> words) {
  bool sets_threads = false;
  for (const std::string& w : words) sets_threads = sets_threads || w.rfind("--threads", 0) == 0;
  if (!sets_threads) words.insert(words.begin(), "--threads=" + std::to_string(num_threads()));
  words.insert(words.begin(), "adjoint");
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  return cli::run(static_cast<int>(argv.size()), argv.data());
}

CommandOutcome run_adjoint(std::vector<std::string> words) {
  CommandOutcome o;
  CaptureDescriptor out(1), err(2);
  o.code = run_adjoint_words(std::move(words));
  o.out = out.text();
  o.err = err.text();
  return o;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

std::string read_text(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

ProgramRun run_adjoint_program(const std::string& arguments, const TempDir& dir) {
  const std::string log = dir.file("cli.log");
  const int status = std::system((adjoint_exe() + " " + arguments + " > " + log + " 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(log)};
}

std::string write_square_images(const TempDir& dir) {
  auto write_split = [&](const std::string& prefix, uint32_t n, uint32_t salt) {
    std::vector<uint8_t> pixels(size_t(n) * 64), labels(n);
    for (uint32_t i = 0; i < n; ++i) {
      labels[i] = uint8_t(i % 10);
      for (uint32_t p = 0; p < 64; ++p) {
        const bool square = p / 16 == labels[i] / 4 && (p % 8) / 2 == labels[i] % 4;
        pixels[size_t(i) * 64 + p] = square ? 230 : uint8_t(((i + salt) * 2654435761u + p * 40503u) >> 26);
      }
    }
    write_idx(dir.file(prefix + "-images-idx3-ubyte"), IdxArray{{n, 8, 8}, pixels});
    write_idx(dir.file(prefix + "-labels-idx1-ubyte"), IdxArray{{n}, labels});
  };
  write_split("train", 320, 0);
  write_split("t10k", 60, 7);
  return "fashion-mnist:" + dir.path().string();
}

bool mpirun_available() { return std::system("command -v mpirun > /dev/null 2>&1") == 0; }

ProgramRun adjoint_run(const std::string& args, int ranks, const TempDir& dir, const std::string& environment,
                       int limit_seconds) {
  if (ranks == 0) return run_adjoint_program(args, dir);
  const std::string log = dir.file("mpirun.log");
  const std::string limit = limit_seconds > 0 ? "timeout -k 10 " + std::to_string(limit_seconds) + " " : "";
  const std::string command = limit + "mpirun --allow-run-as-root --oversubscribe --mca btl self,vader -n " +
                              std::to_string(ranks) + (environment.empty() ? "" : " -x " + environment) + " " +
                              adjoint_exe() + " " + args + " > " + log + " 2>&1";
  const int status = std::system(command.c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(log)};
}

bool mpi_tests_skipped() {
  if (distributed::built_with_mpi() && mpirun_available()) return false;
  MESSAGE("skipped: ", std::string(distributed::built_with_mpi() ? "no mpirun on PATH" : "this build has no MPI"),
          " (install libopenmpi-dev openmpi-bin and rebuild)");
  return true;
}

}  // namespace adjoint::testing
