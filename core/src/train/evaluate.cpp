// The Evaluator (train/evaluate.h).
#include "train/evaluate.h"

#include <cmath>
#include <cstdio>
#include <set>

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <ciuic/error.h>
#include <ciuic/log.h>

#include "train/report.h"
#include "sdk/printable.h"

namespace ciuic::train {

std::vector<HeldOutQuestion> load_exact_match_questions(const TrainOptions& o, bool have_tokenizer) {
  if (o.exact_match_file.empty()) return {};
  if (!have_tokenizer) throw UsageError("[train] exact_match_file needs a tokenizer ([model] tokenizer or path)");
  std::vector<HeldOutQuestion> questions;
  try {
    questions = load_held_out(o.exact_match_file);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    throw UsageError(std::string("[train] exact_match_file: ") + e.what());
  }
  if (o.exact_match_limit > 0 && static_cast<int64_t>(questions.size()) > o.exact_match_limit)
    questions.resize(static_cast<size_t>(o.exact_match_limit));
  if (questions.empty())
    throw UsageError("[train] exact_match_file " + o.exact_match_file + " holds no questions");
  return questions;
}

Evaluator::Evaluator(Run& run)
    : r_(run), questions_(load_exact_match_questions(run.opt, run.tokenizer && run.chat_template)) {}

void Evaluator::before_training(int64_t step, Reporter& report) {
  if (!questions_.empty()) {
    before_ = exact_match_all_ranks();
    report.exact_match("before", step, before_);
    report.message("exact match before training: " + std::to_string(before_.correct) + "/" +
                   std::to_string(before_.total) + " held-out questions");
  }
  if (r_.opt.eval_every > 0 && step == 0) report.eval(0, held_out_loss());
}

void Evaluator::after_step(int64_t step, Reporter& report) {
  if (r_.opt.eval_every > 0 && (step % r_.opt.eval_every == 0 || step == r_.opt.max_steps))
    report.eval(step, held_out_loss());
}

void Evaluator::after_training(int64_t step, Reporter& report) {
  if (questions_.empty()) return;
  const ExactMatchResult after = exact_match_all_ranks();
  report.exact_match("after", step, after);
  if (r_.ctx.rank == 0) {
    // Categories come from the held-out file: shown safely (sdk/printable.h).
    std::fputs(printable_text(format_table(before_, after)).c_str(), stderr);
    for (const auto& m : after.mistakes) log_info("  e.g. " + m);
  }
}

EvalResult Evaluator::held_out_loss() {
  EvalResult e;
  e.loss = NAN;
  if (!r_.data->has_eval()) return e;
  c10::NoGradGuard no_grad;
  r_.data->begin_eval();
  at::Tensor sum = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(r_.ctx.device));
  double tokens = 0;
  for (int64_t n = 0; r_.opt.eval_batches == 0 || n < r_.opt.eval_batches; ++n) {
    std::optional<Batch> b = r_.data->next_eval();
    if (!b) break;
    sum += loss_sum(r_, to_device(*b, r_.ctx.device, r_.opt.micro_batch));
    tokens += static_cast<double>(b->num_label_tokens);
  }
  const auto g = all_sum(*r_.comm, {sum.item<double>(), tokens});
  e.tokens = static_cast<int64_t>(g[1]);
  e.loss = g[1] > 0 ? g[0] / g[1] : NAN;
  return e;
}

// Each rank answers every world_size-th question; counts (overall and per category) are summed
// across ranks.
ExactMatchResult Evaluator::exact_match_all_ranks() {
  c10::NoGradGuard no_grad;
  std::vector<HeldOutQuestion> mine;
  for (size_t i = r_.ctx.rank; i < questions_.size(); i += r_.ctx.world_size) mine.push_back(questions_[i]);
  const std::optional<int32_t> stop = r_.tokenizer->eos_id();
  ExactMatchResult local = exact_match(
      mine, *r_.tokenizer, *r_.chat_template,
      [&](const std::vector<int32_t>& prompt, int64_t max_new) {
        return r_.model->generate_greedy(prompt, max_new, stop);
      },
      r_.opt.exact_match_max_new_tokens);
  std::set<std::string> cats;
  for (const auto& q : questions_) cats.insert(q.category);
  std::vector<double> counts = {static_cast<double>(local.correct), static_cast<double>(local.total)};
  for (const auto& c : cats) {
    auto it = local.by_category.find(c);
    counts.push_back(it == local.by_category.end() ? 0.0 : static_cast<double>(it->second.first));
    counts.push_back(it == local.by_category.end() ? 0.0 : static_cast<double>(it->second.second));
  }
  const std::vector<double> g = all_sum(*r_.comm, counts);
  ExactMatchResult all;
  all.correct = static_cast<int64_t>(g[0]);
  all.total = static_cast<int64_t>(g[1]);
  size_t i = 2;
  for (const auto& c : cats) {
    all.by_category[c] = {static_cast<int64_t>(g[i]), static_cast<int64_t>(g[i + 1])};
    i += 2;
  }
  all.mistakes = local.mistakes;
  return all;
}

}  // namespace ciuic::train
