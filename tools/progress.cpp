#include "tools/progress.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include "engine/error.h"

namespace adjoint::cli {

std::string format_duration(double s) {
  if (s < 60) return cat(int64_t(s * 10) / 10.0, "s");
  const int64_t total = int64_t(s), h = total / 3600, m = (total % 3600) / 60, sec = total % 60;
  char buf[32];
  if (h > 0) std::snprintf(buf, sizeof buf, "%lldh%02lldm", (long long)h, (long long)m);
  else std::snprintf(buf, sizeof buf, "%lldm%02llds", (long long)m, (long long)sec);
  return buf;
}

Pace pace_of(int64_t done, int64_t already_done, int64_t total, double fraction, double elapsed) {
  Pace p;
  p.per_second = elapsed > 0 ? double(done - already_done) / elapsed : 0;
  // The share done in `elapsed`, from the share done before this process started.
  const double start = total > 0 ? double(already_done) / double(total) : 0;
  p.eta_seconds = fraction > start ? elapsed * (1 - fraction) / (fraction - start) : 0;
  return p;
}

ProgressBar::ProgressBar(std::string label, int64_t total, std::string unit, int64_t already_done)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      already_done_(std::clamp<int64_t>(already_done, 0, total)),
      terminal_(::isatty(::fileno(stderr)) != 0),
      start_(std::chrono::steady_clock::now()), last_print_(start_) {}

ProgressBar::~ProgressBar() {
  if (open_line_) std::fputc('\n', stderr);
}

void ProgressBar::update(int64_t done, const std::string& detail) {
  update(done, total_ > 0 ? double(done) / double(total_) : 1.0, detail);
}

void ProgressBar::update(int64_t done, double work, const std::string& detail) {
  const auto now = std::chrono::steady_clock::now();
  const double since_print = std::chrono::duration<double>(now - last_print_).count();
  const bool last = done >= total_;
  if (!last && since_print < (terminal_ ? 0.1 : 5.0)) return;
  last_print_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double fraction = std::clamp(work, 0.0, 1.0);
  const Pace pace = pace_of(done, already_done_, total_, fraction, elapsed);
  std::string line = cat(label_, " ", done, "/", total_, " ", int(fraction * 100), "% ",
                         int64_t(pace.per_second * 10) / 10.0, " ", unit_, "/s ETA ", format_duration(pace.eta_seconds),
                         detail.empty() ? "" : "  " + detail);
  if (terminal_) {
    const int width = 24, filled = int(fraction * width);
    std::string bar = "[";
    bar.append(size_t(filled), '#').append(size_t(width - filled), '.').append("] ");
    std::fprintf(stderr, "\r\033[K%s%s", bar.c_str(), line.c_str());
    open_line_ = true;
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
  std::fflush(stderr);
}

void ProgressBar::finish(const std::string& detail) {
  update(total_, detail);
  if (open_line_) std::fputc('\n', stderr), open_line_ = false;
}

}  // namespace adjoint::cli
