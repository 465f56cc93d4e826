// Internal: evaluation during a run — the held-out loss and the greedy answers to the held-out
// questions: exact match, BLEU, ROUGE-L and response time ([train] eval_metrics; docs/metrics.md).
//
// Both are collective (every rank evaluates its part; sums are all-reduced) and run without
// gradients. The Evaluator reads its settings from TrainOptions and writes its results through
// the Reporter.
#pragma once

#include <cstdint>
#include <vector>

#include "train/exact_match.h"
#include "train/run.h"

namespace ciuic::train {

class Reporter;

struct EvalResult {
  double loss = 0;     // mean token loss over the held-out split; NaN without one
  int64_t tokens = 0;  // label tokens it covered (all ranks)
};

// [train] exact_match_file's questions as a run uses them (the first exact_match_limit; {} when the
// key is unset), for the Evaluator and for --dry-run alike. Throws UsageError (bad input, exit 2)
// when the file is set without a tokenizer, cannot be read (missing, not a regular file such as
// /dev/zero, too large), is malformed (naming file:line) or holds no questions.
std::vector<HeldOutQuestion> load_exact_match_questions(const TrainOptions& o, bool have_tokenizer);

class Evaluator {
 public:
  // Loads [train] exact_match_file (when set) and checks a tokenizer is there to use it.
  explicit Evaluator(Run& run);

  // At the start of a run (step 0 of a fresh run): exact match "before" and the step-0 eval.
  void before_training(int64_t step, Reporter& report);
  // After a step: the held-out loss when [train] eval_every_steps says so (and at the last step);
  // the held-out answers' figures ("during") when [train] exact_match_every_steps says so.
  void after_step(int64_t step, Reporter& report);
  // At the end: exact match "after", with the before/after table.
  void after_training(int64_t step, Reporter& report);

  EvalResult held_out_loss();

 private:
  ExactMatchResult exact_match_all_ranks();
  void append_local_figures(const std::vector<HeldOutQuestion>& mine, const ExactMatchResult& local,
                            const std::vector<double>& ttft, const std::vector<double>& seconds,
                            std::vector<double>& out) const;
  std::vector<EvalFigure> figures_from_sums(const std::vector<double>& sums) const;
  Run& r_;
  std::vector<HeldOutQuestion> questions_;
  ExactMatchResult before_;
};

}  // namespace ciuic::train
