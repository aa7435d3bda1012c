// The command line's option parser and dispatcher (tools/cli.h): how words become typed
// options, and how every kind of failure becomes one readable line and an exit code
// (2 for bad usage, 1 for a failure, never an escaped exception).
//
// Two commands exist only in this test binary: `probe` records the Args it was given and
// `fail` throws what it is told to. They register themselves exactly as the real
// commands in tools/ do.
#include <doctest/doctest.h>

#include <iostream>
#include <memory>
#include <new>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/error.h"
#include "engine/threads.h"
#include "tests/support.h"
#include "tools/cli.h"

using namespace adjoint;

namespace {

std::unique_ptr<cli::Args> last_probe;  // the Args of the latest `probe` run

const cli::Registration probe_command({
    .name = "probe",
    .summary = "records its options (test only)",
    .description = "",
    .arguments = "[FILE...]",
    .options = {{"count", "N", "an integer", "4"},
                {"rate", "X", "a number", "0.5"},
                {"name", "TEXT", "required: no default", ""},
                {"items", "LIST", "comma-separated", "a,b"},
                {"verbose", "", "a flag", ""}},
    .run =
        [](const cli::Args& args) {
          last_probe = std::make_unique<cli::Args>(args);
          return 0;
        },
});

const cli::Registration fail_command({
    .name = "fail",
    .summary = "throws what --kind says (test only)",
    .description = "",
    .arguments = "",
    .options = {{"kind", "KIND", "usage, error, std, alloc, unknown or exit3", "error"}},
    .run =
        [](const cli::Args& args) -> int {
          const std::string kind = args.text("kind");
          if (kind == "usage") throw UsageError("option --kind says usage");
          if (kind == "error") throw Error("reading model.safetensors: tensor 'w' has shape [3] not [4]");
          if (kind == "std") throw std::runtime_error("a standard exception");
          if (kind == "alloc") throw std::bad_alloc();
          if (kind == "unknown") throw 42;
          return 3;
        },
});

struct Outcome {
  int code = -1;
  std::string out, err;
};

// Redirects std::cout and std::cerr into strings for as long as it lives.
class CaptureStreams {
 public:
  CaptureStreams() : old_out_(std::cout.rdbuf(out.rdbuf())), old_err_(std::cerr.rdbuf(err.rdbuf())) {}
  ~CaptureStreams() {
    std::cout.rdbuf(old_out_);
    std::cerr.rdbuf(old_err_);
  }
  std::ostringstream out, err;

 private:
  std::streambuf* old_out_;
  std::streambuf* old_err_;
};

// Runs `adjoint <words…>`. Unless the words set --threads themselves, the current
// thread count is passed on, so that the default (all cores) does not change the thread
// count of the tests that run after this one.
Outcome run_cli(std::vector<std::string> words) {
  last_probe.reset();
  Outcome o;
  CaptureStreams capture;
  o.code = adjoint::testing::run_adjoint_words(std::move(words));
  o.out = capture.out.str();
  o.err = capture.err.str();
  return o;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

// A usage error: exit 2, the command's usage line, the message, a pointer to --help.
void check_usage_error(const Outcome& o, const std::string& usage, const std::string& message) {
  CAPTURE(o.err);
  CHECK(o.code == 2);
  CHECK(contains(o.err, usage));
  CHECK(contains(o.err, "adjoint: error: " + message + "\n"));
  CHECK(contains(o.err, "--help' for the options."));
  CHECK(last_probe == nullptr);  // the command never ran
}

}  // namespace

TEST_CASE("cli: options, flags, defaults and arguments reach the command typed") {
  const Outcome o = run_cli({"probe", "--count", "12", "--rate=-2.5e-3", "in.png", "--name", "x y", "--verbose",
                             "--items", "p,,q,", "out.png"});
  CAPTURE(o.err);
  REQUIRE(o.code == 0);
  REQUIRE(last_probe != nullptr);
  const cli::Args& a = *last_probe;
  CHECK(a.command() == "probe");
  CHECK(a.integer("count") == 12);
  CHECK(a.number("rate") == -2.5e-3);
  CHECK(a.text("name") == "x y");
  CHECK(a.flag("verbose"));
  CHECK(a.list("items") == std::vector<std::string>{"p", "q"});  // empty items are dropped
  CHECK(a.positionals() == std::vector<std::string>{"in.png", "out.png"});
  CHECK(o.err.empty());

  // Absent options read their defaults; `has` and `flag` tell given from defaulted.
  REQUIRE(run_cli({"probe"}).code == 0);
  CHECK(last_probe->integer("count") == 4);
  CHECK(last_probe->number("rate") == 0.5);
  CHECK(last_probe->list("items") == std::vector<std::string>{"a", "b"});
  CHECK_FALSE(last_probe->has("count"));
  CHECK_FALSE(last_probe->flag("verbose"));
  CHECK(last_probe->positionals().empty());
  // An option without a default is a usage error naming it when the command reads it.
  CHECK_THROWS_WITH_AS(last_probe->text("name"), "option --name is required", UsageError);

  // Global options may come before the command; `--` ends the options.
  REQUIRE(run_cli({"--threads", std::to_string(num_threads()), "probe", "--", "--count", "-h"}).code == 0);
  CHECK(last_probe->integer("count") == 4);
  CHECK(last_probe->positionals() == std::vector<std::string>{"--count", "-h"});
}

TEST_CASE("cli: typed getters reject malformed values and name the option") {
  REQUIRE(run_cli({"probe", "--count", "12x", "--rate", "fast"}).code == 0);  // parsing is lazy
  CHECK_THROWS_WITH_AS(last_probe->integer("count"), "option --count expects an integer, got '12x'", UsageError);
  CHECK_THROWS_WITH_AS(last_probe->number("rate"), "option --rate expects a number, got 'fast'", UsageError);
  REQUIRE(run_cli({"probe", "--count=", "--rate", "1e999"}).code == 0);
  CHECK_THROWS_WITH_AS(last_probe->integer("count"), "option --count expects an integer, got ''", UsageError);
  CHECK_THROWS_WITH_AS(last_probe->number("rate"), "option --rate expects a number, got '1e999'", UsageError);
  REQUIRE(run_cli({"probe", "--count", "99999999999999999999"}).code == 0);
  CHECK_THROWS_WITH_AS(last_probe->integer("count"),
                       "option --count: 99999999999999999999 is too large (the limit is ±9223372036854775807)",
                       UsageError);
}

TEST_CASE("cli: malformed command lines exit 2 with the usage line and one error line") {
  const std::string probe_usage = "usage: adjoint probe [options] [FILE...]\n";
  const std::string main_usage = "usage: adjoint [--threads N] <command> [options]\n";
  check_usage_error(run_cli({"probe", "--bogus"}), probe_usage, "unknown option --bogus for 'probe'");
  check_usage_error(run_cli({"--count", "3", "probe"}), main_usage,
                    "unknown option --count (command options go after the command name)");
  check_usage_error(run_cli({"frobnicate"}), main_usage, "unknown command 'frobnicate'");
  check_usage_error(run_cli({"probe", "--count"}), probe_usage, "option --count expects a value N");
  check_usage_error(run_cli({"probe", "--verbose=yes"}), probe_usage, "option --verbose takes no value");
  check_usage_error(run_cli({"probe", "--count", "1", "--count=2"}), probe_usage, "option --count given more than once");
  check_usage_error(run_cli({"fail", "extra"}), "usage: adjoint fail [options]\n",
                    "unexpected argument 'extra' ('fail' takes no arguments)");
  check_usage_error(run_cli({"--threads", "-1", "probe"}), probe_usage, "option --threads expects a count >= 0, got -1");
  check_usage_error(run_cli({"--threads", "two", "probe"}), probe_usage, "option --threads expects an integer, got 'two'");

  // No command at all: the overview goes to stderr and the exit code is 2.
  const Outcome none = run_cli({});
  CHECK(none.code == 2);
  CHECK(contains(none.err, main_usage));
  CHECK(contains(none.err, "  probe"));
  CHECK(none.out.empty());
}

TEST_CASE("cli: failures inside a command exit 1 with one line; usage errors it throws exit 2") {
  const auto one_line = [](const Outcome& o, int code, const std::string& line) {
    CAPTURE(o.err);
    CHECK(o.code == code);
    CHECK(o.err == line);
  };
  one_line(run_cli({"fail"}), 1, "adjoint: error: reading model.safetensors: tensor 'w' has shape [3] not [4]\n");
  one_line(run_cli({"fail", "--kind", "std"}), 1, "adjoint: error: a standard exception\n");
  one_line(run_cli({"fail", "--kind", "alloc"}), 1, "adjoint: error: out of memory\n");
  one_line(run_cli({"fail", "--kind", "unknown"}), 1, "adjoint: error: unknown failure\n");
  // A usage error found by the command itself (a bad combination of options) is still
  // reported against that command's usage line.
  const Outcome usage = run_cli({"fail", "--kind", "usage"});
  CHECK(usage.code == 2);
  CHECK(contains(usage.err, "usage: adjoint fail [options]\nadjoint: error: option --kind says usage\n"));
  // The command's own exit code passes through.
  const Outcome exit3 = run_cli({"fail", "--kind", "exit3"});
  CHECK(exit3.code == 3);
  CHECK(exit3.err.empty());
}

TEST_CASE("cli: --help prints to stdout and exits 0 without running the command") {
  const Outcome help = run_cli({"probe", "--help"});
  CHECK(help.code == 0);
  CHECK(last_probe == nullptr);
  CHECK(help.err.empty());
  CHECK(contains(help.out, "usage: adjoint probe [options] [FILE...]\n\nrecords its options (test only)\n"));
  CHECK(contains(help.out, "--count N"));
  CHECK(contains(help.out, "an integer (default: 4)\n"));
  CHECK(contains(help.out, "required: no default\n"));  // no "(default: )" when there is none
  CHECK(contains(help.out, "global options:\n  --threads N"));
  CHECK(run_cli({"-h", "fail"}).out == run_cli({"fail", "--help"}).out);

  const Outcome overview = run_cli({"--help"});
  CHECK(overview.code == 0);
  CHECK(contains(overview.out, "commands:\n"));
  // Commands are listed by name, whatever the order they registered in.
  CHECK(overview.out.find("  fail") < overview.out.find("  probe"));
}

TEST_CASE("cli: an empty or root --out is refused for every command that takes one, before it runs") {
  // Every command's files go under --out; "" and "/" would put them in the filesystem root
  // (train --out '' wrote its plots into /), so the parser refuses both, for every command.
  int commands_with_out = 0;
  for (const cli::Command* command : cli::commands()) {
    bool takes_out = false;
    for (const cli::OptionSpec& o : command->options) takes_out = takes_out || o.name == "out";
    if (!takes_out) continue;
    ++commands_with_out;
    for (const std::string root : {"", "/", "//", "/.", "/tmp/.."}) {
      const Outcome o = run_cli({command->name, "--out", root});
      CAPTURE(command->name);
      CAPTURE(root);
      CAPTURE(o.err);
      CHECK(o.code == 2);
      CHECK(contains(o.err, "adjoint: error: option --out"));
    }
  }
  CHECK(commands_with_out >= 6);  // train, predict, explain, stitch, tensorsim, reproduce, bench
}
