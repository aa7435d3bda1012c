#include "tools/reproduce/runner.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>

#include "engine/distributed/ranks.h"
#include "engine/error.h"
#include "engine/io/files.h"
#include "engine/io/json.h"
#include "engine/io/table.h"
#include "engine/threads.h"
#include "tools/commit.h"  // generated at build time (tools/meson.build): ADJOINT_COMMIT
#include "tools/progress.h"

namespace fs = std::filesystem;

namespace adjoint::reproduce {
namespace {

constexpr const char* kRecordName = "reproduce_part.json";

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

// Runs `words` through the command dispatcher in this process, stdout and stderr into `log`.
// The part runs with `threads` worker threads: the count is part of what made its numbers
// (OpenBLAS's bits differ between thread counts), and cli::run would otherwise take all cores.
int run_in_process(const std::vector<std::string>& words, const std::string& log, int threads) {
  const int threads_before = num_threads();
  std::vector<std::string> argv_words = {"adjoint", "--threads", std::to_string(threads)};
  argv_words.insert(argv_words.end(), words.begin(), words.end());
  std::vector<char*> argv;
  for (std::string& w : argv_words) argv.push_back(w.data());
  argv.push_back(nullptr);

  std::fflush(stdout);
  std::fflush(stderr);
  const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (log_fd < 0) throw Error(cat("reproduce: cannot write the log ", log));
  const int saved_out = ::dup(1), saved_err = ::dup(2);
  ::dup2(log_fd, 1);
  ::dup2(log_fd, 2);
  ::close(log_fd);
  const int code = cli::run(int(argv.size()) - 1, argv.data());
  std::fflush(stdout);
  std::fflush(stderr);
  ::dup2(saved_out, 1);
  ::dup2(saved_err, 2);
  ::close(saved_out);
  ::close(saved_err);
  set_num_threads(threads_before);  // this process's own, as before the part
  return code;
}

}  // namespace

std::string command_line(const Part& part) {
  std::string line = "adjoint";
  for (const std::string& w : part.words) line += " " + w;
  return line;
}

std::vector<std::string> parts_read(const Part& part) {
  std::vector<std::string> names;
  for (const std::string& w : part.words)
    for (size_t at = w.find("{parts}/"); at != std::string::npos; at = w.find("{parts}/", at + 1)) {
      const std::string rest = w.substr(at + 8);
      names.push_back(rest.substr(0, rest.find('/')));
    }
  return names;
}

std::vector<Part> select_parts(const std::vector<Part>& parts, const std::vector<std::string>& prefixes) {
  if (prefixes.empty()) return parts;
  std::set<std::string> wanted;
  for (const std::string& prefix : prefixes) {
    bool any = false;
    for (const Part& p : parts)
      if (p.name.rfind(prefix, 0) == 0) wanted.insert(p.name), any = true;
    if (!any) throw UsageError(cat("reproduce: --only ", prefix, ": no part's name starts with it (--list counts the parts)"));
  }
  // A part reads only earlier parts: from the last to the first, each wanted part adds those it reads.
  for (auto p = parts.rbegin(); p != parts.rend(); ++p) {
    if (!wanted.count(p->name)) continue;
    for (const std::string& name : parts_read(*p)) wanted.insert(name);
  }
  std::vector<Part> selected;
  for (const Part& p : parts)
    if (wanted.count(p.name)) selected.push_back(p);
  return selected;
}

namespace {

// The files a part wrote into `folder` (but for dot files: a command's .lock), each with its
// size: what its record lists, so that a part whose outputs were since deleted or cut short
// is not taken for finished.
Json output_files(const std::string& folder) {
  Json files = Json::object();
  for (const fs::directory_entry& e : fs::recursive_directory_iterator(folder)) {
    const std::string name = fs::relative(e.path(), folder).string();
    if (e.is_regular_file() && e.path().filename().string()[0] != '.' && name != kRecordName)
      files[name] = Json(int64_t(e.file_size()));
  }
  return files;
}

// Whether every file a part's record lists is still there with its size (a record without
// the list, from before it was kept: yes).
bool outputs_intact(const std::string& record_path) {
  const Json record = parse_json(read_text_file(record_path));
  const Json* files = record.find("files");
  if (!files || !files->is_object()) return true;
  const fs::path folder = fs::path(record_path).parent_path();
  for (const auto& [name, size] : files->as_object()) {
    std::error_code ec;
    const uintmax_t actual = fs::file_size(folder / name, ec);
    if (ec || !size.is_number() || double(actual) != size.as_number()) return false;
  }
  return true;
}

// Now, as seconds since 1970 (UTC), to the millisecond: when a part started and finished.
double seconds_since_epoch() {
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  return double(std::chrono::duration_cast<std::chrono::milliseconds>(now).count()) / 1000.0;
}

// The seconds a part's record says it took.
double recorded_seconds(const std::string& record_path) {
  const Json record = parse_json(read_text_file(record_path));
  const Json* seconds = record.find("seconds");
  check(seconds && seconds->is_number(), "reproduce: ", record_path, " records no seconds");
  return seconds->as_number();
}

// The last "adjoint: error: ..." line of a part's log, without that prefix; empty when none.
std::string last_error_line(const std::string& log) {
  static const std::string kPrefix = "adjoint: error: ";
  std::istringstream in(fs::exists(log) ? read_text_file(log) : std::string());
  std::string last;
  for (std::string line; std::getline(in, line);)
    if (line.rfind(kPrefix, 0) == 0) last = line.substr(kPrefix.size());
  return last;
}

// Which of `parts` a record in `parts_dir` shows finished (skipped, with its seconds) into
// `outcomes`, counting them in `already`; throws Error on a record made otherwise (unless
// `overwrite`) or not a part record.
void read_records(const std::vector<Part>& parts, const std::string& parts_dir, const std::string& commit, int threads,
                  bool overwrite, std::vector<PartOutcome>& outcomes, int64_t& already) {
  for (const Part& p : parts) {
    PartOutcome outcome{p.name};
    const std::string record_path = parts_dir + "/" + p.name + "/" + kRecordName;
    const std::string text = fs::exists(record_path) ? read_text_file(record_path) : "";
    if (!text.empty()) {
      std::string made_by, made_at;
      int made_threads = 0;
      double made_seconds = 0;
      try {  // a record that is not what this runner writes is named, never half-read
        const Json record = parse_json(text);
        made_by = record.find("command") ? record.find("command")->as_string() : "";
        made_at = record.find("commit") ? record.find("commit")->as_string() : "";
        const Json* made_with = record.find("threads");
        made_threads = made_with && made_with->is_number() ? int(made_with->as_number()) : 0;
        made_seconds = record.find("seconds") ? record.find("seconds")->as_number() : 0;
      } catch (const Error& e) {  // with --overwrite, remade like any part made otherwise
        if (!overwrite)
          throw Error(cat("reproduce: ", record_path, ": not a part record (", e.what(),
                          "): remove it or rerun with --overwrite"));
        made_by.clear();
      }
      const bool made_so = made_by == command_line(p) && made_at == commit && made_threads == threads;
      if (made_so && outputs_intact(record_path)) {
        outcome.skipped = true;
        outcome.seconds = made_seconds;
        ++already;
      } else if (made_so) {
        // Made so, but its outputs were since deleted or cut short: it runs again.
      } else if (!overwrite) {
        throw Error(cat("reproduce: part ", p.name, " in ", parts_dir, "/", p.name, " was made by `", made_by,
                        "` at commit ", made_at, " with ", made_threads, " threads, not `", command_line(p), "` at ",
                        commit, " with ", threads, ": rerun with --overwrite or another --out"));
      }
    }
    outcomes.push_back(outcome);
  }
}

}  // namespace

std::vector<PartOutcome> run_parts(const Paper& paper, const RunOptions& o) {
  const std::string parts_dir = o.out_dir + "/parts";
  fs::create_directories(parts_dir);
  const std::string commit = o.commit.empty() ? std::string(ADJOINT_COMMIT) : o.commit;
  const int threads = o.threads > 0 ? o.threads : num_threads();
  const std::vector<Part> parts = select_parts(paper.parts(o.scale, o.seeds), o.only);
  double total_cost = 0;
  for (const Part& p : parts) total_cost += p.expected_seconds;

  // First pass: which parts are finished, and refuse any made otherwise before running anything.
  std::vector<PartOutcome> outcomes;
  int64_t already = 0;
  std::string refusal;
  try {
    read_records(parts, parts_dir, commit, threads, o.overwrite, outcomes, already);
  } catch (const Error& e) {
    if (distributed::size() == 1) throw;
    refusal = e.what();
  }
  if (distributed::size() > 1) {
    // Every rank reads the same records, all before any part is made again (this exchange
    // waits for every rank); a refusal is said once, by the first rank that refuses, and ends the job.
    std::vector<double> refused(size_t(distributed::size()));
    const double mine = refusal.empty() ? 0 : 1;
    distributed::allgather(&mine, 1, refused.data());
    const int first = int(std::find(refused.begin(), refused.end(), 1.0) - refused.begin());
    if (first == distributed::rank()) distributed::abort(1, refusal.c_str());
    if (first < distributed::size()) distributed::barrier();  // until that rank's abort ends the job
  }

  // The parts to run, and which of them each reads (a finished part is there to read).
  std::vector<size_t> to_run;
  std::map<std::string, int64_t> run_index;
  for (size_t i = 0; i < parts.size(); ++i)
    if (!outcomes[i].skipped) run_index[parts[i].name] = int64_t(to_run.size()), to_run.push_back(i);
  std::vector<std::vector<int64_t>> needs(to_run.size());
  for (size_t k = 0; k < to_run.size(); ++k)
    for (const std::string& name : parts_read(parts[to_run[k]]))
      if (run_index.count(name)) needs[k].push_back(run_index.at(name));

  // One process shows a progress bar; over ranks, the rank that ran a part says so in a line.
  const bool over_ranks = distributed::size() > 1;
  std::unique_ptr<cli::ProgressBar> bar;
  if (o.show_progress && !over_ranks)
    bar = std::make_unique<cli::ProgressBar>(cat("reproduce ", paper.name), int64_t(parts.size()), "part", already);
  double cost_done = 0;
  for (size_t i = 0; i < parts.size(); ++i)
    if (outcomes[i].skipped) cost_done += parts[i].expected_seconds;
  int64_t parts_done = already;
  // Each part on whichever rank it is handed, once the parts it reads are done; a failing part
  // throws here, and over ranks ends the job in one line naming it and the rank.
  distributed::for_each_item(int64_t(to_run.size()), needs, [&](int64_t k) {
    const size_t i = to_run[size_t(k)];
    const Part& p = parts[i];
    const std::string folder = parts_dir + "/" + p.name;
    if (bar) bar->update(parts_done, total_cost > 0 ? cost_done / total_cost : 0, cat("running ", p.name));
    fs::remove_all(folder);  // an interrupted or overwritten part starts afresh
    std::vector<std::string> words;
    for (const std::string& w : p.words)
      words.push_back(replace_all(replace_all(w, "{out}", folder), "{parts}", parts_dir));
    const std::string log = parts_dir + "/" + p.name + ".log";
    const double started_at = seconds_since_epoch();
    const auto start = std::chrono::steady_clock::now();
    int code = 0;
    {
      // The part is a whole run of its own on this rank: its command sees a job of one.
      const distributed::JobOfOne alone;
      code = o.run_command ? o.run_command(words, log) : run_in_process(words, log, threads);
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (code != 0) {
      const std::string why = last_error_line(log);
      throw Error(cat("reproduce: part ", p.name, " failed (exit ", code, ")", why.empty() ? "" : ": " + why,
                      "; its output is in ", log));
    }
    fs::create_directories(folder);
    Json record = Json::object();
    record["files"] = output_files(folder);
    record["command"] = command_line(p);
    record["commit"] = commit;
    record["scale"] = scale_name(o.scale);
    record["threads"] = threads;
    record["seconds"] = seconds;
    // When and where it ran: for the record, never compared.
    record["started_at"] = started_at;
    record["finished_at"] = seconds_since_epoch();
    record["rank"] = distributed::rank();
    write_file_atomic(folder + "/" + kRecordName, to_json(record, 2) + "\n");
    outcomes[i].seconds = seconds;
    cost_done += p.expected_seconds;
    ++parts_done;
    if (over_ranks)
      std::printf("reproduce: part %s done on rank %d of %d in %s\n", p.name.c_str(), distributed::rank(),
                  distributed::size(), cli::format_duration(seconds).c_str());
  });
  if (bar) bar->finish(cat(parts.size(), " parts, ", already, " finished before"));
  // The parts other ranks ran: their seconds as recorded there.
  if (over_ranks)
    for (size_t i : to_run) outcomes[i].seconds = recorded_seconds(parts_dir + "/" + parts[i].name + "/" + kRecordName);
  return outcomes;
}

namespace {

// A number read per seed, summarised, and judged against a bound.
struct SeedValues {
  std::vector<double> values;
  double mean = 0, lo = 0, hi = 0;
  std::string ours;   // "mean [lo, hi] over N seeds", or "not measured"
  std::string error;  // why it could not be read; empty when it was
  int failing = 0;    // seeds on the wrong side of the bound
};

SeedValues read_seeds(const std::function<double(const std::string&, int)>& value, const Bound& bound,
                      const std::string& parts_dir, int seeds) {
  SeedValues out;
  try {
    for (int s = 0; s < seeds; ++s) out.values.push_back(value(parts_dir, s));
  } catch (const Error& e) {
    out.ours = "not measured";
    out.error = e.what();
    out.values.clear();
    return out;
  }
  for (double v : out.values)
    if (!std::isfinite(v)) {
      out.ours = "not measured";
      out.error = "a seed's value is not a finite number";
      out.values.clear();
      return out;
    }
  out.lo = *std::min_element(out.values.begin(), out.values.end());
  out.hi = *std::max_element(out.values.begin(), out.values.end());
  double sum = 0;
  for (double v : out.values) sum += v;
  out.mean = sum / double(out.values.size());
  out.ours = seeds > 1 ? cat(fixed(out.mean, 3), " [", fixed(out.lo, 3), ", ", fixed(out.hi, 3), "] over ", seeds, " seeds")
                       : cat(fixed(out.mean, 3), " (1 seed)");
  for (double v : out.values) out.failing += bound.side == Bound::AtLeast ? v < bound.value : v > bound.value;
  return out;
}

// "1 of 2 seeds give below 0.800, the bound at which ... (worst 0.160)".
std::string failing_seeds(const SeedValues& v, const Bound& bound, int seeds, const char* what) {
  const bool at_least = bound.side == Bound::AtLeast;
  return cat(v.failing, " of ", seeds, " seed", seeds > 1 ? "s give" : " gives", " ", at_least ? "below " : "above ",
             fixed(bound.value, 3), ", the bound at which ", what, " (worst ", fixed(at_least ? v.lo : v.hi, 3), ")");
}

// "≥ 0.800"
std::string bound_text(const Bound& bound) {
  return cat(bound.side == Bound::AtLeast ? "≥ " : "≤ ", fixed(bound.value, 3));
}

}  // namespace

ClaimOutcome judge(const Claim& claim, const std::string& parts_dir, int seeds) {
  ClaimOutcome out;
  const SeedValues v = read_seeds(claim.value, claim.bound, parts_dir, seeds);
  out.values = v.values;
  out.mean = v.mean, out.lo = v.lo, out.hi = v.hi;
  out.ours = v.ours;
  if (!v.error.empty()) {
    out.why = v.error;
    return out;
  }
  if (claim.premise) {
    const SeedValues p = read_seeds(claim.premise->value, claim.premise->bound, parts_dir, seeds);
    out.premise = p.ours;
    if (!p.error.empty() || p.failing > 0) {
      out.premise_holds = false;
      out.why = cat("its premise does not hold: ", claim.premise->text, "; ",
                    p.error.empty() ? failing_seeds(p, claim.premise->bound, seeds, "it holds") : p.error);
      return out;
    }
  }
  out.holds = v.failing == 0;
  if (!out.holds) out.why = failing_seeds(v, claim.bound, seeds, "the claim holds");
  return out;
}

cli::ReportTable claims_table(const Paper& paper, const std::string& parts_dir, int seeds) {
  cli::ReportTable table;
  table.caption = cat("Claims of ", paper.title, ": ours computed from the parts' result files");
  table.header = {"claim", "paper", "ours (what)", "ours", "holds here", "why not"};
  for (const Claim& c : paper.claims) {
    const ClaimOutcome o = judge(c, parts_dir, seeds);
    std::string what = cat(c.ours, " (holds at ", bound_text(c.bound), ")"), ours = o.ours;
    if (c.premise) {
      what += cat("; premise: ", c.premise->ours, " (holds at ", bound_text(c.premise->bound), ")");
      if (!o.premise.empty()) ours += cat("; premise: ", o.premise);
    }
    const std::string verdict = o.ours == "not measured" ? "not measured"
                                : !o.premise_holds       ? "premise does not hold"
                                : o.holds                ? "holds"
                                                         : "does not hold";
    table.rows.push_back({c.text, c.paper_figure, what, ours, verdict, o.why});
  }
  return table;
}

void write_page(const Paper& paper, const RunOptions& o, const std::vector<PartOutcome>& parts,
                const cli::Args& args) {
  const std::string parts_dir = o.out_dir + "/parts";
  cli::HtmlReport report;
  const std::string setting =
      o.setting.empty() ? cat(scale_name(o.scale), " scale, ", o.seeds, " seed", o.seeds > 1 ? "s" : "") : o.setting;
  report.title = cat("adjoint reproduce ", paper.name, ": ", paper.title, " (", setting, ")");
  report.notes.push_back(cat("Every number below is read from the result files of the parts listed at the end; a part is "
                             "one `adjoint` command line, its own page linked.",
                             o.setting.empty() ? " Quick scale: small models and short runs, the same protocol; a claim "
                                                 "that does not hold at quick scale may at full scale."
                                               : ""));
  report.tables.push_back(claims_table(paper, parts_dir, o.seeds));
  fs::create_directories(o.out_dir + "/figures");
  const std::vector<std::string> figures = paper.draw(parts_dir, o.seeds, o.out_dir + "/figures");
  for (const std::string& stem : figures) {
    const std::string svg = stem + ".svg";
    report.figures.push_back(fs::exists(svg) ? svg : stem + ".png");
  }
  cli::ReportTable part_table;
  part_table.caption = "Parts (each in parts/<name>/ with its record reproduce_part.json and its own index.html)";
  part_table.header = {"part", "command line", "seconds", "this run"};
  double total = 0;
  const std::vector<Part> defined = select_parts(paper.parts(o.scale, o.seeds), o.only);
  for (size_t i = 0; i < parts.size() && i < defined.size(); ++i) {
    part_table.rows.push_back({parts[i].name, command_line(defined[i]), fixed(parts[i].seconds, 3),
                               parts[i].skipped ? "finished before" : "ran"});
    total += parts[i].seconds;
    const std::string page = parts_dir + "/" + parts[i].name + "/index.html";
    if (fs::exists(page)) report.files.push_back(page);
  }
  part_table.rows.push_back({"all parts", "", fixed(total, 3), ""});
  report.tables.push_back(part_table);
  cli::write_html_report(o.out_dir, args, report);
}

}  // namespace adjoint::reproduce
