// `adjoint explain --evaluate` in cells (analysis/pullbacks/cells.h): a rerun reuses the
// cells its options made and refuses others; under mpirun the cells are shared out over
// the ranks, and the tables are the single process's, byte for byte, also after a rank is
// killed and the job rerun. The mpirun parts are skipped where MPI is absent.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <map>
#include <string>

#include "analysis/pullbacks/cells.h"
#include "engine/error.h"
#include "engine/io/files.h"
#include "tests/support.h"

using namespace adjoint;
using adjoint::testing::adjoint_exe;
using adjoint::testing::adjoint_run;
using adjoint::testing::contains;
using adjoint::testing::mpi_tests_skipped;
using adjoint::testing::read_text;
using adjoint::testing::TempDir;
namespace fs = std::filesystem;

namespace {

// The files of a report that hold its numbers (index.html holds the date it was made).
std::map<std::string, std::string> report_tables(const std::string& out) {
  std::map<std::string, std::string> files;
  for (const char* name : {"metrics.csv", "metrics.json", "metrics.md"}) files[name] = read_text(out + "/" + name);
  return files;
}

int64_t cell_files(const std::string& out) {
  int64_t n = 0;
  for (const auto& entry : fs::directory_iterator(out + "/cells")) n += entry.path().extension() == ".json";
  return n;
}

int64_t lines_with(const std::string& text, const std::string& what) {
  int64_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A tiny ResNet (6 steps on 8×8 squares), and the evaluation of 12 of its test images in 6
// batches of 2: three cheap methods, every metric, the expensive ones on the first 6 images.
// Its cells: the 6 batches, and for each of the 3 with expensive images and each of the 3
// methods, max-sensitivity and the randomisation of the 41 layers in 6 pieces (of 8 steps,
// the last of 1).
constexpr int64_t kCells = 6 + 3 * 3 * (1 + 6);
struct TinyEvaluation {
  TempDir dir;
  std::string data, command;
  TinyEvaluation() {
    data = testing::write_square_images(dir);
    const testing::ProgramRun trained =
        adjoint_run("train --model resnet18 --width 0.0625 --data " + data +
                        " --batch 32 --max-steps 6 --lr 0.05 --threads 1 --seed 1 --out " + dir.file("model"),
                    0, dir);
    REQUIRE_MESSAGE(trained.exit_code == 0, trained.output);
    command = "explain --checkpoint " + dir.file("model/checkpoint.safetensors") +
              " --evaluate --count 12 --batch 2 --expensive-count 6 --examples 3 --perturbations 4"
              " --methods gradient,input_x_gradient,smoothgrad --smoothgrad-samples 4 --threads 1 --out ";
  }
};

}  // namespace

TEST_CASE("explain cell files: values read back to the bit; every malformed file is one Error naming it") {
  CHECK(image_cells(5, 2) == std::vector<ImageRange>{{0, 2}, {2, 2}, {4, 1}});
  CHECK(cell_file_name({32, 32}) == "images_0032-0063.json");
  ImageCell cell{{4, 2}, std::nullopt, {{"gradient", {{"infidelity", {0.1, NAN}}, {"focus", {-1.0 / 3.0}}}}},
                 {"image_0004/input.png"}, {{"seed", "0"}}};
  const ImageCell back = read_image_cell_text(image_cell_text(cell), "c.json");
  CHECK(back.images == cell.images);
  CHECK(back.files == cell.files);
  CHECK(back.made == cell.made);
  const std::vector<double>& infidelity = back.scores.at("gradient").at("infidelity");
  CHECK(infidelity[0] == 0.1);
  CHECK(std::isnan(infidelity[1]));
  CHECK(back.scores.at("gradient").at("focus")[0] == -1.0 / 3.0);

  const std::string good = image_cell_text(cell);
  const std::vector<std::pair<std::string, std::string>> broken = {
      {"", "not a cell file"},
      {"[]", "the file is an array, expected an object"},
      {good.substr(0, good.find("\"images\"")) + "\"images\": 0}", "'images' is 0"},
      {std::string(good).replace(good.find("\"0.1\""), 5, "\"0.1x\""), "holds '0.1x', expected a number's text"},
      {std::string(good).replace(good.find("image_0004"), 10, "../escape"), "is not a path inside the report's folder"},
      {std::string(good).replace(good.find("\"0.1\""), 5, "\"1\", \"2\", \"3\""), "holds 4 values for a cell of 2"},
  };
  for (const auto& [text, message] : broken) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(read_image_cell_text(text, "bad.json"), doctest::Contains("bad.json: "), Error);
    CHECK_THROWS_WITH_AS(read_image_cell_text(text, "bad.json"), doctest::Contains(message.c_str()), Error);
  }

  // A piece of a batch's expensive images: its own name, its metric, method and steps read back.
  const MetricPiece piece{"model_parameter_randomisation", "smoothgrad", 16, 8};
  CHECK(cell_file_name({32, 32}, piece) ==
        "images_0032-0063.model_parameter_randomisation.smoothgrad.steps_016-023.json");
  CHECK(cell_file_name({32, 32}, MetricPiece{"max_sensitivity", "gradient"}) ==
        "images_0032-0063.max_sensitivity.gradient.json");
  CHECK(piece_step_key(16) == "randomisation_step_016");
  const ImageCell part{{32, 32}, piece, {{"smoothgrad", {{piece_step_key(16), {0.25, -0.5}}}}}, {}, {{"seed", "0"}}};
  const ImageCell part_back = read_image_cell_text(image_cell_text(part), "p.json");
  REQUIRE(part_back.piece.has_value());
  CHECK(*part_back.piece == piece);
  CHECK(part_back.scores.at("smoothgrad").at("randomisation_step_016")[1] == -0.5);
  const std::string piece_text = image_cell_text(part);
  for (const auto& [text, message] : std::vector<std::pair<std::string, std::string>>{
           {std::string(piece_text).replace(piece_text.find("\"smoothgrad\""), 12, "\"../x\""), "method '../x' is not a name"},
           {std::string(piece_text).replace(piece_text.find("\"model_"), 7, "\"Model_"), "metric 'Model_"},
           {std::string(piece_text).replace(piece_text.find("\"steps\": 8"), 11, "\"steps\": -1"), "'steps' is -1"}}) {
    CAPTURE(text);
    CHECK_THROWS_WITH_AS(read_image_cell_text(text, "bad.json"), doctest::Contains(message.c_str()), Error);
  }
}

TEST_CASE("explain --evaluate in cells: a rerun reuses its cells with the same tables, refuses another option in one "
          "line, and --overwrite remakes") {
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  TinyEvaluation e;
  const std::string out = e.dir.file("one");
  const testing::ProgramRun first = adjoint_run(e.command + out, 0, e.dir);
  REQUIRE_MESSAGE(first.exit_code == 0, first.output);
  const std::map<std::string, std::string> reference = report_tables(out);
  // every method × metric, and the share of focus mosaics the model recognises
  CHECK(lines_with(reference.at("metrics.csv"), "\n") == 1 + 3 * 10 + 1);
  CHECK(cell_files(out) == kCells);
  CHECK(fs::exists(out + "/image_0002/sheet.png"));
  CHECK(!fs::exists(out + "/image_0003"));
  // The report made in one go, without cells, gives the same bytes: the cells keep every
  // value exactly.
  std::string whole = e.command + e.dir.file("whole");
  whole.replace(whole.find(" --evaluate"), 11, " --data " + e.data + " --no-attributions --metrics " +
                "infidelity,max_sensitivity,random_logit,faithfulness_correlation,faithfulness_estimate,"
                "monotonicity_correlation,sparseness,complexity,randomisation,focus");
  const testing::ProgramRun in_one_go = adjoint_run(whole, 0, e.dir);
  REQUIRE_MESSAGE(in_one_go.exit_code == 0, in_one_go.output);
  CHECK(!fs::exists(e.dir.file("whole/cells")));
  CHECK(report_tables(e.dir.file("whole")) == reference);

  const testing::ProgramRun again = adjoint_run(e.command + out, 0, e.dir);
  REQUIRE_MESSAGE(again.exit_code == 0, again.output);
  CHECK(lines_with(again.output, ": done before") == kCells);
  CHECK(report_tables(out) == reference);

  // Another seed changes the numbers: refused in one line naming what differs.
  const testing::ProgramRun other = adjoint_run(e.command + out + " --seed 1", 0, e.dir);
  CHECK(other.exit_code == 2);
  CHECK(lines_with(other.output, "error: explain: ") == 1);
  CHECK(contains(other.output, "images_0000-0001.json was made by another run: seed was 0 explain 0, now 1 explain 1"));
  CHECK(report_tables(out) == reference);
  const testing::ProgramRun remade = adjoint_run(e.command + out + " --seed 1 --overwrite", 0, e.dir);
  REQUIRE_MESSAGE(remade.exit_code == 0, remade.output);
  CHECK(lines_with(remade.output, "remaking ") == kCells);
  CHECK(report_tables(out) != reference);

  // A malformed cell: one line naming the file, exit 1; --overwrite remakes it.
  write_file_atomic(out + "/cells/images_0004-0005.json", "{}");
  const testing::ProgramRun broken = adjoint_run(e.command + out + " --seed 1", 0, e.dir);
  CHECK(broken.exit_code == 1);
  CHECK(contains(broken.output, "images_0004-0005.json: no 'first_image' in the cell"));
  const testing::ProgramRun mended = adjoint_run(e.command + out + " --seed 1 --overwrite", 0, e.dir);
  CHECK(mended.exit_code == 0);
  CHECK(lines_with(mended.output, ": done before") == kCells - 1);
}

TEST_CASE("explain --evaluate under mpirun: the same tables at 1, 2 and 3 ranks, and after a killed rank and a rerun") {
  if (mpi_tests_skipped()) return;
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  TinyEvaluation e;
  const testing::ProgramRun one = adjoint_run(e.command + e.dir.file("one"), 0, e.dir);
  REQUIRE_MESSAGE(one.exit_code == 0, one.output);
  const std::map<std::string, std::string> reference = report_tables(e.dir.file("one"));
  for (int ranks : {2, 3}) {
    const std::string out = e.dir.file("ranks_" + std::to_string(ranks));
    const testing::ProgramRun run = adjoint_run(e.command + out, ranks, e.dir);
    CAPTURE(run.output);
    REQUIRE(run.exit_code == 0);
    CHECK(report_tables(out) == reference);
    CHECK(cell_files(out) == kCells);
  }

  // Rank 2 of 3 dies (SIGKILL) when handed its second cell (with the hook set, ranks 1 and 2
  // take the cells in turn: rank 2 cells 1, 3, 5): mpirun ends the job, no tables are
  // written, the cells finished stay; the rerun makes the rest and writes the same bytes.
  const std::string cut = e.dir.file("cut");
  const testing::ProgramRun killed = adjoint_run(e.command + cut, 3, e.dir, "ADJOINT_TEST_RANK_DIES_AFTER=2:1");
  CAPTURE(killed.output);
  CHECK(killed.exit_code != 0);
  CHECK(!fs::exists(cut + "/metrics.csv"));
  const int64_t finished = cell_files(cut);
  CHECK(finished >= 1);
  CHECK(finished < kCells);  // cell 3, rank 2's second, is never finished
  const testing::ProgramRun rerun = adjoint_run(e.command + cut, 2, e.dir);
  CAPTURE(rerun.output);
  REQUIRE(rerun.exit_code == 0);
  CHECK(lines_with(rerun.output, ": done before") == finished);
  CHECK(report_tables(cut) == reference);

  // Another option over ranks: refused (rank 0 checks the cells before any is handed out).
  const testing::ProgramRun other = adjoint_run(e.command + cut + " --tau-relu 0.5", 2, e.dir);
  CHECK(other.exit_code == 2);
  CHECK(contains(other.output, "was made by another run: tau-relu was 0.6, now 0.5"));
  CHECK(report_tables(cut) == reference);
}
