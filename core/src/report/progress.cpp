#include "report/progress.h"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include <ciuic/log.h>

namespace ciuic::report {

std::string human_count(double v) {
  char buf[32];
  if (v >= 1e9)
    std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6)
    std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3)
    std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else
    std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

std::string human_duration(double secs) {
  if (!std::isfinite(secs) || secs < 0) return "?";
  const long s = std::lround(secs);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}

Progress::Progress(int64_t first_step, int64_t total_steps, bool enabled, bool force_tty)
    : first_(first_step),
      total_(total_steps),
      enabled_(enabled),
      tty_(force_tty || isatty(STDERR_FILENO)),
      start_(std::chrono::steady_clock::now()) {}

std::string Progress::eta(int64_t step) const {
  const double done = static_cast<double>(step - first_ + 1);
  if (done <= 0) return "?";
  const double el =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return human_duration(el / done * static_cast<double>(total_ - step));
}

void Progress::update(int64_t step, double loss, double lr, double tokens_per_s, bool log_now,
                      const std::string& note) {
  if (!enabled_) return;
  char buf[256];
  char loss_text[32] = "-";  // the loss is read back from the device at logged steps only
  if (std::isfinite(loss)) std::snprintf(loss_text, sizeof loss_text, "%.4f", loss);
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %s | lr %.2e | %s tok/s | ETA %s",
                static_cast<long long>(step), static_cast<long long>(total_), loss_text, lr,
                human_count(tokens_per_s).c_str(), eta(step).c_str());
  const std::string line = note.empty() ? std::string(buf) : std::string(buf) + " | " + note;
  if (tty_) {
    std::fprintf(stderr, "\r\033[2K%s", line.c_str());
    std::fflush(stderr);
    drawn_ = true;
  } else if (log_now) {
    log_info(line);
  }
}

void Progress::message(const std::string& line) {
  if (!enabled_) return;
  if (tty_ && drawn_) {
    std::fprintf(stderr, "\r\033[2K");
    drawn_ = false;
  }
  log_info(line);
}

void Progress::finish() {
  if (enabled_ && tty_ && drawn_) std::fprintf(stderr, "\n");
  drawn_ = false;
}

}  // namespace ciuic::report
