// `adjoint reproduce PAPER --out DIR`: one command per paper. Trains every model the paper
// needs, runs the analyses, judges the paper's claims from the results and writes
// DIR/index.html (tools/reproduce/runner.h). The papers are a table (tools/reproduce/paper.h),
// one file each under tools/reproduce/.
#include <cmath>
#include <cstdio>
#include <optional>

#include "engine/distributed/ranks.h"
#include "engine/error.h"
#include "engine/threads.h"
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
    if (p.on_imagenet)
      std::printf("  on your ImageNet folder and pretrained weights: --imagenet ROOT --weights NAME=FILE,... (--help)\n");
  }
}

// --imagenet ROOT --weights NAME=FILE,... [--count N --width X --classes N]; refuses those
// options without --imagenet, and --imagenet for a paper without an ImageNet setting.
std::optional<ImagenetSetting> imagenet_setting(const cli::Args& a, const Paper& paper) {
  if (!a.has("imagenet")) {
    for (const char* option : {"weights", "count", "width", "classes", "methods", "metrics"})
      if (a.has(option)) throw UsageError(cat("reproduce: --", option, " goes with --imagenet ROOT"));
    return std::nullopt;
  }
  if (!paper.on_imagenet) throw UsageError(cat("reproduce: ", paper.name, " has no ImageNet setting (--imagenet)"));
  if (a.has("scale") || a.has("seeds") || a.has("only"))
    throw UsageError("reproduce: --imagenet runs the paper's own setting once: no --scale, --seeds or --only");
  if (!a.has("weights")) throw UsageError("reproduce: --imagenet needs --weights NAME=FILE,... (e.g. resnet50=r50.pth)");
  ImagenetSetting s;
  s.root = a.text("imagenet");
  for (const std::string& item : a.list("weights")) {
    const size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size())
      throw UsageError(cat("option --weights expects NAME=FILE pairs, got '", item, "'"));
    s.weights.push_back({item.substr(0, eq), item.substr(eq + 1)});
  }
  if (a.has("count")) {
    s.count = a.integer("count");
    if (s.count < 1) throw UsageError(cat("option --count expects an integer >= 1, got ", s.count));
  }
  if (a.has("width")) {
    s.width = a.number("width");
    if (!(s.width > 0) || !std::isfinite(s.width)) throw UsageError(cat("option --width expects a number > 0, got ", a.text("width")));
  }
  if (a.has("methods")) s.methods = a.list("methods");
  if (a.has("metrics")) s.metrics = a.list("metrics");
  if (a.has("classes")) {
    s.classes = a.integer("classes");
    if (s.classes < 2) throw UsageError(cat("option --classes expects an integer >= 2, got ", s.classes));
  }
  return s;
}

int run_reproduce(const cli::Args& a) {
  if (a.flag("list")) {
    print_list();
    return 0;
  }
  if (a.positionals().size() != 1) throw UsageError("reproduce: name one paper (adjoint reproduce --list names them)");
  const Paper& published = find_paper(a.positionals()[0]);
  if (!a.has("out")) throw UsageError("reproduce: --out DIR is needed");
  const std::optional<ImagenetSetting> imagenet = imagenet_setting(a, published);
  RunOptions o;
  o.out_dir = a.text("out");
  o.scale = parse_scale(a.text("scale"));
  const Paper paper = imagenet ? published.on_imagenet(*imagenet) : published;
  o.seeds = a.has("seeds") ? int(a.integer("seeds")) : paper.default_seeds[o.scale == Scale::Quick ? 0 : 1];
  if (o.seeds < 1 || o.seeds > 20) throw UsageError(cat("option --seeds expects 1 to 20, got ", o.seeds));
  o.overwrite = a.flag("overwrite");
  if (a.has("only")) o.only = a.list("only");
  if (imagenet)
    o.setting = cat("ImageNet at ", imagenet->root,
                    imagenet->count > 0 ? cat(", ", imagenet->count, " images a model") : std::string());
  const auto lock = cli::lock_output_folder(o.out_dir);
  if (imagenet) {
    double estimate = 0;
    for (const Part& p : paper.parts(o.scale, o.seeds)) estimate += p.expected_seconds;
    std::printf("reproduce %s on %s: %zu models; estimate: about %s at %d threads (the report's cost model and a "
                "measured pass of each model; finished parts are skipped)\n",
                paper.name.c_str(), imagenet->root.c_str(), imagenet->weights.size(),
                cli::format_duration(estimate).c_str(), num_threads());
    for (const std::string& line : paper.estimate_lines) std::printf("  %s\n", line.c_str());
    std::fflush(stdout);
  }
  const std::vector<PartOutcome> outcomes = run_parts(paper, o);
  if (distributed::rank() != 0) return 0;  // under mpirun, rank 0 judges the claims and writes the page
  write_page(paper, o, outcomes, a);
  const cli::ReportTable claims = claims_table(paper, o.out_dir + "/parts", o.seeds);
  double seconds = 0;
  for (const PartOutcome& p : outcomes) seconds += p.seconds;
  for (const auto& row : claims.rows)
    std::printf("%-14s %s: %s [paper: %s]%s%s\n", row[4].c_str(), row[0].c_str(), row[3].c_str(), row[1].c_str(),
                row[5].empty() ? "" : "; ", row[5].c_str());
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
                   "once the parts each reads are done; each part runs on its rank as one process.\n"
                   "--imagenet ROOT --weights NAME=FILE,...: the paper's own table on your ImageNet folder and pretrained\n"
                   "weights (semantic-pullbacks: resnet50, vgg11_bn, pvt_v2_b1), one `explain --evaluate` per model at\n"
                   "224 pixels through its weights' preset; prints a time estimate first, and the claims table gives the\n"
                   "paper's published values beside ours.",
    .arguments = "[PAPER]",
    .options = {{"list", "", "list the papers, their claims and times", ""},
                {"scale", "NAME", "quick (minutes) or full (the headline claims)", "quick"},
                {"seeds", "N", "seeds (default: the paper's for the scale)", ""},
                {"out", "DIR", "where the parts and the page go", ""},
                {"overwrite", "", "rerun parts made by another command line, commit or thread count", ""},
                {"only", "PREFIXES", "only the parts whose names start so (and the parts they read), e.g. lm or grok", ""},
                {"imagenet", "ROOT", "the paper's own setting on your ImageNet folder (ROOT/val/<wnid>/*) with --weights", ""},
                {"weights", "LIST", "with --imagenet: NAME=FILE pairs of pretrained weights (.pth or .safetensors), e.g. "
                                    "resnet50=r50.pth,vgg11_bn=v.pth,pvt_v2_b1=p.pth", ""},
                {"count", "N", "with --imagenet: images per model (default: the protocol's 1000)", ""},
                {"width", "X", "with --imagenet: channel multiplier of the models (default 1, the published ones)", ""},
                {"classes", "N", "with --imagenet: classes of the models' heads (default 1000)", ""},
                {"methods", "LIST", "with --imagenet: the explanation methods evaluated (default: all)", ""},
                {"metrics", "LIST", "with --imagenet: the metrics evaluated (default: all, the paper's full table)", ""}},
    .run = run_reproduce,
});

}  // namespace
}  // namespace adjoint::reproduce
