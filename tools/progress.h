// Progress of long work: a bar with rate and ETA redrawn in place on a terminal, plain
// lines (at most one every few seconds) when the output is a file or a pipe.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace adjoint::cli {

class ProgressBar {
public:
  // `label` prefixes every line; `unit` names what is counted ("batch", "image").
  // `already_done` items were done before this bar started (a resumed run): they fill the
  // bar but not the rate or the ETA, which measure this process's work.
  ProgressBar(std::string label, int64_t total, std::string unit, int64_t already_done = 0);
  ~ProgressBar();  // ends the bar's line on a terminal
  // Reports `done` of `total`, with free text after the bar (loss, accuracy, ...).
  void update(int64_t done, const std::string& detail = "");
  // The same when items differ in cost: `work` in [0, 1] is the share of the whole cost
  // spent so far, and the bar's fill and ETA follow it rather than the item count.
  void update(int64_t done, double work, const std::string& detail = "");
  void finish(const std::string& detail = "");

private:
  std::string label_, unit_;
  int64_t total_, already_done_;
  bool terminal_;
  bool open_line_ = false;
  std::chrono::steady_clock::time_point start_, last_print_;
};

// The rate and the time left of work of which `done` of `total` items are done, the
// share `fraction` of its cost, `elapsed` seconds after this process started with
// `already_done` items done (a resumed run): only this process's items count.
struct Pace {
  double per_second = 0, eta_seconds = 0;
};
Pace pace_of(int64_t done, int64_t already_done, int64_t total, double fraction, double elapsed);

// "1m05s", "12.3s": durations for humans.
std::string format_duration(double seconds);

}  // namespace adjoint::cli
