// Every `adjoint` command line README.md shows runs, in order, in one empty folder, so that
// the README cannot go stale. A line may end in `# tests: OPTIONS`: the test adds those
// options, each replacing the line's own value of the same option, so that commands that
// take minutes for a reader take seconds here (the README says so above its commands).
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "engine/error.h"
#include "tests/support.h"

using namespace adjoint;
using namespace adjoint::testing;
namespace fs = std::filesystem;

namespace {

struct ReadmeCommand {
  int line = 0;                    // where it starts in README.md (1-based)
  std::vector<std::string> words;  // after `adjoint`
  std::string test_options;        // what follows "tests:" in its comment
};

std::vector<std::string> split_words(const std::string& text) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

// The `adjoint` lines of the ```sh blocks of a Markdown text, continuation lines joined.
std::vector<ReadmeCommand> readme_commands(const std::string& markdown) {
  std::vector<ReadmeCommand> commands;
  std::istringstream in(markdown);
  bool in_sh = false;
  std::string pending;
  int number = 0, start = 0;
  for (std::string line; std::getline(in, line);) {
    ++number;
    if (line.rfind("```", 0) == 0) {
      in_sh = !in_sh && line == "```sh";
      continue;
    }
    if (!in_sh) continue;
    if (pending.empty()) start = number;
    if (!line.empty() && line.back() == '\\') {
      pending += line.substr(0, line.size() - 1) + " ";
      continue;
    }
    const std::string whole = pending + line;
    pending.clear();
    const size_t hash = whole.find('#');
    const std::string command = whole.substr(0, hash), comment = hash == std::string::npos ? "" : whole.substr(hash);
    std::vector<std::string> words = split_words(command);
    if (words.empty() || words[0] != "adjoint") continue;
    words.erase(words.begin());
    const size_t tests = comment.find("tests:");
    commands.push_back({start, words, tests == std::string::npos ? "" : comment.substr(tests + 6)});
  }
  return commands;
}

// `words` with `options` ("--name [value] ...") applied: an option the words already hold
// gets the new value, any other is appended.
std::vector<std::string> with_options(std::vector<std::string> words, const std::string& options) {
  const std::vector<std::string> extra = split_words(options);
  for (size_t i = 0; i < extra.size(); ++i) {
    REQUIRE_MESSAGE(extra[i].rfind("--", 0) == 0, "'# tests:' expects --options, got '", extra[i], "'");
    const bool has_value = i + 1 < extra.size() && extra[i + 1].rfind("--", 0) != 0;
    const std::string value = has_value ? extra[i + 1] : "";
    auto at = std::find(words.begin(), words.end(), extra[i]);
    if (at == words.end()) {
      words.push_back(extra[i]);
      if (has_value) words.push_back(value);
    } else if (has_value) {
      REQUIRE_MESSAGE(at + 1 != words.end(), extra[i], " has no value to replace");
      *(at + 1) = value;
    }
    if (has_value) ++i;
  }
  return words;
}

std::string joined(const std::vector<std::string>& words) {
  std::string s;
  for (const std::string& w : words) s += (s.empty() ? "" : " ") + w;
  return s;
}

}  // namespace

TEST_CASE("readme commands: the lines are found, scaled and cover every command") {
  const std::string text =
      "```sh\n"
      "adjoint train --epochs 9 --out runs/a   # about a minute; tests: --epochs 1 --max-steps 2\n"
      "adjoint --threads 2 bench \\\n"
      "        --quick\n"
      "bash tools/quickstart.sh demo\n"
      "```\n"
      "adjoint eval (not in a sh block)\n"
      "```cpp\nadjoint in code\n```\n";
  const std::vector<ReadmeCommand> found = readme_commands(text);
  REQUIRE(found.size() == 2);
  CHECK(found[0].line == 2);
  CHECK(joined(with_options(found[0].words, found[0].test_options)) == "train --epochs 1 --out runs/a --max-steps 2");
  CHECK(found[1].line == 3);
  CHECK(joined(found[1].words) == "--threads 2 bench --quick");

  // The README shows an example of every command the executable has.
  const std::vector<ReadmeCommand> readme = readme_commands(read_text(fs::path(ADJOINT_SOURCE_DIR) / "README.md"));
  std::set<std::string> shown;
  for (const ReadmeCommand& c : readme) {
    size_t i = 0;
    while (i < c.words.size() && c.words[i].rfind("--", 0) == 0) i += 2;  // global options take a value
    if (i < c.words.size()) shown.insert(c.words[i]);
  }
  // The commands `adjoint --help` lists (the test binary also registers commands of its own).
  TempDir dir;
  const ProgramRun help = run_adjoint_program("--help", dir);
  REQUIRE(help.exit_code == 0);
  std::istringstream lines(help.output.substr(help.output.find("commands:")));
  std::string line;
  std::getline(lines, line);
  int listed = 0;
  while (std::getline(lines, line) && !line.empty()) {
    const std::string name = split_words(line).at(0);
    CHECK_MESSAGE(shown.count(name), "README.md shows no example of adjoint ", name);
    ++listed;
  }
  CHECK(listed >= 8);
}

TEST_CASE("readme: a user's guide of at most 300 lines") {
  const std::string text = read_text(fs::path(ADJOINT_SOURCE_DIR) / "README.md");
  const long lines = std::count(text.begin(), text.end(), '\n');
  CHECK_MESSAGE(lines <= 300, "README.md has ", lines, " lines; its limit is 300 (move detail into docs/)");
}

TEST_CASE("readme commands: every adjoint line of README.md runs, scaled as it says" *
          doctest::skip(!fs::is_directory("/usr/share/datasets/fashion-mnist"))) {
  REQUIRE_MESSAGE(fs::exists(adjoint_exe()), "build the adjoint executable first: ", adjoint_exe());
  const std::vector<ReadmeCommand> commands = readme_commands(read_text(fs::path(ADJOINT_SOURCE_DIR) / "README.md"));
  REQUIRE(commands.size() >= 8);
  TempDir dir;
  const auto start = std::chrono::steady_clock::now();
  double seconds = 0;
  std::string timings;
  for (const ReadmeCommand& c : commands) {
    const std::string line = joined(with_options(c.words, c.test_options));
    const std::string log = dir.file("command.log");
    const int status = std::system(
        ("cd '" + dir.path().string() + "' && '" + adjoint_exe() + "' " + line + " > '" + log + "' 2>&1").c_str());
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    CHECK_MESSAGE(code == 0, "README.md line ", c.line, ": adjoint ", line, "\n", read_text(log));
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() - seconds;
    seconds += took;
    timings += cat("  ", took, " s  line ", c.line, ": ", c.words.at(c.words[0] == "--threads" ? 2 : 0), "\n");
  }
  MESSAGE("README.md's ", commands.size(), " commands ran in ", seconds, " s:\n", timings);
  // What the commands made is there: the later lines read it, and the checks above would
  // have failed without it; two files no later line reads are checked here.
  CHECK(fs::exists(dir.file("predictions.csv")));
  CHECK(fs::exists(dir.file("stitch_C1_S1/results.md")));
  // reproduce ran a real part of a paper, not only --list.
  CHECK(fs::exists(dir.file("repro_tensorsim/parts/forget_stage1_s0/checkpoint.safetensors")));
  CHECK(fs::exists(dir.file("repro_tensorsim/index.html")));
}
