// The programs of examples/ run as a reader would run them, and what they print is checked
// against what it should be: the transports against their closed forms, the similarity of
// transformed copies, the stitched model's scores against `adjoint eval`.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "analysis/stitching/stitched_model.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;
namespace fs = std::filesystem;

namespace {

struct ExampleRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr together
};

// Runs examples/<name> (as built) with `arguments` (shell words), its output through a log file.
ExampleRun run_example(const std::string& name, const std::string& arguments, const TempDir& dir) {
  const std::string program = std::string(ADJOINT_EXAMPLES_DIR) + "/" + name;
  REQUIRE_MESSAGE(fs::exists(program), "build the examples first: ", program);
  const std::string log = dir.file(name + ".log");
  const int status = std::system((program + " " + arguments + " > " + log + " 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(log)};
}

// The number captured by the first group of `pattern` in `text`; fails the test when absent.
double number_after(const std::string& text, const std::string& pattern) {
  std::smatch m;
  const bool found = std::regex_search(text, m, std::regex(pattern));
  REQUIRE_MESSAGE(found, "no match for /", pattern, "/ in:\n", text);
  return std::stod(m[1].str());
}

const bool have_fashion_mnist = fs::is_directory("/usr/share/datasets/fashion-mnist");

// A VGG-11-BN at width 1/8 trained for 20 steps on Fashion-MNIST (about a second).
std::string tiny_checkpoint(const TempDir& dir, const std::string& name, int seed) {
  const std::string out = dir.file(name);
  const CommandOutcome r = run_adjoint({"train", "--model", "vgg11_bn", "--width", "0.125", "--data", "fashion-mnist",
                                        "--epochs", "1", "--max-steps", "20", "--batch", "32", "--eval-limit", "200",
                                        "--seed", std::to_string(seed), "--out", out});
  REQUIRE_MESSAGE(r.code == 0, r.err);
  return out + "/checkpoint.safetensors";
}

}  // namespace

TEST_CASE("examples: two_layer_transports prints three different columns, each equal to its closed form") {
  TempDir dir;
  const ExampleRun r = run_example("two_layer_transports", "", dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  // Each column against its definition: the gradient against finite differences and its
  // closed form, the pullback and the soft pullback against theirs, computed in the
  // example from the weights.
  CHECK(number_after(r.output, R"(gradient vs finite differences: +max \|difference\| (\S+))") < 1e-3);
  CHECK(number_after(r.output, R"(gradient vs W1ᵀ diag\(Φ\(z\) \+ zφ\(z\)\) Rᵀ W2ᵀ e_c: +max \|difference\| (\S+))") < 1e-6);
  CHECK(number_after(r.output, R"(pullback vs W1ᵀ diag\(Φ\(z\)\) Rᵀ W2ᵀ e_c: +max \|difference\| (\S+))") < 1e-6);
  CHECK(number_after(r.output, R"(soft pullback vs W1ᵀ diag\(Φ\(z/τ\)\) Sᵀ W2ᵀ e_c: +max \|difference\| (\S+))") < 1e-6);
  // The table: six rows of gradient, pullback, soft pullback. Through GELU the pullback
  // leaves out the gate's derivative, and through the max-pool the soft pullback spreads
  // the route, so no two columns agree.
  const std::regex row(R"(x\[(\d)\] +(\S+) +(\S+) +(\S+))");
  int rows = 0;
  double gradient_vs_pullback = 0, pullback_vs_soft = 0, gradient_vs_soft = 0, largest_gradient = 0;
  for (auto it = std::sregex_iterator(r.output.begin(), r.output.end(), row); it != std::sregex_iterator(); ++it) {
    const double g = std::stod((*it)[2]), p = std::stod((*it)[3]), s = std::stod((*it)[4]);
    gradient_vs_pullback = std::max(gradient_vs_pullback, std::abs(g - p));
    pullback_vs_soft = std::max(pullback_vs_soft, std::abs(p - s));
    gradient_vs_soft = std::max(gradient_vs_soft, std::abs(g - s));
    largest_gradient = std::max(largest_gradient, std::abs(g));
    ++rows;
  }
  CHECK(rows == 6);
  CHECK(largest_gradient > 0.01);
  CHECK(gradient_vs_pullback > 0.01);
  CHECK(pullback_vs_soft > 0.01);
  CHECK(gradient_vs_soft > 0.01);
  CHECK(contains(r.output, "backward(f_c) fills W1's .grad: shape (8, 6)"));
}

TEST_CASE("examples: bilinear_similarity is 1 for the same function written differently, less for others") {
  TempDir dir;
  const ExampleRun r = run_example("bilinear_similarity", "", dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  for (const std::string metric : {"identity", "gaussian"}) {
    CAPTURE(metric);
    for (const std::string same : {"A against itself", "A, hidden units reversed", "A, left and right swapped"})
      CHECK(number_after(r.output, same + " +" + metric + R"( +(\S+))") == doctest::Approx(1.0).epsilon(1e-9));
    const double noisy = number_after(r.output, "A, weights \\+ 10% noise +" + metric + R"( +(\S+))");
    CHECK(noisy > 0.9);
    CHECK(noisy < 0.9999);
    CHECK(number_after(r.output, "A against an unrelated layer +" + metric + R"( +(\S+))") < 0.5);
  }

  // Two checkpoints of one bilinear MLP run: a model against itself is 1, against another seed less.
  const std::string a = dir.file("a.safetensors"), b = dir.file("b.safetensors");
  train_tiny_bilinear(1, [&](TrainOptions& o) { o.out_dir = dir.file("a"); });
  train_tiny_bilinear(2, [&](TrainOptions& o) { o.out_dir = dir.file("b"); });
  const std::string ca = dir.file("a") + "/checkpoint.safetensors", cb = dir.file("b") + "/checkpoint.safetensors";
  const ExampleRun self = run_example("bilinear_similarity", ca + " " + ca, dir);
  REQUIRE_MESSAGE(self.exit_code == 0, self.output);
  CHECK(number_after(self.output, R"(A against B +identity +(\S+))") == doctest::Approx(1.0));
  const ExampleRun other = run_example("bilinear_similarity", ca + " " + cb, dir);
  REQUIRE_MESSAGE(other.exit_code == 0, other.output);
  CHECK(number_after(other.output, R"(A against B +identity +(\S+))") < 0.99);
  // One argument is a usage error with one line.
  const ExampleRun bad = run_example("bilinear_similarity", ca, dir);
  CHECK(bad.exit_code == 1);
  CHECK(contains(bad.output, "give two checkpoints, or none"));
}

TEST_CASE("examples: explain_image explains a checkpoint's test image and writes the picture" *
          doctest::skip(!have_fashion_mnist)) {
  TempDir dir;
  const std::string checkpoint = tiny_checkpoint(dir, "A", 0);
  const std::string png = dir.file("explanation.png");
  const ExampleRun r = run_example("explain_image", checkpoint + " 3 " + png, dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, "test image 3 of fashion-mnist: label 1, predicted"));  // image 3 is a trouser
  const double predicted = number_after(r.output, R"(predicted (\d+))");
  CHECK((predicted >= 0 && predicted <= 9));
  CHECK(number_after(r.output, R"(sum \|map\| (\S+))") > 0);
  const double share = number_after(r.output, R"(positive share (\S+))");
  CHECK((share > 0 && share < 1));
  // A PNG of four 224×224 panels side by side, with their labels.
  const std::string bytes = read_text(png);
  REQUIRE(bytes.size() > 1000);
  CHECK(bytes.substr(1, 3) == "PNG");
  CHECK(number_after(r.output, R"(wrote .*explanation.png \((\d+)x)") >= 4 * 224);
  // An image that is not there: one line naming the data set's size, exit 1.
  const ExampleRun bad = run_example("explain_image", checkpoint + " 10000 " + png, dir);
  CHECK(bad.exit_code == 1);
  CHECK(contains(bad.output, "test image 10000 is out of range: fashion-mnist has 10000"));
}

TEST_CASE("examples: stitch_checkpoints stitches two checkpoints and scores them as adjoint eval does" *
          doctest::skip(!have_fashion_mnist)) {
  TempDir dir;
  const std::string a = tiny_checkpoint(dir, "A", 0), b = tiny_checkpoint(dir, "B", 1);
  const std::string stitch = dir.file("stitch.safetensors");
  const ExampleRun r = run_example("stitch_checkpoints", a + " " + b + " 3 " + stitch, dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(contains(r.output, "after block 3 'features.11'"));
  // A's and B's accuracies are those `adjoint eval` gives on the same 1000 test images.
  for (const auto& [model, path] : std::vector<std::pair<std::string, std::string>>{{"A", a}, {"B", b}}) {
    const CommandOutcome e = run_adjoint({"eval", "--checkpoint", path, "--limit", "1000"});
    REQUIRE(e.code == 0);
    CHECK(number_after(r.output, model + R"( (\S+)%)") == doctest::Approx(number_after(e.out, R"(accuracy (\S+)%)")));
  }
  const double end = number_after(r.output, R"(B (\S+)%)");
  const double trained = number_after(r.output, R"((\S+)% after \d+ steps of slm)");
  CHECK(number_after(r.output, R"(relative score \(stitched / B\): (\S+))") ==
        doctest::Approx(trained / end).epsilon(2e-3));
  CHECK(trained > 20.0);  // far above chance (10%): the stitch carries A's features into B
  CHECK(number_after(r.output, R"(after (\d+) steps of slm)") == 16);  // 512 images, batch 64, 2 epochs
  // The stitch file names what it joins, so that `adjoint predict --stitch` can run it.
  const StitchFile file = read_stitch_file(stitch);
  CHECK(file.front == a);
  CHECK(file.end == b);
  CHECK((file.front_block == 3 && file.end_block == 3));
}
