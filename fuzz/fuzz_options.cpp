// The command line: the input is argv, words separated by NUL bytes, given to cli::run
// with one test command that reads every option through the typed getters. cli::run must
// answer every input with an exit code and never throw.
#include <cstdlib>
#include <string>
#include <vector>

#include "tools/cli.h"

namespace {

int read_all(const adjoint::cli::Args& args) {
  (void)args.integer("count");
  (void)args.number("rate");
  (void)args.list("items");
  (void)args.text("name");
  return 0;
}

const adjoint::cli::Registration probe({
    .name = "probe",
    .summary = "reads its options",
    .description = "",
    .arguments = "[FILE...]",
    .options = {{"count", "N", "an integer", "4"},
                {"rate", "X", "a number", "0.5"},
                {"name", "TEXT", "no default", ""},
                {"items", "LIST", "comma-separated", "a,b"},
                {"verbose", "", "a flag", ""}},
    .run = read_all,
});

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::vector<std::string> words = {"adjoint"};
  std::string word;
  for (size_t i = 0; i < size; ++i) {
    if (data[i] == 0) words.push_back(word), word.clear();
    else word += char(data[i]);
  }
  words.push_back(word);
  if (words.size() > 64) return 0;
  std::vector<char*> argv;
  for (std::string& w : words) argv.push_back(w.data());
  const int code = adjoint::cli::run(int(argv.size()), argv.data());
  if (code < 0 || code > 2) std::abort();
  return 0;
}
