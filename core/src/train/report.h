// Internal: what a run tells its users — metrics.jsonl records (docs/metrics.md), the progress
// line (step, loss, lr, tokens/s, ETA), MFU and memory, and the summary at the end.
//
// The Reporter keeps the accounting of the "window" since the last logged step: tokens, label
// tokens, and the summed token loss on the device (read back, and summed across ranks, only at
// logged steps, so that unlogged steps never wait for the GPU). Logged steps are every
// [log] every_steps and the last one; on those the trainer times the phases (timed()).
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
#include "train/metrics.h"
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
  double global_labels = 0;   // label tokens of the global batch
  double fwd_bwd_s = 0, optim_s = 0;  // timed steps only
  double norm_s = 0;                  // of optim_s: the global gradient norm (train/step.h)
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
  Run& r_;
  bool rank0_;
  MetricsLog metrics_;
  Progress progress_;
  double flops_per_token_;
  int64_t tokens_per_step_;
  std::chrono::steady_clock::time_point run_start_, window_start_, step_start_;
  double tokens_at_start_;
  double window_tokens_ = 0, window_labels_ = 0;
  double last_loss_;
  at::Tensor loss_acc_;
};

}  // namespace ciuic::train
