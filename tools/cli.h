// The `adjoint` command line: a registry of subcommands and a small option parser.
//
// A subcommand lives in its own file (listed in tools/meson.build) and registers itself
// with one static object; nothing else changes when a command is added:
//
//   int run_bench(const adjoint::cli::Args& args) { ... return 0; }
//   const adjoint::cli::Registration bench_command({
//       .name = "bench",
//       .summary = "time matmul and conv2d against raw sgemm",
//       .options = {{"repeats", "N", "timed runs per measurement", "5"}, {"quick", "", "a short run", ""}},
//       .run = run_bench,
//   });
//
// Options are `--name value`, `--name=value` or `--flag`. Every command also takes the
// global `--threads N` and `--help`. Errors: a UsageError (bad option or value) prints the
// command's usage line and exits 2; any other adjoint::Error prints
// "adjoint: error: ..." and exits 1.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace adjoint::cli {

struct OptionSpec {
  std::string name;      // without the dashes: "batch"
  std::string value;     // what the value is ("N", "FILE"); empty for a flag
  std::string help;      // one line
  std::string fallback;  // used when the option is absent; empty: no default
};

// The parsed options of one invocation, read through typed getters whose errors name the option.
class Args {
 public:
  Args(std::string command, std::map<std::string, std::string> values, std::map<std::string, std::string> fallbacks,
       std::vector<std::string> positionals);

  bool flag(const std::string& name) const;  // a flag given on the command line
  bool has(const std::string& name) const;   // an option given on the command line
  // The value given, else the option's default; a UsageError when it has neither.
  std::string text(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  double number(const std::string& name) const;
  // A comma-separated value: "a,b,c" → {"a", "b", "c"}; empty items are skipped, and a
  // list with none left (",") is a UsageError.
  std::vector<std::string> list(const std::string& name) const;
  const std::vector<std::string>& positionals() const { return positionals_; }
  const std::string& command() const { return command_; }
  // The options given on the command line, and every option of the command with the value
  // it has (given, else its default; empty for an absent option without one): for reports.
  const std::map<std::string, std::string>& given() const { return values_; }
  std::map<std::string, std::string> options() const;

 private:
  std::string command_;
  std::map<std::string, std::string> values_, fallbacks_;
  std::vector<std::string> positionals_;
};

struct Command {
  std::string name;
  std::string summary;      // one line, for `adjoint --help`
  std::string description;  // a paragraph, for `adjoint <name> --help`; may be empty
  std::string arguments;    // positional arguments in the usage line ("MODEL [IMAGE...]"); empty: none taken
  std::vector<OptionSpec> options;
  std::function<int(const Args&)> run;
};

// Registers a command at static-initialisation time (one object per command file).
struct Registration {
  explicit Registration(Command command);
};

// The registered commands, sorted by name.
std::vector<const Command*> commands();

// Parses argv and runs the chosen command; returns the process exit code. Never throws.
int run(int argc, char** argv);

}  // namespace adjoint::cli
