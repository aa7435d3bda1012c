// `adjoint tensorsim --check-mc N --seed S`: runs of different seeds are independent batches
// (what analysis/experiments/lm_exact_check.sh pools), a seed repeats its numbers, and each
// inner product's estimate and standard error is written apart.
#include <doctest/doctest.h>

#include <cctype>
#include <cmath>
#include <map>
#include <string>

#include "engine/data/open.h"
#include "engine/random.h"
#include "models/checkpoint.h"
#include "models/model.h"
#include "models/training.h"
#include "tests/support.h"

using namespace adjoint;

namespace {

// tensorsim.csv's first two columns, by measure.
std::map<std::string, double> csv_values(const std::string& text) {
  std::map<std::string, double> out;
  size_t start = 0;
  while (start < text.size()) {
    const size_t end = text.find('\n', start), comma = text.find(',', start);
    const std::string line = text.substr(start, end - start);
    if (comma < end) {
      const size_t next = line.find(',', comma - start + 1);
      const std::string value = line.substr(comma - start + 1, next - (comma - start + 1));
      if (!value.empty() && (std::isdigit(value[0]) || value[0] == '-')) out[line.substr(0, comma - start)] = std::stod(value);
    }
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return out;
}

}  // namespace

TEST_CASE("tensorsim --seed: independent batches of --check-mc, each inner product with its standard error") {
  adjoint::testing::TempDir dir;
  DataSource data = open_data("modadd:5");
  ModelConfig c;
  c.arch = "bilinear_mlp", c.hidden = 4, c.depth = 2;
  fit_config_to_data(c, data);
  Generator g1(1), g2(2);
  save_checkpoint(dir.file("a.safetensors"), *make_model(c, g1), nullptr, 0, 0, {{"data.spec", "modadd:5"}});
  save_checkpoint(dir.file("b.safetensors"), *make_model(c, g2), nullptr, 0, 0, {{"data.spec", "modadd:5"}});
  auto run = [&](const std::string& seed, const std::string& out) {
    const adjoint::testing::CommandOutcome o =
        adjoint::testing::run_adjoint({"tensorsim", dir.file("a.safetensors"), dir.file("b.safetensors"), "--no-baselines",
                                       "--check-mc", "20000", "--seed", seed, "--out", dir.file(out)});
    REQUIRE_MESSAGE(o.code == 0, o.err);
    return csv_values(adjoint::testing::read_text(dir.file(out + "/tensorsim.csv")));
  };
  const auto first = run("1", "s1"), again = run("1", "s1_again"), second = run("2", "s2");
  for (const char* name : {"ab", "aa", "bb"}) {
    const std::string key = std::string("monte_carlo_inner_") + name;
    REQUIRE(first.count(key) == 1);
    REQUIRE(first.count(key + "_standard_error") == 1);
    CHECK(first.at(key + "_standard_error") > 0);
    CHECK(first.at(key) == again.at(key));
    CHECK(first.at(key) != second.at(key));
    // Two independent batches agree within their errors.
    CHECK(std::abs(first.at(key) - second.at(key)) <
          5 * std::hypot(first.at(key + "_standard_error"), second.at(key + "_standard_error")));
  }
  const adjoint::testing::CommandOutcome bad = adjoint::testing::run_adjoint(
      {"tensorsim", dir.file("a.safetensors"), dir.file("b.safetensors"), "--no-baselines", "--seed", "-3"});
  CHECK(bad.code == 2);
  CHECK(bad.err.find("--seed must be 0 or more, got -3") != std::string::npos);
}
