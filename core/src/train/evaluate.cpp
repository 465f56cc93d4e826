// The Evaluator (train/evaluate.h).
#include "train/evaluate.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <set>

#include <ATen/ops/zeros.h>
#include <c10/core/GradMode.h>

#include <ciuic/error.h>
#include <ciuic/log.h>

#include "model/generate.h"
#include "score/bleu.h"
#include "score/rouge.h"
#include "score/stats.h"
#include "sdk/printable.h"
#include "train/report.h"

namespace ciuic::train {

std::vector<HeldOutQuestion> load_exact_match_questions(const TrainOptions& o,
                                                        bool have_tokenizer) {
  if (o.exact_match_file.empty()) return {};
  if (!have_tokenizer)
    throw UsageError("[train] exact_match_file needs a tokenizer ([model] tokenizer or path)");
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
    : r_(run),
      questions_(load_exact_match_questions(run.opt, run.tokenizer && run.chat_template)) {}

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
  // The held-out answers during training (the last step's are after_training's).
  if (!questions_.empty() && r_.opt.exact_match_every > 0 && step % r_.opt.exact_match_every == 0 &&
      step != r_.opt.max_steps) {
    const ExactMatchResult now = exact_match_all_ranks();
    report.exact_match("during", step, now);
    std::string line = "exact match at step " + std::to_string(step) + ": " +
                       std::to_string(now.correct) + "/" + std::to_string(now.total);
    for (const EvalFigure& f : now.figures)
      if (f.key == "bleu" || f.key == "rouge_l")
        line += ", " + f.label + " " + std::to_string(f.value);
    report.message(line);
  }
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

// Each rank answers every world_size-th question; counts (overall and per category), BLEU's
// statistics and ROUGE-L's sums are summed across ranks, and each question's response time is
// summed into its own place (zeros elsewhere), so every rank has all of them for the percentiles.
ExactMatchResult Evaluator::exact_match_all_ranks() {
  using Clock = std::chrono::steady_clock;
  const auto started = Clock::now();
  c10::NoGradGuard no_grad;
  const TrainOptions& o = r_.opt;
  std::vector<HeldOutQuestion> mine;
  for (size_t i = r_.ctx.rank; i < questions_.size(); i += r_.ctx.world_size)
    mine.push_back(questions_[i]);
  const std::optional<int32_t> stop = r_.tokenizer->eos_id();
  std::vector<double> ttft, seconds;
  ExactMatchResult local;
  if (o.exact_match_batch > 1) {
    // Batches of questions through model::generate (left padding, KV cache; greedy, the same
    // answers as one at a time), by prompt length (exact_match_batched). Response time is then
    // each batch's: its time to first token, and a row's ids over the batch's whole generation
    // (docs/metrics.md).
    model::GenerateOptions g;
    if (stop) g.eos_ids = {*stop};
    ttft.assign(mine.size(), 0.0);
    seconds.assign(mine.size(), 0.0);
    local = exact_match_batched(
        mine, *r_.tokenizer, *r_.chat_template,
        [&](const std::vector<std::vector<int32_t>>& prompts, int64_t max_new,
            const std::vector<size_t>& which) {
          g.max_new_tokens = max_new;
          model::GenerateResult res = model::generate(*r_.model, prompts, g);
          for (size_t k : which) {
            ttft[k] = res.first_token_s;
            seconds[k] = res.total_s;
          }
          return std::move(res.tokens);
        },
        o.exact_match_max_new_tokens, 0, o.exact_match_batch);
  } else {
    // Response time: generate_greedy returns all ids at once (no streaming callback), so the time
    // to first token is measured as a one-token generation of the same prompt (prefill and one
    // step), and tokens/s as the answer's ids over its whole generation (docs/metrics.md).
    local = exact_match(
        mine, *r_.tokenizer, *r_.chat_template,
        [&](const std::vector<int32_t>& prompt, int64_t max_new) {
          if (o.eval_response_time) {
            const auto t0 = Clock::now();
            (void)r_.model->generate_greedy(prompt, 1, stop);
            ttft.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
          }
          const auto t0 = Clock::now();
          std::vector<int32_t> ids = r_.model->generate_greedy(prompt, max_new, stop);
          seconds.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
          return ids;
        },
        o.exact_match_max_new_tokens);
  }
  std::set<std::string> cats;
  for (const auto& q : questions_) cats.insert(q.category);
  std::vector<double> counts = {static_cast<double>(local.correct),
                                static_cast<double>(local.total)};
  for (const auto& c : cats) {
    auto it = local.by_category.find(c);
    counts.push_back(it == local.by_category.end() ? 0.0 : static_cast<double>(it->second.first));
    counts.push_back(it == local.by_category.end() ? 0.0 : static_cast<double>(it->second.second));
  }
  const size_t figures_at = counts.size();
  append_local_figures(mine, local, ttft, seconds, counts);
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
  all.figures = figures_from_sums(
      std::vector<double>(g.begin() + static_cast<std::ptrdiff_t>(figures_at), g.end()));
  // The evaluation's wall time on this rank, up to the sum across ranks (so the slowest rank's).
  all.figures.push_back({"eval_s", "eval time s",
                         std::chrono::duration<double>(Clock::now() - started).count(), "%.2f"});
  return all;
}

// This rank's part of the figures, appended to `out` (summed across ranks next): BLEU's
// statistics (sys_len, ref_len, correct[4], total[4]), ROUGE-L's (P, R, F) sums, then for every
// question of the file its time to first token and tokens/s (0 where another rank answered it).
void Evaluator::append_local_figures(const std::vector<HeldOutQuestion>& mine,
                                     const ExactMatchResult& local, const std::vector<double>& ttft,
                                     const std::vector<double>& seconds,
                                     std::vector<double>& out) const {
  const TrainOptions& o = r_.opt;
  if (o.eval_bleu) {
    const score::BleuTokenize tok =
        *score::bleu_tokenize_from_name(o.bleu_tokenize);  // the schema checked it
    score::BleuStats st;
    for (size_t i = 0; i < mine.size(); ++i)
      st.add(score::bleu_segment(local.answers[i], {mine[i].answer}, tok));
    out.push_back(static_cast<double>(st.sys_len));
    out.push_back(static_cast<double>(st.ref_len));
    for (int64_t c : st.correct) out.push_back(static_cast<double>(c));
    for (int64_t c : st.total) out.push_back(static_cast<double>(c));
  }
  if (o.eval_rouge_l) {
    double p = 0, r = 0, f = 0;
    for (size_t i = 0; i < mine.size(); ++i) {
      const score::RougeScore s =
          score::rouge_l(mine[i].answer, local.answers[i], o.rouge_use_stemmer);
      p += s.precision, r += s.recall, f += s.fmeasure;
    }
    out.insert(out.end(), {p, r, f});
  }
  if (o.eval_response_time) {
    const size_t n = questions_.size(), at = out.size();
    out.resize(at + 2 * n, 0.0);
    for (size_t k = 0; k < mine.size(); ++k) {
      const size_t i =
          static_cast<size_t>(r_.ctx.rank) + k * static_cast<size_t>(r_.ctx.world_size);
      out[at + i] = ttft[k];
      out[at + n + i] = static_cast<double>(local.generated[k]) / std::max(seconds[k], 1e-9);
    }
  }
}

// The figures of summed append_local_figures parts.
std::vector<EvalFigure> Evaluator::figures_from_sums(const std::vector<double>& g) const {
  const TrainOptions& o = r_.opt;
  std::vector<EvalFigure> f;
  size_t i = 0;
  if (o.eval_bleu) {
    score::BleuStats st;
    st.sys_len = static_cast<int64_t>(g[i++]);
    st.ref_len = static_cast<int64_t>(g[i++]);
    for (auto& c : st.correct) c = static_cast<int64_t>(g[i++]);
    for (auto& c : st.total) c = static_cast<int64_t>(g[i++]);
    const score::BleuScore b = score::bleu_from_stats(st);
    f.push_back({"bleu", "BLEU (" + o.bleu_tokenize + ")", b.score, "%.2f"});
    // Its 1-gram precision (sacrebleu's precisions[0]): one-word answers have no 2- to 4-grams,
    // so their BLEU is 0 whatever they are, and this is then the figure that moves.
    f.push_back({"bleu_precision_1", "BLEU 1-gram%", b.precisions[0], "%.2f"});
  }
  if (o.eval_rouge_l) {
    const double n = static_cast<double>(questions_.size());
    f.push_back({"rouge_l", "ROUGE-L F", g[i + 2] / n, "%.4f"});
    f.push_back({"rouge_l_precision", "ROUGE-L P", g[i] / n, "%.4f"});
    f.push_back({"rouge_l_recall", "ROUGE-L R", g[i + 1] / n, "%.4f"});
    i += 3;
  }
  if (o.eval_response_time) {
    const auto n = static_cast<std::ptrdiff_t>(questions_.size());
    const std::vector<double> ttft(g.begin() + static_cast<std::ptrdiff_t>(i),
                                   g.begin() + static_cast<std::ptrdiff_t>(i) + n);
    const std::vector<double> tps(g.begin() + static_cast<std::ptrdiff_t>(i) + n,
                                  g.begin() + static_cast<std::ptrdiff_t>(i) + 2 * n);
    f.push_back({"ttft_median_s", "TTFT p50 s", score::percentile(ttft, 50), "%.4f"});
    f.push_back({"ttft_p90_s", "TTFT p90 s", score::percentile(ttft, 90), "%.4f"});
    f.push_back({"answer_tokens_per_s_median", "tok/s p50", score::percentile(tps, 50), "%.1f"});
    f.push_back({"answer_tokens_per_s_p90", "tok/s p90", score::percentile(tps, 90), "%.1f"});
  }
  return f;
}

}  // namespace ciuic::train
