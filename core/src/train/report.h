// Internal: what a run tells its users — metrics.jsonl records (docs/metrics.md), the progress
// line (step, loss, lr, tokens/s, ETA), MFU and memory, every rank's figures and the stragglers
// among them, and the summary at the end. The formats are report/'s (metrics_log.h, progress.h,
// ranks.h, html_report.h); this is the trainer's side: what it measured, when to write.
//
// The Reporter keeps the accounting of the "window" since the last logged step: tokens, label
// tokens, and the summed token loss on the device (read back, and summed across ranks, only at
// logged steps, so that unlogged steps never wait for the GPU). Logged steps are every
// [log] every_steps and the last one; on those the trainer times the phases (timed()).
//
// At a logged step every rank samples its own figures (train/rank_monitor.h) and the ranks
// exchange them together with their loss sums in the step's one all-reduce (a world x figures
// fp64 vector, each rank filling its row: the gather costs no collective of its own). Rank 0
// writes one "rank" record per rank, and names a rank that stays slower than the others
// (report/ranks.h, [log] straggler_margin / straggler_log_steps) in the log and the progress line.
//
// Collective: step() at a logged step and end() all-reduce; every rank calls them. Only rank 0
// writes files and draws the progress line.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <ciuic/sharding.h>

#include "checkpoint/checkpoint.h"
#include "report/metrics_log.h"
#include "report/progress.h"
#include "report/ranks.h"
#include "train/rank_monitor.h"
#include "train/run.h"
#include "train/step.h"

namespace ciuic::train {

struct EvalResult;
struct ExactMatchResult;

// What one optimizer step did, as the loop measured it.
struct StepStats {
  int64_t step = 0;
  double lr = 0;
  double loss_scale = 1;
  StepResult result;
  double global_labels = 0;           // label tokens of the global batch
  double fwd_bwd_s = 0, optim_s = 0;  // timed steps only
  double norm_s = 0;                  // of optim_s: the global gradient norm (train/step.h)
  double data_wait_s = 0;  // every step: time in DataSource::next() for its micro-batches
  double agree_s =
      0;  // every step: the all-reduce agreeing on label count and stop, after the data
};

class Reporter {
 public:
  Reporter(Run& run, const checkpoint::TrainerState& start);

  // "training N parameters (...) on R rank(s) of <device>: ..."
  void announce();
  // Just before the first step: resets the peak-memory counter and the clocks.
  void begin_training();
  // At the top of every step (its step_s starts here).
  void begin_step() { step_start_ = std::chrono::steady_clock::now(); }
  // Around the step's compute: the brackets of the CUDA-event busy fraction (RankMonitor).
  void compute_begin() { monitor_.compute_begin(); }
  void compute_end() { monitor_.compute_end(); }
  // Whether step `step` is logged (its phases are then timed: the device is synchronised).
  bool logged(int64_t step) const;
  // One micro-batch's summed token loss (detached, on the device).
  void add_loss(const at::Tensor& loss_sum);
  // After every optimizer step: counters, the metrics record at logged steps, the progress line.
  void step(const StepStats& s, const checkpoint::TrainerState& st);
  void eval(int64_t step, const EvalResult& e);
  void exact_match(const char* when, int64_t step, const ExactMatchResult& em);
  void message(const std::string& line);  // rank 0: a line the progress display must not overwrite
  void interrupted(int64_t step);
  // The run's end: the "end" record and the summary line.
  void end(const checkpoint::TrainerState& st);
  void finish_progress() { progress_.finish(); }

 private:
  // The figures the ranks exchange: all with [log] rank_records; else what the straggler rule
  // reads, or none when it is off (one rank, straggler_margin = 0): the all-reduce then carries
  // the loss sums alone.
  const std::vector<std::string>& exchanged_figures() const;
  // This rank's figures and loss sum for every rank's (the loss: summed into last_loss_); none
  // when exchanged_figures() is empty.
  std::vector<report::RankFigures> exchange(const report::RankFigures& mine);
  // Rank 0: the "rank" records, the straggler rule's records and messages, the progress note.
  std::vector<nlohmann::json> rank_records(int64_t step,
                                           const std::vector<report::RankFigures>& ranks);

  Run& r_;
  bool rank0_;
  report::MetricsLog metrics_;
  report::Progress progress_;
  double flops_per_token_;
  int64_t tokens_per_step_;
  std::chrono::steady_clock::time_point run_start_, window_start_, step_start_;
  double tokens_at_start_;
  double window_tokens_ = 0, window_labels_ = 0;
  double last_loss_;
  at::Tensor loss_acc_;
  RankMonitor monitor_;
  report::StragglerDetector stragglers_;
  std::string straggler_note_;  // for the progress line while a rank is named
  double window_data_wait_ = 0;
  int64_t window_steps_ = 0;
};

}  // namespace ciuic::train
