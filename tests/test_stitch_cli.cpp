// `adjoint stitch` end to end: two tiny ResNets trained here on a Fashion-MNIST-shaped
// folder whose class is a bright square's position, stitched by the real executable
// under all three protocols; the tables, stitches and IRIs it writes; a rerun that
// recomputes nothing; and the one-line errors for bad input.
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/data/idx.h"
#include "engine/data/open.h"
#include "engine/json.h"
#include "engine/safetensors.h"
#include "models/checkpoint.h"
#include "models/training.h"
#include "tests/support.h"

using namespace adjoint;
using adjoint::testing::TempDir;
using adjoint::testing::read_text;
namespace fs = std::filesystem;

namespace {

// 300 train and 60 test images of 1×8×8: faint noise, and a bright 2×2 square in cell
// (label mod 4, label / 4) of a 4×4 grid of cells.
void write_square_positions(const TempDir& dir) {
  auto write_split = [&](const std::string& prefix, uint32_t n, uint32_t salt) {
    std::vector<uint8_t> pixels(size_t(n) * 64), labels(n);
    for (uint32_t i = 0; i < n; ++i) {
      labels[i] = uint8_t(i % 10);
      for (uint32_t p = 0; p < 64; ++p) {
        const uint32_t row = p / 8, col = p % 8;
        const bool square = row / 2 == labels[i] / 4 && col / 2 == labels[i] % 4;
        pixels[size_t(i) * 64 + p] = square ? 230 : uint8_t(((i + salt) * 2654435761u + p * 40503u) >> 26);
      }
    }
    write_idx(dir.file(prefix + "-images-idx3-ubyte"), IdxArray{{n, 8, 8}, pixels});
    write_idx(dir.file(prefix + "-labels-idx1-ubyte"), IdxArray{{n}, labels});
  };
  write_split("train", 300, 0);
  write_split("t10k", 60, 7);
}

std::string train_tiny(const DataSource& data, const TempDir& dir, const std::string& name, uint64_t seed) {
  ModelConfig c;
  c.arch = "resnet18";
  c.width = 0.0625;
  fit_config_to_data(c, data);
  Generator gen(seed);
  auto model = make_model(c, gen);
  TrainOptions o;
  o.optimizer = "adamw";
  o.lr = 1e-2;
  o.weight_decay = 0;
  o.epochs = 2;
  o.batch_size = 50;
  o.augment = false;
  o.seed = seed;
  o.out_dir = dir.file(name);
  train(*model, data, o);
  return o.out_dir + "/checkpoint.safetensors";
}

struct Run {
  int exit_code = -1;
  std::string output;
};

Run adjoint_cli(const std::string& arguments, const TempDir& dir) {
  const std::string log = dir.file("cli.log");
  const int status = std::system((std::string(ADJOINT_EXE) + " " + arguments + " --threads 2 > " + log + " 2>&1").c_str());
  std::ifstream in(log);
  std::stringstream s;
  s << in.rdbuf();
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, s.str()};
}

int64_t count_lines(const std::string& text) { return std::count(text.begin(), text.end(), '\n'); }

// The error lines of a run's output ("adjoint: error: ...").
std::vector<std::string> error_lines(const std::string& output) {
  std::vector<std::string> lines;
  std::stringstream in(output);
  for (std::string line; std::getline(in, line);)
    if (line.find("error") != std::string::npos) lines.push_back(line);
  return lines;
}

}  // namespace

TEST_CASE("adjoint stitch: a restartable sweep over blocks, objectives and protocols, and its bad input") {
  REQUIRE_MESSAGE(fs::exists(ADJOINT_EXE), "build the adjoint executable first: ", ADJOINT_EXE);
  TempDir dir;
  write_square_positions(dir);
  const DataSource data = open_data("fashion-mnist:" + dir.path().string());
  const std::string a = train_tiny(data, dir, "A", 1), b = train_tiny(data, dir, "B", 2);
  const std::string out = dir.file("sweep");
  const std::string common = "stitch --front " + a + " --end " + b + " --pairs 2:2,4:3 --train-images 100 --epochs 2 --batch 25";
  const std::string sweep = common + " --objectives hlm,fula --protocol standard,control,invariance --iri-images 20"
                                     " --iri-steps 40 --out " + out;
  const Run first = adjoint_cli(sweep, dir);
  REQUIRE_MESSAGE(first.exit_code == 0, first.output);
  CHECK(first.output.find("[12/12] front4_end3_fula_invariance") != std::string::npos);
  CHECK(first.output.find("IRIs of " + a + " block 2: relative distance median") != std::string::npos);

  const std::string csv = read_text(out + "/results.csv");
  CHECK(count_lines(csv) == 13);  // header + 2 pairs × 2 objectives × 3 protocols
  CHECK(csv.find("2,layer1.1,2,layer1.1,hlm,standard,100,") != std::string::npos);
  CHECK(csv.find("4,layer2.1,3,layer2.0,fula,invariance,20,") != std::string::npos);
  const Json results = parse_json(read_text(out + "/results.json"));
  REQUIRE(results.find("cells")->size() == 12);
  for (const Json& cell : results.find("cells")->as_array()) {
    const double stitched = cell.find("stitched_accuracy")->as_number(), end = cell.find("end_accuracy")->as_number();
    CHECK(stitched >= 0.0);
    CHECK(stitched <= 1.0);
    CHECK(cell.find("relative_score")->as_number() == doctest::Approx(stitched / end));
    if (cell.find("protocol")->as_string() != "standard") CHECK(cell.find("end_agrees_on_iris")->is_number());
  }
  CHECK(read_text(out + "/results.md").find("| 4 layer2.1 | 3 layer2.0 | fula | invariance |") != std::string::npos);
  const SafetensorsFile stitch = read_safetensors(out + "/stitches/front2_end2_hlm_standard.safetensors");
  CHECK(stitch.tensors.at("weight").shape() == Shape{4, 4});
  CHECK(read_safetensors(out + "/iris/front_block_4.safetensors").tensors.at("inputs").shape() == Shape{20, 1, 8, 8});

  // A rerun reads every finished cell back: nothing is retrained, no file changes.
  const std::string weights_before = read_text(out + "/stitches/front4_end3_fula_control.safetensors");
  fs::remove(out + "/cells/front4_end3_fula_control.json");  // as if interrupted before this cell finished
  const Run again = adjoint_cli(sweep, dir);
  REQUIRE_MESSAGE(again.exit_code == 0, again.output);
  CHECK(again.output.find("IRIs of " + a + " block 4: read ") != std::string::npos);
  size_t reused = 0;
  for (size_t at = again.output.find("done before"); at != std::string::npos; at = again.output.find("done before", at + 1))
    ++reused;
  CHECK(reused == 11);
  CHECK(again.output.find("[10/12] front4_end3_fula_control: stitched") != std::string::npos);
  CHECK(read_text(out + "/stitches/front4_end3_fula_control.safetensors") == weights_before);  // same seed, same stitch
  CHECK(count_lines(read_text(out + "/results.csv")) == 13);

  // Bad input: one line naming the models, blocks and shapes.
  Run bad = adjoint_cli("stitch --front " + a + " --end " + b + " --blocks 9 --out " + dir.file("bad"), dir);
  CHECK(bad.exit_code == 1);
  REQUIRE(error_lines(bad.output).size() == 1);
  CHECK(error_lines(bad.output)[0].find("front block 9 is out of range for " + a + " (resnet18), which has 10 blocks") != std::string::npos);
  ModelConfig vit;
  vit.arch = "vit_custom";
  vit.dim = 8, vit.depth = 1, vit.heads = 2, vit.patch = 4, vit.in_channels = 1, vit.image_size = 8;
  Generator gen(0);
  auto vit_model = make_model(vit, gen);
  save_checkpoint(dir.file("vit.safetensors"), *vit_model, nullptr, 0, 0, {{"data.spec", data.spec}});
  bad = adjoint_cli("stitch --front " + a + " --end " + dir.file("vit.safetensors") + " --pairs 2:0 --out " + dir.file("bad"), dir);
  CHECK(bad.exit_code == 1);
  REQUIRE(error_lines(bad.output).size() == 1);
  CHECK(error_lines(bad.output)[0].find("block 2 'layer1.1' → end " + dir.file("vit.safetensors") + " (vit_custom) block 0 'patch_embed': "
                        "cannot join front features [4, 8, 8] to end features [5, 8]") != std::string::npos);
  bad = adjoint_cli(common + " --iri-images 0 --out " + dir.file("bad"), dir);
  CHECK(bad.exit_code == 1);
  REQUIRE(error_lines(bad.output).size() == 1);
  CHECK(error_lines(bad.output)[0].find("the IRI set of " + a + " needs at least 2 images of " + data.spec + ", got 0") !=
        std::string::npos);
  bad = adjoint_cli(common + " --objectives kl --out " + dir.file("bad"), dir);
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("unknown stitching objective 'kl'; objectives: hlm, slm, dm, fula") != std::string::npos);
}
