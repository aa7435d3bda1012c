// `adjoint reproduce` (tools/reproduce/): the table of papers is well formed, parts restart
// (a finished part is skipped, one made by another command line or commit refused), claims
// are judged from the parts' result files both ways, and the page holds the claims table;
// under mpirun the parts go to free ranks in the order their reads allow, with one process's page.
#include <doctest/doctest.h>
#include <stb/stb_image_write.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>

#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/io/json.h"
#include "engine/threads.h"
#include "tests/support.h"
#include "tools/reproduce/paper.h"
#include "tools/reproduce/runner.h"

using namespace adjoint;
using namespace adjoint::reproduce;
using namespace adjoint::testing;
namespace fs = std::filesystem;

TEST_CASE("reproduce: every paper's parts are unique, read only earlier parts, and back every claim") {
  for (const Paper& paper : papers()) {
    INFO("paper ", paper.name);
    CHECK(find_paper(paper.name).name == paper.name);
    CHECK_FALSE(paper.claims.empty());
    for (Scale scale : {Scale::Quick, Scale::Full})
      for (int seeds : {1, 2}) {
        const std::vector<Part> parts = paper.parts(scale, seeds);
        std::set<std::string> earlier;
        for (const Part& p : parts) {
          INFO("part ", p.name);
          CHECK(p.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-ABCDEFGHIJKLMNOPQRSTUVWXYZ") ==
                std::string::npos);
          CHECK(earlier.count(p.name) == 0);
          CHECK(p.expected_seconds > 0);
          // A stitch compares protocols only on equal budgets: the same --steps for each,
          // never --epochs (which gives the few IRI images a fraction of the steps).
          if (p.words.front() == "stitch") {
            CHECK(std::find(p.words.begin(), p.words.end(), "--steps") != p.words.end());
            CHECK(std::find(p.words.begin(), p.words.end(), "--epochs") == p.words.end());
          }
          for (const std::string& read : parts_read(p))
            CHECK_MESSAGE(earlier.count(read) == 1, "reads a later or unknown part: ", read);
          earlier.insert(p.name);
        }
        for (const Claim& c : paper.claims) {
          INFO("claim ", c.text);
          CHECK(bool(c.value));
          CHECK_FALSE(c.sources.empty());
          for (int s = 0; s < seeds; ++s)
            for (const std::string& source : c.sources) CHECK_MESSAGE(earlier.count(with_seed(source, s)) == 1, source);
        }
      }
  }
  CHECK_THROWS_AS(find_paper("no-such-paper"), UsageError);
  CHECK_THROWS_AS(parse_scale("huge"), UsageError);
}

TEST_CASE("reproduce --only: the parts named, and the parts they read, in the paper's order") {
  const std::vector<Part> all = find_paper("tensor-similarity").parts(Scale::Full, 2);
  const auto names = [](const std::vector<Part>& parts) {
    std::vector<std::string> out;
    for (const Part& p : parts) out.push_back(p.name);
    return out;
  };
  CHECK(names(select_parts(all, {})) == names(all));
  CHECK(names(select_parts(all, {"lm_similarity_s1"})) == std::vector<std::string>{"lm_s1", "lm_similarity_s1"});
  // The poisoned branch's comparison reads the branch and the clean stage the branch continues.
  CHECK(names(select_parts(all, {"backdoor_poison_similarity_s0", "grok_s1"})) ==
        std::vector<std::string>{"backdoor_clean_s0", "backdoor_poison_s0", "backdoor_poison_similarity_s0", "grok_s1"});
  // Forgetting's re-added comparison reads four stages in a chain.
  CHECK(names(select_parts(all, {"forget_readded_similarity_s0"})) ==
        std::vector<std::string>{"forget_stage1_s0", "forget_stage2_s0", "forget_removed_s0", "forget_readded_s0",
                                 "forget_readded_similarity_s0"});
  CHECK_THROWS_WITH_AS(select_parts(all, {"grokking"}), doctest::Contains("--only grokking: no part's name starts with it"),
                       UsageError);
}

namespace {

// A paper of two parts whose commands are counted, not run: the runner's restart logic alone.
Paper counting_paper(std::string* second_part_option) {
  Paper p;
  p.name = "counting";
  p.title = "a test paper";
  p.parts = [second_part_option](Scale, int) {
    return std::vector<Part>{{"first", {"train", "--out", "{out}"}, 1}, {"second", {"eval", *second_part_option}, 1}};
  };
  p.draw = [](const std::string&, int, const std::string&) { return std::vector<std::string>{}; };
  return p;
}

// The options of a run into `dir` at a fixed commit, one thread, no progress bar.
RunOptions quiet_run_options(const TempDir& dir) {
  RunOptions o;
  o.out_dir = dir.path().string();
  o.commit = "abc123";
  o.threads = 1;
  o.show_progress = false;
  return o;
}

}  // namespace

TEST_CASE("reproduce: a rerun skips finished parts and refuses parts made by another command line or commit") {
  TempDir dir;
  std::string option = "--limit=1";
  const Paper paper = counting_paper(&option);
  std::vector<std::string> ran;
  RunOptions o = quiet_run_options(dir);
  o.run_command = [&](const std::vector<std::string>& words, const std::string&) {
    ran.push_back(words[0]);
    if (words[0] == "train") {  // "{out}" was replaced by the part's folder
      CHECK(words[2] == o.out_dir + "/parts/first");
      fs::create_directories(words[2]);
    }
    return 0;
  };

  std::vector<PartOutcome> outcomes = run_parts(paper, o);
  CHECK(ran == std::vector<std::string>{"train", "eval"});
  CHECK_FALSE(outcomes[0].skipped);
  CHECK(fs::exists(o.out_dir + "/parts/first/reproduce_part.json"));
  CHECK(contains(read_text(o.out_dir + "/parts/first/reproduce_part.json"), "adjoint train --out {out}"));

  ran.clear();
  outcomes = run_parts(paper, o);
  CHECK(ran.empty());
  CHECK(outcomes[0].skipped);
  CHECK(outcomes[1].skipped);

  // An interrupted part (a folder without its record) runs again; the finished one does not.
  fs::remove(o.out_dir + "/parts/second/reproduce_part.json");
  outcomes = run_parts(paper, o);
  CHECK(ran == std::vector<std::string>{"eval"});

  // Another command line: refused in one line naming the part, nothing run; --overwrite reruns it.
  ran.clear();
  option = "--limit=2";
  try {
    run_parts(paper, o);
    FAIL("a part made by another command line was not refused");
  } catch (const Error& e) {
    const std::string message = e.what();
    CHECK(contains(message, "part second"));
    CHECK(contains(message, "adjoint eval --limit=1"));
    CHECK(contains(message, "--overwrite"));
    CHECK(message.find('\n') == std::string::npos);
  }
  CHECK(ran.empty());
  o.overwrite = true;
  run_parts(paper, o);
  CHECK(ran == std::vector<std::string>{"eval"});

  // Another commit: every part refused.
  o.overwrite = false;
  o.commit = "def456";
  ran.clear();
  CHECK_THROWS_WITH_AS(run_parts(paper, o), doctest::Contains("at commit abc123"), Error);
  CHECK(ran.empty());

  // Another thread count (OpenBLAS's bits depend on it): refused too.
  o.commit = "abc123";
  o.threads = 2;
  CHECK_THROWS_WITH_AS(run_parts(paper, o), doctest::Contains("with 1 threads, not"), Error);
  CHECK(ran.empty());
  o.threads = 1;
  CHECK_NOTHROW(run_parts(paper, o));
  CHECK(ran.empty());

  // A malformed record: one line naming the file, nothing run; --overwrite remakes the part.
  o.overwrite = false;
  o.commit = "abc123";
  write_file_atomic(o.out_dir + "/parts/first/reproduce_part.json", "[]");
  ran.clear();
  CHECK_THROWS_WITH_AS(run_parts(paper, o), doctest::Contains("parts/first/reproduce_part.json: not a part record"),
                       Error);
  CHECK(ran.empty());
  o.overwrite = true;
  run_parts(paper, o);
  CHECK(ran == std::vector<std::string>{"train"});

  // A failing command names its part and its log.
  o.overwrite = true;
  o.commit = "def456";
  o.run_command = [](const std::vector<std::string>&, const std::string&) { return 3; };
  CHECK_THROWS_WITH_AS(run_parts(paper, o), doctest::Contains("part first failed (exit 3)"), Error);
}

TEST_CASE("reproduce: a part whose outputs were deleted is not finished and runs again; a failing part's error is shown") {
  TempDir dir;
  std::string option = "--limit=1";
  const Paper paper = counting_paper(&option);
  std::vector<std::string> ran;
  RunOptions o = quiet_run_options(dir);
  o.run_command = [&](const std::vector<std::string>& words, const std::string&) {
    ran.push_back(words[0]);
    if (words[0] == "train") {  // the part's output: a checkpoint
      fs::create_directories(words[2] + "/sub");
      write_file_atomic(words[2] + "/sub/checkpoint.safetensors", "weights");
    }
    return 0;
  };
  run_parts(paper, o);
  REQUIRE(ran == std::vector<std::string>{"train", "eval"});
  const std::string output = o.out_dir + "/parts/first/sub/checkpoint.safetensors";
  for (const bool overwrite : {false, true}) {
    CAPTURE(overwrite);
    o.overwrite = overwrite;
    ran.clear();
    fs::remove(output);
    const std::vector<PartOutcome> outcomes = run_parts(paper, o);
    CHECK(ran == std::vector<std::string>{"train"});  // remade; the other part is finished
    CHECK_FALSE(outcomes[0].skipped);
    CHECK(fs::exists(output));
  }
  // A truncated output is no finished part either.
  write_file_atomic(output, "w");
  ran.clear();
  run_parts(paper, o);
  CHECK(ran == std::vector<std::string>{"train"});
  ran.clear();
  run_parts(paper, o);
  CHECK(ran.empty());

  // A failing part's own error line is in the message, not only "see its log".
  fs::remove(output);
  o.run_command = [&](const std::vector<std::string>&, const std::string& log) {
    write_file_atomic(log, "adjoint train: starting\nadjoint: error: --data fortunes:16: /usr/share/games/fortunes is "
                           "missing: install Debian's fortunes package (apt-get install fortunes)\n");
    return 1;
  };
  CHECK_THROWS_WITH_AS(run_parts(paper, o),
                       doctest::Contains("part first failed (exit 1): --data fortunes:16: /usr/share/games/fortunes is "
                                         "missing: install Debian's fortunes package (apt-get install fortunes); its "
                                         "output is in "),
                       Error);
}

TEST_CASE("reproduce: a part runs in process through the command dispatcher, its output in its log") {
  TempDir dir;
  Paper paper;
  paper.name = "tiny";
  paper.parts = [](Scale, int) {
    return std::vector<Part>{{"model",
                              {"train", "--model", "bilinear_mlp", "--hidden", "4", "--data", "modadd:5", "--epochs", "1",
                               "--batch", "8", "--out", "{out}"},
                              1}};
  };
  RunOptions o;
  o.out_dir = dir.path().string();
  o.show_progress = false;
  o.threads = 1;
  const int threads_before = num_threads();
  run_parts(paper, o);
  CHECK(fs::exists(o.out_dir + "/parts/model/checkpoint.safetensors"));
  // The part ran with the runner's thread count, not all cores, and left the process's own as it was.
  CHECK(contains(read_text(o.out_dir + "/parts/model/index.html"), "<th>threads</th><td>1</td>"));
  CHECK(num_threads() == threads_before);
  CHECK_FALSE(read_text(o.out_dir + "/parts/model.log").empty());
}

namespace {

// Fabricated stitching results: one results.csv per pair and seed, with the relative score
// given per protocol at block 7.
void write_stitch_results(const std::string& parts, int seed, const std::string& pair, double standard, double control,
                          double invariance) {
  const std::string folder = cat(parts, "/stitch_", pair, "_s", seed);
  fs::create_directories(folder);
  write_file_atomic(folder + "/results.csv",
                    cat("front_block,objective,protocol,relative_score\n", "3,slm,standard,0.5\n",  // another block: not read
                        "7,slm,standard,", standard, "\n7,slm,control,", control, "\n7,slm,invariance,", invariance, "\n"));
}

const Claim& claim_named(const Paper& paper, const std::string& start) {
  for (const Claim& c : paper.claims)
    if (c.text.rfind(start, 0) == 0) return c;
  FAIL("no claim starting with ", start);
  throw Error("unreachable");
}

}  // namespace

TEST_CASE("reproduce: claims are judged from the parts' result files, holding and not holding") {
  TempDir dir;
  const std::string parts = dir.path().string() + "/parts";
  const Paper& stitching = find_paper("stitching");
  const Claim& invariance = claim_named(stitching, "The invariance-aware protocol tells the clean front");

  // Seed 0: invariance / standard = 0.2 / 0.9; seed 1: 0.3 / 0.9. Both under the bound 0.5.
  write_stitch_results(parts, 0, "C1_S1", 0.9, 0.85, 0.2);
  write_stitch_results(parts, 1, "C1_S1", 0.9, 0.85, 0.3);
  ClaimOutcome o = judge(invariance, parts, 2);
  CHECK(o.holds);
  CHECK(o.mean == doctest::Approx((0.2 / 0.9 + 0.3 / 0.9) / 2));
  CHECK(o.lo == doctest::Approx(0.2 / 0.9));
  CHECK(o.hi == doctest::Approx(0.3 / 0.9));
  CHECK(contains(o.ours, "over 2 seeds"));

  // Seed 1 now keeps most of its score: the claim does not hold, and says which seeds fail.
  write_stitch_results(parts, 1, "C1_S1", 0.9, 0.85, 0.8);
  o = judge(invariance, parts, 2);
  CHECK_FALSE(o.holds);
  CHECK(contains(o.why, "1 of 2 seeds"));
  CHECK(o.hi == doctest::Approx(0.8 / 0.9));

  // A missing result is "not measured", naming the file, never a number.
  o = judge(invariance, parts, 3);
  CHECK_FALSE(o.holds);
  CHECK(o.ours == "not measured");
  CHECK(contains(o.why, "stitch_C1_S1_s2/results.csv"));

  // A bound of the other side (at least): the control claim.
  const Claim& control = claim_named(stitching, "The fall comes from the IRIs");
  CHECK(judge(control, parts, 2).holds);  // 0.85 / 0.9 ≥ 0.8
  write_stitch_results(parts, 0, "C1_S1", 0.9, 0.5, 0.2);
  CHECK_FALSE(judge(control, parts, 2).holds);
}

TEST_CASE("reproduce: a language model's phases are blocks of its checkpoint matrix, a steady drift is not") {
  TempDir dir;
  const std::string parts = dir.path().string() + "/parts";
  const Claim& phases = claim_named(find_paper("tensor-similarity"), "A language model's checkpoint similarity matrix");
  const auto write_matrix = [&](int seed, const std::vector<std::vector<double>>& m) {
    const std::string folder = cat(parts, "/lm_similarity_s", seed);
    fs::create_directories(folder);
    std::string csv = "step";
    for (size_t i = 0; i < m.size(); ++i) csv += cat(",", 10 * (i + 1));
    for (size_t i = 0; i < m.size(); ++i) {
      csv += cat("\n", 10 * (i + 1));
      for (double v : m[i]) csv += cat(",", v);
    }
    write_file_atomic(folder + "/pairwise_similarity.csv", csv + "\n");
  };
  // Two phases: within 0.99 and 0.95, across 0.1; the cut after the second checkpoint
  // gives (0.99 + 0.95) / 2 − 0.1 = 0.87.
  write_matrix(0, {{1, 0.99, 0.1, 0.1}, {0.99, 1, 0.1, 0.1}, {0.1, 0.1, 1, 0.95}, {0.1, 0.1, 0.95, 1}});
  ClaimOutcome o = judge(phases, parts, 1);
  CHECK(o.holds);
  CHECK(o.mean == doctest::Approx(0.87));
  // A steady drift, 1 − 0.15·|i − j| over 6 checkpoints: the best cut (after the third) has
  // within 0.8 and across 0.55 (by hand), a gap of 0.25: no phases.
  std::vector<std::vector<double>> drift(6, std::vector<double>(6));
  for (int i = 0; i < 6; ++i)
    for (int j = 0; j < 6; ++j) drift[size_t(i)][size_t(j)] = 1 - 0.15 * std::abs(i - j);
  write_matrix(0, drift);
  o = judge(phases, parts, 1);
  CHECK_FALSE(o.holds);
  CHECK(o.mean == doctest::Approx(0.25));
  // A matrix that is not square is an error naming the file, never a number.
  write_file_atomic(cat(parts, "/lm_similarity_s0/pairwise_similarity.csv"), "step,10,20\n10,1,0.5\n");
  o = judge(phases, parts, 1);
  CHECK(o.ours == "not measured");
  CHECK(contains(o.why, "lm_similarity_s0/pairwise_similarity.csv"));
}

TEST_CASE("reproduce: the page holds the claims table computed from the results, and the summary figure") {
  TempDir dir;
  const std::string out = dir.path().string();
  const Paper& stitching = find_paper("stitching");
  write_stitch_results(out + "/parts", 0, "C1_S1", 0.9, 0.85, 0.2);
  write_stitch_results(out + "/parts", 0, "S1_C1", 1.0, 0.95, 0.9);
  write_stitch_results(out + "/parts", 0, "S1_S2", 1.0, 1.0, 0.9);
  write_stitch_results(out + "/parts", 0, "C1_C2", 1.0, 1.0, 0.3);
  RunOptions o;
  o.out_dir = out;
  const cli::Args args("reproduce", {{"out", out}}, {}, {"stitching"});
  write_page(stitching, o, {}, args);
  const std::string html = read_text(out + "/index.html");
  CHECK(contains(html, "<th>claim</th>"));
  CHECK(contains(html, "<th>holds here</th>"));
  CHECK(contains(html, "The invariance-aware protocol tells the clean front"));
  CHECK(contains(html, "0.222 (1 seed)"));  // 0.2 / 0.9, from the file above
  CHECK(contains(html, "<td>holds</td>"));
  CHECK(contains(html, "<td>does not hold</td>"));  // S1→C1 keeps 0.9 of its score
  CHECK(contains(html, "data:image/svg+xml;base64,"));
  CHECK(fs::exists(out + "/figures/relative_score.png"));
}

TEST_CASE("reproduce: a focus claim is judged only where its premise holds, the models recognising the tiles") {
  TempDir dir;
  const std::string parts = dir.path().string() + "/parts";
  const Paper& paper = find_paper("semantic-pullbacks");
  const Claim& soft = claim_named(paper, "The soft pullback focuses on the explained class's tiles more than the gradient");
  REQUIRE(soft.premise.has_value());
  // One explain part's metrics.csv: the two methods' focus, and the model's recognition rate.
  const auto write_metrics = [&](double soft_focus, double gradient_focus, double recognised) {
    const std::string folder = parts + "/explain_resnet18_s0";
    fs::create_directories(folder);
    write_file_atomic(folder + "/metrics.csv",
                      cat("method,metric,direction,higher_is_better,mean,std,ci_low,ci_high,count,undefined,images,note\n",
                          "soft_pullback,focus,higher is better,true,", soft_focus, ",0,0,0,16,0,16,\n",
                          "gradient,focus,higher is better,true,", gradient_focus, ",0,0,0,16,0,16,\n",
                          "model,focus_recognition,higher is better,true,", recognised, ",0,0,0,16,0,16,\n"));
  };
  // Tiles recognised on 16% of mosaics: whatever the scores, the premise fails and says so.
  write_metrics(0.7, 0.6, 0.16);
  ClaimOutcome o = judge(soft, parts, 1);
  CHECK_FALSE(o.holds);
  CHECK_FALSE(o.premise_holds);
  CHECK(o.mean == doctest::Approx(0.1));
  CHECK(o.premise == "0.160 (1 seed)");
  CHECK(contains(o.why, "its premise does not hold: the model recognises the mosaics' tiles"));
  CHECK(contains(o.why, "below 0.800"));
  // Recognised on 90%: the claim is judged, both ways.
  write_metrics(0.7, 0.6, 0.9);
  o = judge(soft, parts, 1);
  CHECK(o.premise_holds);
  CHECK(o.holds);
  write_metrics(0.5, 0.6, 0.9);
  o = judge(soft, parts, 1);
  CHECK(o.premise_holds);
  CHECK_FALSE(o.holds);
  CHECK(contains(o.why, "1 of 1 seed gives below 0.000"));
  // The table says which, with the premise's number beside ours.
  write_metrics(0.7, 0.6, 0.16);
  const cli::ReportTable table = claims_table(paper, parts, 1);
  bool found = false;
  for (const std::vector<std::string>& row : table.rows)
    if (row[0] == soft.text) {
      found = true;
      CHECK(row[3] == "0.100 (1 seed); premise: 0.160 (1 seed)");
      CHECK(row[4] == "premise does not hold");
      CHECK(contains(row[2], "premise: share of the focus mosaics whose top class is the target class (holds at ≥ 0.800)"));
    }
  CHECK(found);
}

TEST_CASE("reproduce: the language model's checkpoint matrix carries its standard errors") {
  TempDir dir;
  const std::string parts = dir.path().string() + "/parts";
  const Claim& bars = claim_named(find_paper("tensor-similarity"), "Every entry of the language model's checkpoint matrix");
  const std::string folder = cat(parts, "/lm_similarity_s0");
  fs::create_directories(folder);
  // No matrix at all (the part did not run, or stopped): not measured, although no error is over the bar.
  ClaimOutcome o = judge(bars, parts, 1);
  CHECK_FALSE(o.holds);
  CHECK(o.ours == "not measured");
  CHECK(contains(o.why, "lm_similarity_s0/pairwise_similarity.csv"));
  write_file_atomic(folder + "/pairwise_similarity.csv", "step,10,20\n10,1,0.5\n20,0.5,1\n");
  // No standard errors written: every pair was exact.
  CHECK(judge(bars, parts, 1).holds);
  write_file_atomic(folder + "/pairwise_similarity_se.csv", "step,10,20\n10,0,0.003\n20,0.003,0\n");
  o = judge(bars, parts, 1);
  CHECK(o.holds);
  CHECK(o.mean == doctest::Approx(0.003));
  write_file_atomic(folder + "/pairwise_similarity_se.csv", "step,10,20\n10,0,0.02\n20,0.02,0\n");
  CHECK_FALSE(judge(bars, parts, 1).holds);
  // Errors of another matrix (another run's checkpoints) are refused, naming the file.
  write_file_atomic(folder + "/pairwise_similarity_se.csv", "step,10,30\n10,0,0.003\n30,0.003,0\n");
  o = judge(bars, parts, 1);
  CHECK(o.ours == "not measured");
  CHECK(contains(o.why, "pairwise_similarity_se.csv"));
}

namespace {

// A reproduce folder's files by path, for comparing two runs, but for what records how and
// when a run went rather than what it found: the folder locks (the holder's pid), the parts'
// console logs (*.log), their records (seconds, start and finish times, rank), the training
// logs (log.csv, log.json: seconds and samples per second) and the parts' own pages (their
// date and timings). In the paper's page, its date and the parts' seconds are masked.
std::map<std::string, std::string> reproduce_files(const std::string& out) {
  static const std::set<std::string> kHowAndWhen = {".lock", "reproduce_part.json", "log.csv", "log.json"};
  std::map<std::string, std::string> files;
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(out)) {
    if (!e.is_regular_file()) continue;
    const std::string name = fs::relative(e.path(), out).string();
    const std::string leaf = e.path().filename().string();
    if (kHowAndWhen.count(leaf) || e.path().extension() == ".log" || (leaf == "index.html" && name != "index.html"))
      continue;
    files[name] = read_text(e.path().string());
  }
  std::string& page = files["index.html"];
  page = std::regex_replace(page, std::regex("<tr><th>date</th><td>[^<]*</td></tr>"), "<tr><th>date</th><td>DATE</td></tr>");
  page = std::regex_replace(page, std::regex("<td>[0-9]+\\.[0-9]{3}</td><td>(ran|finished before|)</td></tr>"),
                            "<td>SECONDS</td><td>$1</td></tr>");
  return files;
}

}  // namespace

TEST_CASE("reproduce under mpirun: parts go to free ranks once the parts they read are done; the page and the "
          "results are one process's, and a failing part names itself and its rank") {
  if (mpi_tests_skipped()) return;
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  TempDir dir;
  // Six quick parts: stage 1, stage 2 (reading 1), two branches reading stage 2 (which two
  // ranks can run at once), and a similarity of each branch to stage 2.
  const std::string args = "--threads 1 reproduce tensor-similarity --only forget_removed_similarity,"
                           "forget_control_similarity --out " + dir.file("run");
  const ProgramRun one = adjoint_run(args, 0, dir);
  REQUIRE_MESSAGE(one.exit_code == 0, one.output);
  fs::rename(dir.file("run"), dir.file("one"));  // the same --out for both: the page names it
  const ProgramRun two = adjoint_run(args, 2, dir);
  CAPTURE(two.output);
  REQUIRE(two.exit_code == 0);

  const std::map<std::string, std::string> reference = reproduce_files(dir.file("one"));
  REQUIRE(reference.count("parts/forget_control_similarity_s0/tensorsim.csv"));
  REQUIRE(reference.count("parts/forget_stage2_s0/checkpoint.safetensors"));
  REQUIRE(contains(reference.at("index.html"), "<td>SECONDS</td><td>ran</td></tr>"));
  const std::map<std::string, std::string> ranked = reproduce_files(dir.file("run"));
  CHECK(ranked.size() == reference.size());
  for (const auto& [name, bytes] : reference) {
    CAPTURE(name);
    CHECK((ranked.count(name) && ranked.at(name) == bytes));
  }

  // No part started before a part it reads had finished, and both ranks ran parts.
  const std::vector<Part> parts = select_parts(find_paper("tensor-similarity").parts(Scale::Quick, 1),
                                               {"forget_removed_similarity", "forget_control_similarity"});
  REQUIRE(parts.size() == 6);
  auto record = [&](const std::string& part) {
    return parse_json(read_text(dir.file("run/parts/" + part + "/reproduce_part.json")));
  };
  std::set<int> ranks;
  int reads = 0;
  for (const Part& p : parts) {
    const Json mine = record(p.name);
    ranks.insert(int(mine.find("rank")->as_number()));
    for (const std::string& read : parts_read(p)) {
      CAPTURE(p.name);
      CAPTURE(read);
      CHECK(record(read).find("finished_at")->as_number() <= mine.find("started_at")->as_number());
      ++reads;
    }
  }
  CHECK(reads == 7);  // stage 2 reads 1; each branch reads stage 2; each similarity reads stage 2 and its branch
  CHECK(ranks == std::set<int>{0, 1});

  // A part made otherwise (here: with 7 threads) is refused once, by one rank, before any part runs.
  const std::string control_record = dir.file("run/parts/forget_control_s0/reproduce_part.json");
  const std::string made_with_one = read_text(control_record);
  REQUIRE(contains(made_with_one, "\"threads\": 1,"));
  std::string made_with_seven = made_with_one;
  made_with_seven.replace(made_with_seven.find("\"threads\": 1,"), 13, "\"threads\": 7,");
  std::ofstream(control_record) << made_with_seven;
  fs::remove_all(dir.file("run/parts/forget_stage1_s0"));  // would run again, were the refusal not first
  const ProgramRun refused = adjoint_run(args, 2, dir);
  CAPTURE(refused.output);
  CHECK(refused.exit_code != 0);
  size_t said = 0;
  for (size_t at = refused.output.find("was made by"); at != std::string::npos; at = refused.output.find("was made by", at + 1))
    ++said;
  CHECK(said == 1);
  CHECK(contains(refused.output, "part forget_control_s0 in "));
  CHECK_FALSE(contains(refused.output, "done on rank"));
  CHECK_FALSE(fs::exists(dir.file("run/parts/forget_stage1_s0")));
  std::ofstream(control_record) << made_with_one;
  const ProgramRun remade = adjoint_run("--threads 1 reproduce tensor-similarity --only forget_stage1 --out " + dir.file("run"), 0, dir);
  REQUIRE_MESSAGE(remade.exit_code == 0, remade.output);

  // A part that fails on a rank ends the job in one line naming it and the rank: stage 1's
  // checkpoint made unreadable, its size kept, so that stage 1 counts as finished, and stage 2
  // to be made again.
  fs::remove_all(dir.file("run/parts/forget_stage2_s0"));
  const std::string checkpoint = dir.file("run/parts/forget_stage1_s0/checkpoint.safetensors");
  const std::string zeros(size_t(fs::file_size(checkpoint)), '\0');
  std::ofstream(checkpoint, std::ios::binary) << zeros;
  const ProgramRun failed = adjoint_run("--threads 1 reproduce tensor-similarity --only forget_stage2 --out " +
                                            dir.file("run"), 2, dir);
  CAPTURE(failed.output);
  CHECK(failed.exit_code != 0);
  CHECK(std::regex_search(failed.output, std::regex("rank [01] of 2: reproduce: part forget_stage2_s0 failed \\(exit")));
  CHECK_FALSE(fs::exists(dir.file("run/parts/forget_stage2_s0/reproduce_part.json")));
}

namespace {

// An ImageNet-shaped folder: ROOT/val/<wnid>/ of two classes, two 256 × 256 PNGs each of
// seeded random pixels.
std::string write_imagenet_folder(const TempDir& dir) {
  const std::string root = dir.file("imagenet");
  Generator gen(37);
  for (const char* wnid : {"n01440764", "n01443537"}) {
    fs::create_directories(cat(root, "/val/", wnid));
    for (int k = 0; k < 2; ++k) {
      const Tensor noise = uniform({256 * 256 * 3}, 0.0f, 255.0f, gen);
      std::vector<uint8_t> rgb(size_t(noise.numel()));
      for (size_t i = 0; i < rgb.size(); ++i) rgb[i] = uint8_t(noise.data()[i]);
      REQUIRE(stbi_write_png(cat(root, "/val/", wnid, "/", k, ".png").c_str(), 256, 256, 3, rgb.data(), 256 * 3) != 0);
    }
  }
  return root;
}

std::string reproduce_weights(const std::string& name) {
  return cat(ADJOINT_SOURCE_DIR, "/tests/goldens/reproduce_imagenet/", name, ".pth");
}

const std::string kAllWeights = cat("resnet50=", reproduce_weights("resnet50"), ",vgg11_bn=", reproduce_weights("vgg11_bn"),
                                    ",pvt_v2_b1=", reproduce_weights("pvt_v2_b1"));

}  // namespace

TEST_CASE("reproduce semantic-pullbacks --imagenet: the paper's table on an ImageNet folder and torch.save'd weights") {
  TempDir dir;
  const std::string root = write_imagenet_folder(dir), out = dir.file("out");
  // The weights of tests/goldens/gen_reproduce_imagenet.py: torchvision's and timm's layouts
  // at 1/32 of their width with 2 classes, at the presets' 224 pixels; 3 images a model,
  // the four methods and metrics the claims read.
  const CommandOutcome o =
      run_adjoint({"reproduce", "semantic-pullbacks", "--imagenet", root, "--weights", kAllWeights, "--count", "3",
                   "--width", "0.03125", "--classes", "2", "--methods",
                   "soft_pullback,pullback_ascent,gradient,guided_gradcam", "--metrics",
                   "infidelity,max_sensitivity,focus,random_logit", "--out", out});
  CAPTURE(o.out);
  CAPTURE(o.err);
  REQUIRE(o.code == 0);
  // The estimate comes first, before any part ran.
  CHECK(o.out.rfind(cat("reproduce semantic-pullbacks on ", root, ": 3 models; estimate: about "), 0) == 0);

  // One explain --evaluate per model through its weights' preset, on the folder.
  for (const auto& [model, preset] : {std::pair{"resnet50", "resnet50_v1"}, std::pair{"vgg11_bn", "vgg11_bn_v1"},
                                     std::pair{"pvt_v2_b1", "pvt_v2"}}) {
    CAPTURE(model);
    const std::string record = read_text(cat(out, "/parts/explain_", model, "/reproduce_part.json"));
    CHECK(contains(record, cat("adjoint explain --evaluate --model ", model, " --imagenet-stem --weights ",
                               reproduce_weights(model))));
    CHECK(contains(record, cat("--data imagenet:", root, ":", preset)));
    CHECK(contains(read_text(cat(out, "/parts/explain_", model, ".log")), "(3 x 224 x 224)"));
  }

  // Ours is read from the parts' metrics, the paper's published value beside it.
  const Paper& published = find_paper("semantic-pullbacks");
  ImagenetSetting setting;
  setting.root = root;
  setting.weights = {{"resnet50", reproduce_weights("resnet50")}, {"pvt_v2_b1", reproduce_weights("pvt_v2_b1")}};
  setting.width = 0.03125;
  setting.classes = 2;
  const Paper paper = published.on_imagenet(setting);
  const cli::ReportTable table = claims_table(paper, out + "/parts", 1);
  const CsvRows resnet = read_csv(out + "/parts/explain_resnet50/metrics.csv");
  const double infidelity_ratio = resnet.number("mean", {{"method", "gradient"}, {"metric", "infidelity"}}) /
                                  resnet.number("mean", {{"method", "soft_pullback"}, {"metric", "infidelity"}});
  int rows_checked = 0;
  for (const std::vector<std::string>& row : table.rows) {
    CAPTURE(row[0]);
    if (row[0] == "The soft pullback is more faithful than the gradient (ResNet-50, ImageNet)") {
      CHECK(row[1] == "13.9 = 83.3 / 5.99 (infidelity of the gradient / of the soft pullback, ResNet-50, docs/methods.md §1.5)");
      CHECK(row[3] == cat(fixed(infidelity_ratio, 3), " (1 seed)"));
      CHECK(row[4] == (infidelity_ratio >= 1 ? "holds" : "does not hold"));
      ++rows_checked;
    }
    if (row[0] == "The soft pullback's maps depend on the class more than Guided Grad-CAM's (ResNet-50, ImageNet)") {
      CHECK(row[1] == "0.480 = 0.420 − (−0.060) (random logit of guided Grad-CAM − of the soft pullback, ResNet-50, "
                      "docs/methods.md §1.5)");
      CHECK(row[3] != "not measured");
      ++rows_checked;
    }
    if (row[0] == "The soft pullback focuses on the explained class's tiles more than the gradient (ResNet-50, ImageNet)") {
      CHECK(contains(row[3], "; premise: "));  // the share of mosaics recognised, measured
      ++rows_checked;
    }
    if (row[0] == "Pullback ascent is more faithful than the gradient (PVT-v2-b1, ImageNet)") {
      CHECK(row[1] == "5.47 = 8.91 / 1.63 (infidelity of the gradient / of pullback ascent, PVT-v2-b1, docs/methods.md §1.5)");
      CHECK(row[3] != "not measured");
      ++rows_checked;
    }
    if (row[0] == "The soft pullback is more stable than the gradient (PVT-v2-b1, ImageNet)") {
      CHECK(contains(row[1], "the paper gives no number"));
      CHECK(row[3] != "not measured");
      ++rows_checked;
    }
  }
  CHECK(rows_checked == 5);
  CHECK(table.rows.size() == 2 * 7);  // the claims of the two models given here
  // The page and the printed table hold the same: the published value beside ours.
  CHECK(contains(read_text(out + "/index.html"), "the paper gives no number for VGG-11-BN"));
  CHECK(contains(o.out, cat("The soft pullback is more faithful than the gradient (ResNet-50, ImageNet): ",
                            fixed(infidelity_ratio, 3), " (1 seed) [paper: 13.9 = 83.3 / 5.99")));
}

TEST_CASE("reproduce --imagenet: an unknown model, a folder without val/ and stray options are refused in one line") {
  TempDir dir;
  const std::string root = write_imagenet_folder(dir);
  const auto refused = [&](std::vector<std::string> words, const std::string& message) {
    words.insert(words.begin(), {"reproduce", "semantic-pullbacks"});
    words.insert(words.end(), {"--out", dir.file("out")});
    const CommandOutcome o = run_adjoint(words);
    CAPTURE(o.out);
    CAPTURE(o.err);
    CHECK(o.code == 2);
    CHECK(contains(o.err, message));
    // One error line (a usage error also shows the usage line and where the help is).
    size_t errors = 0;
    for (size_t at = o.err.find("adjoint: error: "); at != std::string::npos; at = o.err.find("adjoint: error: ", at + 1))
      ++errors;
    CHECK(errors == 1);
    CHECK(o.err.find('\n', o.err.find("adjoint: error: ")) + 1 == o.err.find("Run 'adjoint reproduce --help'"));
    CHECK_FALSE(fs::exists(dir.file("out/parts")));
  };
  refused({"--imagenet", root, "--weights", cat("resnet18=", reproduce_weights("resnet50"))},
          "option --weights: semantic-pullbacks evaluates resnet50, vgg11_bn, pvt_v2_b1 on ImageNet, not 'resnet18'");
  refused({"--imagenet", dir.file("nowhere"), "--weights", kAllWeights},
          cat("option --imagenet: ", dir.file("nowhere"), "/val is not a folder"));
  refused({"--imagenet", root, "--weights", cat("resnet50=", dir.file("missing.pth"))},
          cat("option --weights: resnet50=", dir.file("missing.pth"), ": no such file"));
  refused({"--imagenet", root, "--weights", "resnet50"}, "option --weights expects NAME=FILE pairs, got 'resnet50'");
  refused({"--imagenet", root}, "--imagenet needs --weights NAME=FILE");
  refused({"--weights", kAllWeights}, "--weights goes with --imagenet ROOT");
  refused({"--imagenet", root, "--weights", kAllWeights, "--seeds", "2"}, "no --scale, --seeds or --only");
  // A paper without an ImageNet setting.
  const CommandOutcome o = run_adjoint({"reproduce", "stitching", "--imagenet", root, "--weights", kAllWeights, "--out",
                                        dir.file("out")});
  CHECK(o.code == 2);
  CHECK(contains(o.err, "stitching has no ImageNet setting"));
}

