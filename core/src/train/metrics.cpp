#include "train/metrics.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include <ciuic/error.h>
#include <ciuic/log.h>

#include "train/tensorboard.h"

namespace ciuic::train {

namespace {

std::string write_error(const std::string& path, int err) {
  return "cannot write metrics file " + path + ": " + std::strerror(err) +
         " ([log] metrics_file; free some space or point it to another file system)";
}

}  // namespace

MetricsLog::MetricsLog(const std::string& path) : path_(path) {
  if (path.empty()) return;
  f_ = std::fopen(path.c_str(), "a");
  if (!f_)
    throw Error("cannot open metrics file " + path + " for writing: " + std::strerror(errno) +
                " ([log] metrics_file)");
}

MetricsLog::~MetricsLog() {
  if (f_) std::fclose(f_);  // every record was flushed (or its failure thrown) by write()
}

void MetricsLog::enable_tensorboard(const std::string& dir) { tb_ = std::make_unique<TensorBoardWriter>(dir); }

void MetricsLog::write(const nlohmann::json& record) {
  if (!error_.empty()) throw Error(error_);  // an earlier record was lost: so is this one
  if (tb_) {
    int64_t step = 0;
    auto scalars = tensorboard_scalars(record, &step);
    if (!scalars.empty()) tb_->add_scalars(step, scalars);
  }
  if (!f_) return;
  const std::string line = record.dump() + "\n";
  errno = 0;
  const bool ok = std::fwrite(line.data(), 1, line.size(), f_) == line.size() && std::fflush(f_) == 0;
  if (ok) return;
  const int err = errno != 0 ? errno : EIO;
  // The stream is unusable: close it now (its buffer cannot be written either) so that the
  // destructor does not try again, and stop the run.
  std::fclose(f_);
  f_ = nullptr;
  error_ = write_error(path_, err);
  throw Error(error_);
}

std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& record, int64_t* step) {
  std::vector<std::pair<std::string, double>> out;
  if (!record.is_object() || !record.contains("step") || !record["step"].is_number_integer()) return out;
  *step = record["step"].get<int64_t>();
  const std::string event = record.value("event", "");
  std::string prefix;
  if (event.empty()) prefix = "train/";
  else if (event == "eval") prefix = "eval/";
  else if (event == "exact_match") prefix = "exact_match/";
  else return out;
  for (auto it = record.begin(); it != record.end(); ++it) {
    const std::string& k = it.key();
    if (k == "step" || k == "event") continue;
    double v;
    if (it->is_number()) v = it->get<double>();
    else if (it->is_boolean()) v = it->get<bool>() ? 1.0 : 0.0;
    else continue;
    std::string name = k;
    if (event == "eval" && name.rfind("eval_", 0) == 0) name = name.substr(5);
    if (event == "exact_match" && name != "questions") name += "_" + record.value("when", std::string());
    out.emplace_back(prefix + name, v);
  }
  return out;
}

std::string human_count(double v) {
  char buf[32];
  if (v >= 1e9) std::snprintf(buf, sizeof buf, "%.2fG", v / 1e9);
  else if (v >= 1e6) std::snprintf(buf, sizeof buf, "%.2fM", v / 1e6);
  else if (v >= 1e3) std::snprintf(buf, sizeof buf, "%.1fk", v / 1e3);
  else std::snprintf(buf, sizeof buf, "%.0f", v);
  return buf;
}

std::string human_duration(double secs) {
  if (!std::isfinite(secs) || secs < 0) return "?";
  const long s = std::lround(secs);
  char buf[32];
  if (s >= 3600) std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s / 60) % 60);
  else if (s >= 60) std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else std::snprintf(buf, sizeof buf, "%lds", s);
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
  const double el = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  return human_duration(el / done * static_cast<double>(total_ - step));
}

void Progress::update(int64_t step, double loss, double lr, double tokens_per_s, bool log_now) {
  if (!enabled_) return;
  char buf[256];
  char loss_text[32] = "-";  // the loss is read back from the device at logged steps only
  if (std::isfinite(loss)) std::snprintf(loss_text, sizeof loss_text, "%.4f", loss);
  std::snprintf(buf, sizeof buf, "step %lld/%lld | loss %s | lr %.2e | %s tok/s | ETA %s",
                static_cast<long long>(step), static_cast<long long>(total_), loss_text, lr,
                human_count(tokens_per_s).c_str(), eta(step).c_str());
  if (tty_) {
    std::fprintf(stderr, "\r\033[2K%s", buf);
    std::fflush(stderr);
    drawn_ = true;
  } else if (log_now) {
    log_info(buf);
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

}  // namespace ciuic::train
