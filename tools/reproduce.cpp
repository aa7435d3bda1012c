// `adjoint reproduce PAPER --out DIR`: one command per paper. Trains every model the paper
// needs, runs the analyses, judges the paper's claims from the results and writes
// DIR/index.html (tools/reproduce/runner.h). The papers are a table (tools/reproduce/paper.h),
// one file each under tools/reproduce/.
#include <cstdio>

#include "engine/distributed.h"
#include "engine/error.h"
#include "tools/cli.h"
#include "tools/folder_lock.h"
#include "tools/progress.h"
#include "tools/reproduce/paper.h"
#include "tools/reproduce/runner.h"

namespace adjoint::reproduce {
namespace {

void print_list() {
  for (const Paper& p : papers()) {
    std::printf("%s: %s\n", p.name.c_str(), p.title.c_str());
    std::printf("  quick (%d seed%s by default): %s\n", p.default_seeds[0], p.default_seeds[0] > 1 ? "s" : "",
                p.quick_time.c_str());
    std::printf("  full (%d seeds by default): %s\n", p.default_seeds[1], p.full_time.c_str());
    std::printf("  parts at quick scale, 1 seed: %zu; at full scale, 1 seed: %zu\n", p.parts(Scale::Quick, 1).size(),
                p.parts(Scale::Full, 1).size());
    for (const Claim& c : p.claims) std::printf("  - %s [paper: %s]\n", c.text.c_str(), c.paper_figure.c_str());
  }
}

int run_reproduce(const cli::Args& a) {
  if (a.flag("list")) {
    print_list();
    return 0;
  }
  if (a.positionals().size() != 1) throw UsageError("reproduce: name one paper (adjoint reproduce --list names them)");
  const Paper& paper = find_paper(a.positionals()[0]);
  if (!a.has("out")) throw UsageError("reproduce: --out DIR is needed");
  RunOptions o;
  o.out_dir = a.text("out");
  o.scale = parse_scale(a.text("scale"));
  o.seeds = a.has("seeds") ? int(a.integer("seeds")) : paper.default_seeds[o.scale == Scale::Quick ? 0 : 1];
  if (o.seeds < 1 || o.seeds > 20) throw UsageError(cat("option --seeds expects 1 to 20, got ", o.seeds));
  o.overwrite = a.flag("overwrite");
  if (a.has("only")) o.only = a.list("only");
  const auto lock = cli::lock_output_folder(o.out_dir);
  const std::vector<PartOutcome> outcomes = run_parts(paper, o);
  if (distributed::rank() != 0) return 0;  // under mpirun, rank 0 judges the claims and writes the page
  write_page(paper, o, outcomes, a);
  const cli::ReportTable claims = claims_table(paper, o.out_dir + "/parts", o.seeds);
  double seconds = 0;
  for (const PartOutcome& p : outcomes) seconds += p.seconds;
  for (const auto& row : claims.rows)
    std::printf("%-14s %s: %s%s%s\n", row[4].c_str(), row[0].c_str(), row[3].c_str(), row[5].empty() ? "" : "; ",
                row[5].c_str());
  std::printf("parts took %s in all; wrote %s/index.html\n", cli::format_duration(seconds).c_str(), o.out_dir.c_str());
  return 0;
}

const cli::Registration reproduce_command({
    .name = "reproduce",
    .summary = "reproduce a paper's claims from scratch: one page with its claims table and figures",
    .description = "Runs every part of a paper (training, analyses) as `adjoint` command lines, each into\n"
                   "DIR/parts/<name>/ with a record of its command line, commit and thread count (--threads): a\n"
                   "rerun skips finished parts and refuses parts made otherwise (unless --overwrite). Then judges the paper's claims\n"
                   "from the parts' results and writes DIR/index.html. `--list` names the papers, their claims\n"
                   "and the time each scale takes on 2 cores. Under mpirun, rank 0 hands the parts to free ranks\n"
                   "once the parts each reads are done; each part runs on its rank as one process.",
    .arguments = "[PAPER]",
    .options = {{"list", "", "list the papers, their claims and times", ""},
                {"scale", "NAME", "quick (minutes) or full (the headline claims)", "quick"},
                {"seeds", "N", "seeds (default: the paper's for the scale)", ""},
                {"out", "DIR", "where the parts and the page go", ""},
                {"overwrite", "", "rerun parts made by another command line, commit or thread count", ""},
                {"only", "PREFIXES", "only the parts whose names start so (and the parts they read), e.g. lm or grok", ""}},
    .run = run_reproduce,
});

}  // namespace
}  // namespace adjoint::reproduce
