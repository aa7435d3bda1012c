// Running a paper (tools/reproduce/paper.h): its parts, restartably, then its claims and its page.
//
// Each part writes into DIR/parts/<name>/ and, when its command succeeded, a record
// DIR/parts/<name>/reproduce_part.json: the command line (with its "{out}" and "{parts}"
// placeholders, so a moved folder still matches), the commit the executable was built from
// and the scale (and, for the record only, when and on which rank it ran). A rerun skips a part whose record names the same command line and commit,
// and refuses, in one line, one made by another command line or commit unless told to
// overwrite it. A part folder without a record (an interrupted run) is cleared and run again.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "tools/cli.h"
#include "tools/html_report.h"
#include "tools/reproduce/paper.h"

namespace adjoint::reproduce {

struct RunOptions {
  std::string out_dir;
  Scale scale = Scale::Quick;
  int seeds = 1;
  bool overwrite = false;
  std::string commit;  // the commit recorded and compared; empty: the executable's own
  int threads = 0;     // worker threads every part runs with, recorded and compared; 0: this process's
  std::vector<std::string> only;  // name prefixes of the parts to run (select_parts); empty: all
  // Runs one part's words (without "adjoint"), returns the exit code; default: in process
  // through the command dispatcher (tools/cli.h), its output into DIR/parts/<name>.log.
  std::function<int(const std::vector<std::string>& words, const std::string& log)> run_command;
  bool show_progress = true;
  std::string setting;  // how the page names the run (the user's ImageNet folder); empty: its scale and seeds
};

struct PartOutcome {
  std::string name;
  bool skipped = false;  // finished by an earlier run
  double seconds = 0;    // as recorded when it ran
};

// The part's command line with "{out}" and "{parts}" in place, as recorded.
std::string command_line(const Part& part);

// The names of the parts `part` reads: each "{parts}/NAME[/...]" in its words.
std::vector<std::string> parts_read(const Part& part);

// The parts whose names start with one of `prefixes` and every part they read ("{parts}/NAME"
// in their words), transitively, in the paper's order; all of them when `prefixes` is empty.
// UsageError for a prefix that starts no part's name.
std::vector<Part> select_parts(const std::vector<Part>& parts, const std::vector<std::string>& prefixes);

// Runs the parts of `paper` (those `options.only` selects) in order, skipping finished ones; throws Error on a refused
// or failed part (naming it and its log). Under mpirun (distributed::for_each_item) rank 0 hands each part to a free
// rank once the parts it reads are done; the part runs there as a job of one (distributed::JobOfOne), and a failing
// part ends the job in one line naming it and the rank. Returns on every rank once every part is done, each part's
// seconds as its record says.
std::vector<PartOutcome> run_parts(const Paper& paper, const RunOptions& options);

// A claim judged over seeds 0 .. seeds-1.
struct ClaimOutcome {
  std::vector<double> values;  // one per seed
  double mean = 0, lo = 0, hi = 0;
  bool holds = false;
  bool premise_holds = true;   // false where the claim's premise fails on a seed (then holds is false)
  std::string why;             // one sentence where it does not hold (or could not be read)
  std::string ours;            // "mean [lo, hi]" over the seeds, or "not measured"
  std::string premise;         // the premise's number as `ours` is written; empty without a premise
};
ClaimOutcome judge(const Claim& claim, const std::string& parts_dir, int seeds);

// The claims table of the page: claim, paper's figure, ours (with the premise's number where
// the claim has one), holds here ("premise does not hold" where it fails), why not.
cli::ReportTable claims_table(const Paper& paper, const std::string& parts_dir, int seeds);

// DIR/index.html: the claims table, the summary figures, the parts with links to their pages.
void write_page(const Paper& paper, const RunOptions& options, const std::vector<PartOutcome>& parts,
                const cli::Args& args);

}  // namespace adjoint::reproduce
