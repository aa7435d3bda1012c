// `adjoint stitch` end to end: two tiny ResNets trained here on a Fashion-MNIST-shaped
// folder whose class is a bright square's position, stitched by the real executable
// under all three protocols; the tables, layer maps, stitches and IRIs it writes; a rerun
// that recomputes nothing; further test sets; the stitched model run by `adjoint predict`
// and `adjoint explain`; and the one-line errors for bad input.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "analysis/stitching/records.h"
#include "analysis/stitching/stitched_model.h"
#include "engine/data/idx.h"
#include "engine/data/open.h"
#include "engine/io/files.h"
#include "engine/io/json.h"
#include "engine/io/safetensors.h"
#include "models/checkpoint.h"
#include "models/training.h"
#include "tests/support.h"

using namespace adjoint;
using adjoint::testing::adjoint_exe;
using adjoint::testing::TempDir;
using adjoint::testing::check_close;
using adjoint::testing::random_tensor;
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

using Run = adjoint::testing::ProgramRun;

Run adjoint_cli(const std::string& arguments, const TempDir& dir) {
  return adjoint::testing::run_adjoint_program(arguments + " --threads 2", dir);
}

// Whether process `pid` still runs (a zombie nobody has reaped yet does not).
bool running(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string all;
  if (!std::getline(stat, all)) return false;
  const size_t close = all.rfind(')');
  return close != std::string::npos && close + 2 < all.size() && all[close + 2] != 'Z';
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
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  TempDir dir;
  write_square_positions(dir);
  const DataSource data = open_data("fashion-mnist:" + dir.path().string());
  const std::string a = train_tiny(data, dir, "A", 1), b = train_tiny(data, dir, "B", 2);
  const std::string out = dir.file("sweep");
  const std::string common = "stitch --front " + a + " --end " + b + " --pairs 2:2,4:3 --train-images 100 --steps 8 --batch 25";
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
    // The IRI columns belong to invariance rows alone.
    const bool invariance = cell.find("protocol")->as_string() == "invariance";
    for (const char* column : {"end_agrees_on_iris", "end_agrees_with_starts_on_iris", "iri_median_distance",
                               "iri_p90_distance", "iri_share_below_0.05"})
      CHECK_MESSAGE(cell.find(column)->is_number() == invariance, column);
    CHECK(cell.find("iri_poor")->is_bool() == invariance);
    CHECK(cell.find("steps")->as_int() == 8);  // --steps 8 under every protocol, 100 images or 20
  }
  CHECK(read_text(out + "/results.md").find("| 4 layer2.1 | 3 layer2.0 | fula | invariance |") != std::string::npos);
  const SafetensorsFile stitch = read_safetensors(out + "/stitches/front2_end2_hlm_standard.safetensors");
  CHECK(stitch.tensors.at("weight").shape() == Shape{4, 4});
  CHECK(read_safetensors(out + "/iris/front_block_4.safetensors").tensors.at("inputs").shape() == Shape{20, 1, 8, 8});
  for (const std::string block : {"2", "4"}) CHECK(read_text(out + "/iris/front_block_" + block + ".png").rfind("\x89PNG", 0) == 0);

  // The layer × layer maps: A's blocks 2, 4 down, B's blocks 2, 3 across; (2, 3) and (4, 2)
  // were not measured. Each value is the cell's relative score.
  for (const std::string objective : {"hlm", "fula"})
    for (const std::string protocol : {"standard", "control", "invariance"}) {
      INFO(objective, " ", protocol);
      const std::string map = read_text(out + "/layer_map_" + objective + "_" + protocol + ".csv");
      double score[2] = {0, 0};
      for (const Json& cell : results.find("cells")->as_array())
        if (cell.find("objective")->as_string() == objective && cell.find("protocol")->as_string() == protocol)
          score[cell.find("front_block")->as_int() == 2 ? 0 : 1] = cell.find("relative_score")->as_number();
      char expected[200];
      std::snprintf(expected, sizeof expected, "front_block,2 layer1.1,3 layer2.0\n2 layer1.1,%.3f,\n4 layer2.1,,%.3f\n",
                    score[0], score[1]);
      CHECK(map == expected);
      CHECK(read_text(out + "/layer_map_" + objective + "_" + protocol + ".png").rfind("\x89PNG", 0) == 0);
    }
  CHECK(read_text(out + "/layer_maps.md").find("## fula, invariance") != std::string::npos);

  // A rerun reads every finished cell back: nothing is retrained, no file changes.
  const std::string weights_before = read_text(out + "/stitches/front4_end3_fula_invariance.safetensors");
  fs::remove(out + "/cells/front4_end3_fula_invariance.json");  // as if interrupted before this cell finished
  const Run again = adjoint_cli(sweep, dir);
  REQUIRE_MESSAGE(again.exit_code == 0, again.output);
  CHECK(again.output.find("IRIs of " + a + " block 4: read ") != std::string::npos);
  size_t reused = 0;
  for (size_t at = again.output.find("done before"); at != std::string::npos; at = again.output.find("done before", at + 1))
    ++reused;
  CHECK(reused == 11);
  CHECK(again.output.find("[12/12] front4_end3_fula_invariance: stitched") != std::string::npos);
  CHECK(read_text(out + "/stitches/front4_end3_fula_invariance.safetensors") == weights_before);  // same seed, same stitch
  CHECK(count_lines(read_text(out + "/results.csv")) == 13);

  // Interrupted (SIGTERM) after its first cell, a sweep leaves whole tables listing the cells
  // finished so far; a rerun finishes it.
  {
    const std::string cut = dir.file("cut");
    const std::string cut_sweep = "stitch --front " + a + " --end " + b + " --pairs 2:2,4:3 --train-images 300 "
                                  "--epochs 10 --batch 25 --objectives hlm,dm --protocol standard --out " + cut;
    const std::string pid_file = dir.file("cut.pid");
    REQUIRE(std::system((adjoint_exe() + " " + cut_sweep + " --threads 2 > " + dir.file("cut.log") +
                         " 2>&1 & echo $! > " + pid_file).c_str()) == 0);
    const pid_t pid = pid_t(std::stol(read_text(pid_file)));
    for (int wait = 0; wait < 4000 && !fs::exists(cut + "/results.json"); ++wait) usleep(1000);
    kill(pid, SIGTERM);  // (a background job of sh ignores SIGINT)
    for (int wait = 0; wait < 4000 && running(pid); ++wait) usleep(1000);
    const std::string table = read_text(cut + "/results.csv");
    const int64_t rows = count_lines(table) - 1;
    CHECK(rows >= 1);
    CHECK(rows <= 4);
    std::stringstream lines(table);
    for (std::string line; std::getline(lines, line);) CHECK(std::count(line.begin(), line.end(), ',') == 18);
    const std::string json = read_text(cut + "/results.json");
    CHECK(parse_json(json).find("cells")->size() >= 1);
    CHECK(read_text(cut + "/results.md").find("| front block |") != std::string::npos);
    const Run finish = adjoint_cli(cut_sweep, dir);
    REQUIRE_MESSAGE(finish.exit_code == 0, finish.output);
    CHECK(count_lines(read_text(cut + "/results.csv")) == 5);

  }

  // Further test sets: a rerun asking for them scores the finished cells from their stitch
  // files, retraining nothing.
  const std::string invert = data.spec + "+invert", shortcut = data.spec + "+shortcut:1";
  const Run tested = adjoint_cli(sweep + " --test-data " + invert + "," + shortcut, dir);
  REQUIRE_MESSAGE(tested.exit_code == 0, tested.output);
  size_t read_back = 0;
  for (size_t at = tested.output.find("done before"); at != std::string::npos; at = tested.output.find("done before", at + 1))
    ++read_back;
  CHECK(read_back == 12);  // no cell trained again
  const std::string tested_csv = read_text(out + "/results.csv");
  CHECK(tested_csv.find("end_agrees_with_starts_on_iris,raua,stitched_accuracy[" + invert + "],end_accuracy[" + invert +
                        "],stitched_accuracy[" + shortcut + "],end_accuracy[" + shortcut + "]\n") != std::string::npos);
  const Json tested_cells = parse_json(read_text(out + "/results.json"));
  for (const Json& cell : tested_cells.find("cells")->as_array()) {
    const Json::Array& sets = cell.find("test_sets")->as_array();
    REQUIRE(sets.size() == 2);
    CHECK(sets[1].find("data")->as_string() == shortcut);
    CHECK(sets[0].find("stitched_accuracy")->as_number() >= 0.0);
    CHECK(sets[0].find("stitched_accuracy")->as_number() <= 1.0);
  }

  // The stitched model is a model: an identity stitch of A into itself predicts what A does,
  // and a trained stitch runs through predict and explain.
  {
    const Checkpoint ck = load_checkpoint(a);
    const Endpoint self{a, model_from_checkpoint(ck), {}, {}};
    self.model->train(false);
    StitchPair pair(self, 3, self, 3, {1, 8, 8});
    Stitch identity(pair.shapes());
    identity.init_identity();
    write_stitch_file(dir.file("identity.safetensors"), pair, identity);
  }
  write_safetensors(dir.file("x.safetensors"), {{"x", random_tensor({5, 1, 8, 8}, 3)}});
  const Run direct = adjoint_cli("predict --checkpoint " + a + " --input " + dir.file("x.safetensors") + " --out " + dir.file("direct"), dir);
  REQUIRE_MESSAGE(direct.exit_code == 0, direct.output);
  const Run stitched = adjoint_cli("predict --stitch " + dir.file("identity.safetensors") + " --input " +
                                   dir.file("x.safetensors") + " --out " + dir.file("stitched"), dir);
  REQUIRE_MESSAGE(stitched.exit_code == 0, stitched.output);
  check_close(read_safetensors(dir.file("stitched.safetensors")).tensors.at("logits"),
              read_safetensors(dir.file("direct.safetensors")).tensors.at("logits"), 1e-6, 1e-6, "identity-stitched logits");
  const std::string trained = out + "/stitches/front4_end3_fula_standard.safetensors";
  const Run explained = adjoint_cli("explain --stitch " + trained + " --data " + data.spec + " --count 2 --methods "
                                    "gradient,pullback,soft_pullback --metrics none --out " + dir.file("explained"), dir);
  REQUIRE_MESSAGE(explained.exit_code == 0, explained.output);
  CHECK(explained.output.find("stitched:resnet18→resnet18") != std::string::npos);
  CHECK(fs::exists(dir.file("explained/attributions_pullback.safetensors")));
  const Run randomised = adjoint_cli("explain --stitch " + trained + " --data " + data.spec + " --count 2 --methods "
                                     "gradient --metrics randomisation --out " + dir.file("randomised"), dir);
  CHECK(randomised.exit_code == 2);
  CHECK(randomised.output.find("model_parameter_randomisation rebuilds a model from its architecture, which the "
                               "stitched model (stitch " + trained + ": front " + a) != std::string::npos);
  {
    const Checkpoint ck = load_checkpoint(a);
    const Endpoint self{a, model_from_checkpoint(ck), {}, {}}, gone{dir.file("gone.safetensors"), self.model, {}, {}};
    self.model->train(false);
    StitchPair pair(self, 3, gone, 3, {1, 8, 8});
    write_stitch_file(dir.file("orphan.safetensors"), pair, Stitch(pair.shapes()));
  }
  const Run orphan = adjoint_cli("predict --stitch " + dir.file("orphan.safetensors") + " --input " + dir.file("x.safetensors"), dir);
  CHECK(orphan.exit_code == 1);
  REQUIRE(error_lines(orphan.output).size() == 1);
  CHECK(error_lines(orphan.output)[0].find("stitch file " + dir.file("orphan.safetensors") + ": its end model: ") !=
        std::string::npos);
  CHECK(error_lines(orphan.output)[0].find(dir.file("gone.safetensors")) != std::string::npos);
  const Run both = adjoint_cli("predict --stitch " + trained + " --checkpoint " + a + " --input " + dir.file("x.safetensors"), dir);
  CHECK(both.exit_code == 2);
  CHECK(both.output.find("give either --stitch or --checkpoint") != std::string::npos);

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
  vit.patch = 2;
  save_checkpoint(dir.file("vit2.safetensors"), *make_model(vit, gen), nullptr, 0, 0, {{"data.spec", data.spec}});
  ModelConfig mlp;
  mlp.arch = "bilinear_mlp";
  mlp.hidden = 6, mlp.in_channels = 1, mlp.image_size = 8;
  save_checkpoint(dir.file("mlp.safetensors"), *make_model(mlp, gen), nullptr, 0, 0, {{"data.spec", data.spec}});
  // ResNet maps into ViT tokens and back go through the map↔token adapter ...
  const Run adapted = adjoint_cli("stitch --front " + a + " --end " + dir.file("vit.safetensors") + " --pairs 2:1 "
                                  "--objectives dm --protocol standard --train-images 50 --epochs 1 --out " +
                                  dir.file("adapted"), dir);
  CHECK_MESSAGE(adapted.exit_code == 0, adapted.output);
  CHECK(read_safetensors(dir.file("adapted/stitches/front2_end1_dm_standard.safetensors")).tensors.at("weight").shape() ==
        Shape{8, 4});
  const Run across = adjoint_cli("predict --stitch " + dir.file("adapted/stitches/front2_end1_dm_standard.safetensors") +
                                 " --input " + dir.file("x.safetensors") + " --out " + dir.file("across"), dir);
  CHECK_MESSAGE(across.exit_code == 0, across.output);
  CHECK(read_safetensors(dir.file("across.safetensors")).tensors.at("logits").shape() == Shape{5, 10});
  // ... a ViT of 2×2 patches into one of 4×4 patches through a resize of the patch grid ...
  const Run grids = adjoint_cli("stitch --front " + dir.file("vit2.safetensors") + " --end " + dir.file("vit.safetensors") +
                                " --pairs 1:1 --objectives dm --protocol standard --train-images 50 --epochs 1 --out " +
                                dir.file("grids"), dir);
  CHECK_MESSAGE(grids.exit_code == 0, grids.output);
  // ... but the flat activations of a bilinear MLP have no adapter.
  bad = adjoint_cli("stitch --front " + a + " --end " + dir.file("mlp.safetensors") + " --pairs 2:0 --out " +
                    dir.file("bad"), dir);
  CHECK(bad.exit_code == 1);
  REQUIRE(error_lines(bad.output).size() == 1);
  CHECK(error_lines(bad.output)[0].find("front " + a + " (resnet18) block 2 'layer1.1' → end " + dir.file("mlp.safetensors") +
                                        " (bilinear_mlp) block 0 'bilinear': cannot join front features [4, 8, 8] to end "
                                        "features [6]: a stitch joins feature maps (C, H, W) or token sequences (T, D) "
                                        "only") != std::string::npos);
  bad = adjoint_cli(common + " --iri-images 0 --out " + dir.file("bad"), dir);
  CHECK(bad.exit_code == 1);
  REQUIRE(error_lines(bad.output).size() == 1);
  CHECK(error_lines(bad.output)[0].find("the IRI set of " + a + " needs at least 2 images of " + data.spec + ", got 0") !=
        std::string::npos);
  bad = adjoint_cli(common + " --objectives kl --out " + dir.file("bad"), dir);
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("unknown stitching objective 'kl'; objectives: hlm, slm, dm, fula") != std::string::npos);
  bad = adjoint_cli(common + " --protocol iri --out " + dir.file("bad"), dir);
  CHECK(bad.exit_code == 2);
  CHECK(bad.output.find("unknown stitching protocol 'iri'; protocols: standard, control, invariance") != std::string::npos);
  // fula from end block 2 has 7 terms (blocks 2..8 of 10); two weights cannot serve them.
  bad = adjoint_cli(common + " --objectives fula --fula-weights 1,2 --out " + dir.file("bad"), dir);
  CHECK(bad.exit_code == 1);
  REQUIRE(error_lines(bad.output).size() == 1);
  CHECK(error_lines(bad.output)[0].find("block 2 'layer1.1' → end " + b + " (resnet18) block 2 'layer1.1': fula has 7 "
                                        "terms, from end block 2 to the penultimate block 8 'layer4.1', but 2 fula "
                                        "weights are given") != std::string::npos);
  // A further test set of another image size.
  {
    const TempDir small;
    write_idx(small.file("t10k-images-idx3-ubyte"), IdxArray{{4, 6, 6}, std::vector<uint8_t>(4 * 36, 7)});
    write_idx(small.file("t10k-labels-idx1-ubyte"), IdxArray{{4}, std::vector<uint8_t>(4, 1)});
    write_idx(small.file("train-images-idx3-ubyte"), IdxArray{{4, 6, 6}, std::vector<uint8_t>(4 * 36, 7)});
    write_idx(small.file("train-labels-idx1-ubyte"), IdxArray{{4}, std::vector<uint8_t>(4, 1)});
    bad = adjoint_cli(common + " --test-data fashion-mnist:" + small.path().string() + " --out " + dir.file("bad"), dir);
    CHECK(bad.exit_code == 1);
    REQUIRE(error_lines(bad.output).size() == 1);
    CHECK(error_lines(bad.output)[0].find("the test set of fashion-mnist:" + small.path().string() + " (--test-data) holds examples "
                                          "[1, 6, 6], but the models are stitched on " + data.spec + " images [1, 8, 8]") !=
          std::string::npos);
  }
  CHECK(!fs::exists(dir.file("bad")));  // refused before anything was written
}

namespace {

// A run of the executable from the working folder `cwd`, so that relative paths are its.
Run adjoint_cli_in(const std::string& cwd, const std::string& arguments, const TempDir& dir) {
  const std::string log = dir.file("cli_in.log");
  const int status = std::system(("cd " + cwd + " && " + adjoint_exe() + " " + arguments + " --threads 2 > " + log +
                                  " 2>&1").c_str());
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, read_text(log)};
}

// The text of one line of `output` holding `part` ("" when none).
bool has(const Run& r, const std::string& part) { return r.output.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("adjoint stitch: every result records what made it; a rerun made otherwise is refused naming what "
          "differs, --overwrite remakes it; a stitch file pins its checkpoints") {
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  TempDir dir;
  write_square_positions(dir);
  const DataSource data = open_data("fashion-mnist:" + dir.path().string());
  const std::string a = train_tiny(data, dir, "A", 1), b = train_tiny(data, dir, "B", 2);
  const std::string hash_a = file_hash(a), hash_b = file_hash(b);
  REQUIRE(hash_a != hash_b);
  const std::string out = dir.file("pinned");
  const std::string options = " --pairs 2:2 --train-images 50 --steps 4 --batch 25 --objectives hlm,slm "
                              "--protocol standard,invariance --iri-images 10 --out " + out;
  const std::string sweep_without_iri_steps = "stitch --front " + a + " --end " + b + options;
  const std::string sweep = sweep_without_iri_steps + " --iri-steps 5";
  const Run first = adjoint_cli(sweep, dir);
  REQUIRE_MESSAGE(first.exit_code == 0, first.output);

  // Each cell, IRI set and stitch names both checkpoints by content, the data and the options.
  const StitchCell standard = read_cell_text(read_text(out + "/cells/front2_end2_hlm_standard.json"), "standard cell");
  CHECK(standard.made.at("front.checkpoint") == hash_a);
  CHECK(standard.made.at("end.checkpoint") == hash_b);
  CHECK(standard.made.at("data") == data.spec);
  CHECK(standard.made.at("steps") == "4");
  CHECK(!standard.made.count("iri-steps"));
  const StitchCell invariance = read_cell_text(read_text(out + "/cells/front2_end2_slm_invariance.json"), "cell");
  CHECK(invariance.made.at("iri-steps") == "5");
  CHECK(read_iri_file(out + "/iris/front_block_2.safetensors").made.at("front.checkpoint") == hash_a);
  const StitchFile stitch = read_stitch_file(out + "/stitches/front2_end2_slm_invariance.safetensors");
  CHECK(stitch.front_hash == hash_a);
  CHECK(stitch.end_hash == hash_b);
  CHECK(stitch.made.at("lr") == "0.001");

  // Another front checkpoint of the same architecture into the same OUT: refused at the first
  // cell, naming it and both hashes, before anything is written over the old numbers.
  const std::string cells_before = read_text(out + "/results.csv");
  Run r = adjoint_cli("stitch --front " + b + " --end " + b + options + " --iri-steps 5", dir);
  CHECK(r.exit_code == 2);
  REQUIRE(error_lines(r.output).size() == 1);
  CHECK_MESSAGE(has(r, "stitch: " + out + "/cells/front2_end2_hlm_standard.json was made by another run: "
                       "front.checkpoint was " + hash_a + ", now " + hash_b), r.output);
  CHECK(read_text(out + "/results.csv") == cells_before);
  // Another lr; another IRI search (the standard cells, which do not read IRIs, still stand).
  r = adjoint_cli(sweep + " --lr 0.01", dir);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(has(r, "front2_end2_hlm_standard.json was made by another run: lr was 0.001, now 0.01"), r.output);
  r = adjoint_cli(sweep_without_iri_steps + " --iri-steps 6", dir);
  CHECK(r.exit_code == 2);
  CHECK(has(r, "[1/4] front2_end2_hlm_standard: done before"));
  CHECK_MESSAGE(has(r, "front2_end2_hlm_invariance.json was made by another run: iri-steps was 5, now 6"), r.output);
  // Another data set (a variant of the same images).
  r = adjoint_cli(sweep + " --data " + data.spec + "+invert", dir);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(has(r, "data was " + data.spec + ", now " + data.spec + "+invert"), r.output);
  // An IRI set made for another front model, in a folder of its own.
  const std::string other = dir.file("other");
  fs::create_directories(other + "/iris");
  fs::copy_file(out + "/iris/front_block_2.safetensors", other + "/iris/front_block_2.safetensors");
  r = adjoint_cli("stitch --front " + b + " --end " + b + " --pairs 2:2 --train-images 50 --steps 4 --batch 25 "
                  "--objectives hlm --protocol invariance --iri-images 10 --iri-steps 5 --out " + other, dir);
  CHECK(r.exit_code == 2);
  CHECK_MESSAGE(has(r, other + "/iris/front_block_2.safetensors was made by another run: front.checkpoint was " + hash_a +
                       ", now " + hash_b), r.output);
  // --overwrite remakes what differs (the cells of another lr) and reuses what matches (the IRIs).
  r = adjoint_cli(sweep + " --lr 0.002 --overwrite", dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  CHECK(has(r, "remaking " + out + "/cells/front2_end2_hlm_standard.json (--overwrite): lr was 0.001, now 0.002"));
  CHECK(has(r, "IRIs of " + a + " block 2: read "));
  CHECK(read_cell_text(read_text(out + "/cells/front2_end2_slm_invariance.json"), "cell").made.at("lr") == "0.002");
  CHECK(read_stitch_file(out + "/stitches/front2_end2_slm_invariance.safetensors").made.at("lr") == "0.002");

  // Files read back are validated: a cell file "{}", an IRI file with another tensor.
  write_file_atomic(out + "/cells/front2_end2_hlm_standard.json", "{}");
  r = adjoint_cli(sweep + " --lr 0.002", dir);
  CHECK(r.exit_code == 1);
  REQUIRE(error_lines(r.output).size() == 1);
  CHECK_MESSAGE(has(r, out + "/cells/front2_end2_hlm_standard.json: no 'front_block'"), r.output);
  fs::remove(out + "/cells/front2_end2_hlm_standard.json");
  {
    SafetensorsFile f = read_safetensors(out + "/iris/front_block_2.safetensors");
    f.tensors["noise"] = Tensor::zeros({10});
    write_safetensors(out + "/iris/front_block_2.safetensors", f.tensors, f.metadata);
  }
  fs::remove(out + "/cells/front2_end2_hlm_invariance.json");
  r = adjoint_cli(sweep + " --lr 0.002", dir);
  CHECK(r.exit_code == 1);
  REQUIRE(error_lines(r.output).size() == 1);
  CHECK_MESSAGE(has(r, "IRI file " + out + "/iris/front_block_2.safetensors: unexpected tensor 'noise'"), r.output);

  // predict --stitch: a sweep given relative checkpoint paths writes them relative to the
  // stitch file's folder, so the stitch runs from anywhere and moves with its checkpoints ...
  const Run relative = adjoint_cli_in(dir.path().string(), "stitch --front A/checkpoint.safetensors --end "
                                      "B/checkpoint.safetensors --pairs 2:2 --objectives dm --protocol standard "
                                      "--train-images 50 --steps 2 --out rel", dir);
  REQUIRE_MESSAGE(relative.exit_code == 0, relative.output);
  const std::string moved = dir.file("moved");
  fs::create_directories(moved);
  for (const char* folder : {"A", "B", "rel"}) fs::copy(dir.file(folder), moved + "/" + folder, fs::copy_options::recursive);
  const std::string moved_stitch = moved + "/rel/stitches/front2_end2_dm_standard.safetensors";
  CHECK(read_stitch_file(moved_stitch).front == "../../A/checkpoint.safetensors");
  write_safetensors(dir.file("x.safetensors"), {{"x", random_tensor({3, 1, 8, 8}, 3)}});
  r = adjoint_cli("predict --stitch " + moved_stitch + " --input " + dir.file("x.safetensors") + " --out " + dir.file("p"), dir);
  CHECK_MESSAGE(r.exit_code == 0, r.output);
  // ... and refuses a front or end replaced by another checkpoint of the same architecture.
  fs::copy_file(b, moved + "/A/checkpoint.safetensors", fs::copy_options::overwrite_existing);
  r = adjoint_cli("predict --stitch " + moved_stitch + " --input " + dir.file("x.safetensors") + " --out " + dir.file("p"), dir);
  CHECK(r.exit_code == 1);
  REQUIRE(error_lines(r.output).size() == 1);
  CHECK_MESSAGE(has(r, "stitch file " + moved_stitch + ": its front model " + moved + "/A/checkpoint.safetensors is not "
                       "the checkpoint it was trained with (content hash " + hash_b + ", the stitch records " + hash_a + ")"),
                r.output);
  r = adjoint_cli("explain --stitch " + moved_stitch + " --data " + data.spec + " --count 1 --methods gradient "
                  "--metrics none --out " + dir.file("explained"), dir);
  CHECK(r.exit_code == 1);
  CHECK(has(r, "is not the checkpoint it was trained with"));
  // A stitch with NaN weights is refused, never run to "class 0 (logit nan)".
  {
    SafetensorsFile f = read_safetensors(out + "/stitches/front2_end2_hlm_standard.safetensors");
    f.tensors.at("bias").data()[0] = NAN;
    write_safetensors(dir.file("nan_stitch.safetensors"), f.tensors, f.metadata);
  }
  r = adjoint_cli("predict --stitch " + dir.file("nan_stitch.safetensors") + " --input " + dir.file("x.safetensors") + " --out " + dir.file("p"), dir);
  CHECK(r.exit_code == 1);
  CHECK_MESSAGE(has(r, "stitch file " + dir.file("nan_stitch.safetensors") + ": tensor 'bias' holds nan at element 0"),
                r.output);
}

TEST_CASE("adjoint stitch: nonsense options are refused before any work, in one line naming the option") {
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  TempDir dir;
  write_square_positions(dir);
  const DataSource data = open_data("fashion-mnist:" + dir.path().string());
  const std::string a = train_tiny(data, dir, "A", 1);
  // The command with `words`, and the options it leaves out at small values.
  auto command = [&](const std::string& words) {
    std::string c = "stitch --front " + a + " --end " + a + " --out " + dir.file("bad") + " " + words;
    for (const std::string option : {"--pairs 2:2", "--objectives hlm", "--protocol standard", "--steps 2", "--train-images 50"})
      if (words.find(option.substr(0, option.find(' '))) == std::string::npos) c += " " + option;
    return c;
  };
  for (const auto& [words, message] : std::vector<std::pair<std::string, std::string>>{
           {"--lr nan", "option --lr must be a finite number above 0, got nan"},
           {"--lr -1", "option --lr must be a finite number above 0, got -1"},
           {"--lr 0", "option --lr must be a finite number above 0, got 0"},
           {"--fula-weights nan,1", "option --fula-weights: every weight must be a finite number at least 0, got nan"},
           {"--temperature inf", "option --temperature must be a finite number above 0, got inf"},
           {"--ridge -1", "option --ridge must be a finite number at least 0, got -1"},
           {"--test-images -1", "option --test-images must be at least 0 (0: the whole test set), got -1"},
           {"--train-images -5", "option --train-images must be at least 0 (0: the whole training set), got -5"},
           {"--iri-images -2", "option --iri-images must be at least 0, got -2"},
           {"--steps -1", "option --steps must be at least 0 (0: the least-squares stitch alone), got -1"},
           {"--epochs 2 --steps 2", "give --steps (the same for every protocol) or --epochs (passes over each protocol's set), not both"},
           {"--batch 0", "option --batch must be at least 1, got 0"},
           {"--iri-steps 0", "option --iri-steps must be at least 1, got 0"},
           {"--raua-eps 0,0.1 --pgd-steps 0", "option --pgd-steps must be at least 1"},
           {"--raua-eps 0,0.1 --raua-images 0", "option --raua-images must be at least 1, got 0"},
           {"--objectives hlm,slm,hlm", "option --objectives: 'hlm' is given twice"},
           {"--protocol standard,standard", "option --protocol: 'standard' is given twice"},
           {"--pairs 2:2,layer1.1:2", "option --pairs: the stitch point front block 2 → end block 2 is given twice"},
           {"--test-data " + data.spec + "+invert," + data.spec + "+invert", "option --test-data: '" + data.spec +
                                                                                "+invert' is given twice"},
           {"--test-data nosuchdata", "--test-data nosuchdata: "},
           // Fails at the first cell's IRI search: no empty OUT/cells, OUT/stitches or OUT/iris left behind.
           {"--protocol invariance --iri-rule sgd --iri-images 4", "unknown input step rule 'sgd'"},
       }) {
    CAPTURE(words);
    const Run r = adjoint_cli(command(words), dir);
    CHECK(r.exit_code == 2);
    CHECK_MESSAGE(has(r, message), r.output);
    CHECK(error_lines(r.output).size() == 1);
    CHECK(!fs::exists(dir.file("bad")));
  }
  // --steps 0: the least-squares stitch alone, trained for no step.
  const Run r = adjoint_cli(command("--steps 0"), dir);
  REQUIRE_MESSAGE(r.exit_code == 0, r.output);
  const StitchCell cell = read_cell_text(read_text(dir.file("bad/cells/front2_end2_hlm_standard.json")), "cell");
  CHECK(cell.steps == 0);
  CHECK(std::isnan(cell.final_loss));
}
