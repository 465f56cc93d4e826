// Internal: the trainer's outputs for humans and machines — metrics.jsonl records and the
// one-line progress display.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <ciuic/export.h>

namespace ciuic::train {

class TensorBoardWriter;

// Appends one JSON object per line to a file; each line is flushed as written, so a crashed run
// leaves complete records. Only rank 0 writes. An empty path disables it.
// A record that cannot be written (full disk, I/O error, /dev/full) throws ciuic::Error naming
// the file and the system's reason, and so does every later write(): a run never ends
// "successfully" with its metrics lost.
class CIUIC_API MetricsLog {
 public:
  MetricsLog() = default;
  explicit MetricsLog(const std::string& path);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;
  void write(const nlohmann::json& record);  // throws Error when the record cannot be written
  // Also writes every record's numbers to a TensorBoard event file in `dir` ([log] tensorboard):
  // step records as train/<key>, eval records as eval/<key> (eval_loss -> eval/loss),
  // exact_match as exact_match/accuracy, at the record's step (tensorboard_scalars()).
  void enable_tensorboard(const std::string& dir);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string error_;  // the write failure, once there was one
  std::FILE* f_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tb_;
};

// The TensorBoard scalars of one metrics record (empty for records without a step).
CIUIC_API std::vector<std::pair<std::string, double>> tensorboard_scalars(const nlohmann::json& record, int64_t* step);

// "step 12/500 | loss 2.3456 | lr 3.0e-04 | 12.3k tok/s | ETA 3m12s".
// On a terminal (or when the launcher says its terminal is one: CIUIC_PROGRESS_TTY=1) the line
// is redrawn in place on stderr; otherwise it is logged every `every` steps as a plain line.
class Progress {
 public:
  Progress(int64_t first_step, int64_t total_steps, bool enabled, bool force_tty);
  void update(int64_t step, double loss, double lr, double tokens_per_s, bool log_now);
  void message(const std::string& line);  // a line that must not be overwritten
  void finish();

 private:
  std::string eta(int64_t step) const;
  int64_t first_, total_;
  bool enabled_, tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_;
};

std::string human_count(double v);       // 12345 -> "12.3k"
std::string human_duration(double secs);  // 192 -> "3m12s"

}  // namespace ciuic::train
