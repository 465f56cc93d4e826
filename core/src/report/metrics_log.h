// Internal (report/): metrics.jsonl records (docs/metrics.md), and their TensorBoard scalars.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <ciuic/export.h>

namespace ciuic::report {

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
  // exact_match as exact_match/accuracy, per-rank records as rank<N>/<key>, at the record's step
  // (tensorboard_scalars()).
  void enable_tensorboard(const std::string& dir);
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string error_;  // the write failure, once there was one
  std::FILE* f_ = nullptr;
  std::unique_ptr<TensorBoardWriter> tb_;
};

// The TensorBoard scalars of one metrics record (empty for records without a step).
CIUIC_API std::vector<std::pair<std::string, double>> tensorboard_scalars(
    const nlohmann::json& record, int64_t* step);

}  // namespace ciuic::report
