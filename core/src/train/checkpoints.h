// Internal: the run's checkpoint policy — resume at the start, save every [checkpoint]
// every_steps, on a signal and at the end, export a Hugging Face folder when asked.
//
// Collective: every method that saves or loads is called by every rank at the same step.
#pragma once

#include <cstdint>
#include <string>

#include "checkpoint/checkpoint.h"
#include "train/run.h"

namespace ciuic::train {

class Checkpoints {
 public:
  // `resume`: "" (fresh), "latest", "auto" or a folder (WorkerOptions::resume). Loads the
  // checkpoint when there is one to load; state() then holds its counters.
  Checkpoints(Run& run, const std::string& resume);

  // The checkpoint folder `resume` names in checkpoint dir `dir`: "" for a fresh start ("" or
  // "auto" with no checkpoint). Throws UsageError when "latest" or a folder names nothing.
  static std::string resume_folder(const std::string& dir, const std::string& resume);

  checkpoint::TrainerState& state() { return st_; }
  // After step `state().step` completed: saves when every_steps says so (not at the last step:
  // finish() saves that one).
  void after_step();
  // On SIGINT/SIGTERM before the step after state().step ran: saves (when [checkpoint] on_signal)
  // with the data source rewound to `cursor`, where the interrupted step's data began.
  void on_signal(const std::string& cursor);
  // At the end: the final checkpoint (save_final, or needed by export_hf) and the HF export.
  void finish();
  // The last checkpoint saved or loaded ("" if none), for error messages.
  const std::string& last_good() const { return ckpt_.last_good(); }

 private:
  std::string save();
  Run& r_;
  checkpoint::Checkpointer ckpt_;
  checkpoint::RunShape shape_;
  checkpoint::Parts parts_;
  checkpoint::TrainerState st_;
};

}  // namespace ciuic::train
