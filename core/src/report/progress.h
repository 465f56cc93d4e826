// Internal (report/): the one-line progress display of rank 0, and the number formats it uses.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ciuic::report {

// "step 12/500 | loss 2.3456 | lr 3.0e-04 | 12.3k tok/s | ETA 3m12s".
// On a terminal (or when the launcher says its terminal is one: CIUIC_PROGRESS_TTY=1) the line
// is redrawn in place on stderr; otherwise it is logged every `every` steps as a plain line.
class Progress {
 public:
  Progress(int64_t first_step, int64_t total_steps, bool enabled, bool force_tty);
  // `note` (e.g. "slow: rank 2 +31%") is appended when not empty.
  void update(int64_t step, double loss, double lr, double tokens_per_s, bool log_now,
              const std::string& note = "");
  void message(const std::string& line);  // a line that must not be overwritten
  void finish();

 private:
  std::string eta(int64_t step) const;
  int64_t first_, total_;
  bool enabled_, tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

std::string human_count(double v);        // 12345 -> "12.3k"
std::string human_duration(double secs);  // 192 -> "3m12s"

}  // namespace ciuic::report
