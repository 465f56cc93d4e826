// The Reporter (train/report.h): metrics records, MFU, memory, the progress line.
#include "train/report.h"

#include <cmath>
#include <cstdlib>
#include <filesystem>

#include <ATen/ops/zeros.h>
#include <ATen/record_function.h>

#include <ciuic/error.h>
#include <ciuic/log.h>
#include <ciuic/metrics.h>

#include "report/html_report.h"
#include "train/device_info.h"
#include "train/evaluate.h"
#include "train/exact_match.h"

namespace ciuic::train {

using report::human_count;
using report::human_duration;
using report::write_html_report_or_warn;
namespace {
using Clock = std::chrono::steady_clock;
double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}
}  // namespace

Reporter::Reporter(Run& run, const checkpoint::TrainerState& start)
    : r_(run),
      rank0_(run.ctx.rank == 0),
      metrics_(rank0_ ? run.opt.metrics_path : std::string()),
      progress_(start.step + 1, run.opt.max_steps, rank0_ && run.opt.progress != "off",
                run.opt.progress == "on" || std::getenv("CIUIC_PROGRESS_TTY") != nullptr),
      flops_per_token_(run.model->config().flops_per_token(run.opt.seq_len)),
      tokens_per_step_(run.opt.tokens_per_step(run.ctx.world_size)),
      tokens_at_start_(start.tokens),
      last_loss_(NAN),
      monitor_(run),
      stragglers_({.margin = run.opt.straggler_margin, .log_steps = run.opt.straggler_log_steps},
                  start.step + 1) {
  loss_acc_ = at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(run.ctx.device));
  if (rank0_ && run.opt.tensorboard)
    metrics_.enable_tensorboard((std::filesystem::path(run.opt.output_dir) / "tb").string());
}

void Reporter::begin_training() {
  reset_peak_memory(r_.ctx.device);
  run_start_ = window_start_ = step_start_ = Clock::now();
  monitor_.begin();
}

void Reporter::announce() {
  if (!rank0_) return;
  const auto& mc = r_.model->config();
  // With an adapter only its tensors (and modules_to_save) train: say so, with the base's size.
  std::string what = std::to_string(mc.num_parameters()) + " parameters";
  if (r_.model->lora()) {
    int64_t trained = 0;
    for (const auto& [name, t] : r_.model->trainable_parameters()) trained += t.numel();
    what = std::to_string(trained) + " adapter parameters of a " + what + " base";
  }
  progress_.message("training " + what + " (" + std::to_string(mc.num_hidden_layers) +
                    " layers, hidden " + std::to_string(mc.hidden_size) + ") on " +
                    std::to_string(r_.ctx.world_size) + " rank(s) of " + r_.device.name + ": " +
                    r_.comm->backend_name() + ", global batch " + std::to_string(tokens_per_step_) +
                    " tokens, " + std::to_string(r_.opt.max_steps) + " steps, lr " +
                    r_.schedule->describe());
}

bool Reporter::logged(int64_t step) const {
  return step % r_.opt.log_every == 0 || step == r_.opt.max_steps;
}

void Reporter::add_loss(const at::Tensor& loss_sum) { loss_acc_.add_(loss_sum); }

void Reporter::step(const StepStats& s, const checkpoint::TrainerState& st) {
  const auto now = Clock::now();
  const double step_s = seconds(step_start_, now);
  window_tokens_ += static_cast<double>(tokens_per_step_);
  window_labels_ += s.global_labels;
  window_data_wait_ += s.data_wait_s;
  ++window_steps_;
  const double window_s = std::max(seconds(window_start_, now), 1e-9);
  const double tps = window_tokens_ / window_s;
  if (!logged(s.step)) {
    progress_.update(s.step, last_loss_, s.lr, tps, false, straggler_note_);
    return;
  }
  // The cost of monitoring, visible in the step profile ([log] profile_start_step: a range in
  // rank<R>.trace.json): sampling, the exchange, the records.
  RECORD_FUNCTION("ciuic::monitor", std::vector<c10::IValue>());
  // Every rank's figures, and the mean token loss over the steps since the last log (all ranks),
  // in one all-reduce.
  Metrics om;  // the optimizer's own figures (its host time), on every rank
  r_.optimizer->append_metrics(om);
  RankMonitor::Timings timings;
  timings.step_s = step_s;
  timings.data_wait_s = window_data_wait_;
  timings.steps = window_steps_;
  timings.fwd_bwd_s = s.fwd_bwd_s;
  timings.optim_s = s.optim_s;
  timings.agree_s = s.agree_s;
  timings.norm_s = s.norm_s;
  for (const auto& [k, v] : om.values)
    if (k == "optim_step_s") timings.optim_step_s = v;
  Metrics shm;  // the sharding's phases: its publish is time in collectives
  r_.sharding->append_metrics(shm);
  for (const auto& [k, v] : shm.values)
    if (k == "step_publish_s") timings.publish_s = v;
  const report::RankFigures mine = monitor_.sample(timings);
  const auto sampled = Clock::now();
  const std::vector<report::RankFigures> ranks = exchange(mine);
  const auto exchanged = Clock::now();
  loss_acc_.zero_();
  window_start_ = now;
  window_tokens_ = window_labels_ = window_data_wait_ = 0;
  window_steps_ = 0;
  if (rank0_) {
    nlohmann::json rec = {{"step", s.step},
                          {"max_steps", r_.opt.max_steps},
                          {"loss", last_loss_},
                          {"lr", s.lr},
                          {"grad_norm", s.result.grad_norm},
                          {"loss_scale", s.loss_scale},
                          {"skipped", s.result.skipped},
                          {"tokens", st.tokens},
                          {"tokens_per_s", tps},
                          {"step_s", step_s},
                          {"fwd_bwd_s", s.fwd_bwd_s},
                          {"optim_s", s.optim_s},
                          {"monitor_exchange_s", seconds(sampled, exchanged)}};
    if (r_.ctx.device.is_cuda()) {
      const MemoryStats ms = memory_stats(r_.ctx.device);
      rec["mem_gib"] = ms.peak_allocated / 1073741824.0;
      rec["mem_reserved_gib"] = ms.peak_reserved / 1073741824.0;
      if (r_.device.peak_tflops > 0)
        rec["mfu"] = flops_per_token_ * tps / r_.ctx.world_size / (r_.device.peak_tflops * 1e12);
    }
    rec["step_norm_s"] = s.norm_s;
    // What the slots count, under the core's names; then each plugin's own figures.
    Metrics pm;
    const CommCounters cc = r_.comm->counters();
    pm.set("comm_calls", static_cast<double>(cc.calls));
    pm.set("comm_bytes", static_cast<double>(cc.bytes));
    pm.set("comm_busy_s", cc.busy_seconds);
    const ShardingMemory sm = r_.sharding->memory();
    pm.set("shard_param_gib", sm.param_bytes / 1073741824.0);
    pm.set("shard_grad_gib", sm.grad_bytes / 1073741824.0);
    if (const int64_t epoch = r_.data->epoch(); epoch >= 0)
      pm.set("data_epoch", static_cast<double>(epoch));
    for (const PluginObject* p : r_.plugins()) p->append_metrics(pm);
    for (const auto& [k, v] : pm.values) rec[k] = v;
    std::vector<nlohmann::json> after = rank_records(s.step, ranks);
    rec["monitor_s"] =
        seconds(now, sampled) + seconds(exchanged, Clock::now());  // the exchange aside
    metrics_.write(rec);
    for (const nlohmann::json& r : after) metrics_.write(r);
  }
  progress_.update(s.step, last_loss_, s.lr, tps, true, straggler_note_);
}

const std::vector<std::string>& Reporter::exchanged_figures() const {
  static const std::vector<std::string> none;
  if (r_.opt.rank_records) return report::rank_figure_keys();
  if (r_.ctx.world_size > 1 && r_.opt.straggler_margin > 0) return report::straggler_figure_keys();
  return none;
}

std::vector<report::RankFigures> Reporter::exchange(const report::RankFigures& mine) {
  const std::vector<std::string>& keys = exchanged_figures();
  const std::vector<double> figures = mine.to_vector(keys);
  const size_t row = figures.size() + 1, world = static_cast<size_t>(r_.ctx.world_size);
  const size_t at = static_cast<size_t>(r_.ctx.rank) * row;
  std::vector<double> all(row * world, 0.0);  // x + 0 is x: the sum is every rank's row
  all[at] = loss_acc_.item<double>();
  std::copy(figures.begin(), figures.end(), all.begin() + static_cast<std::ptrdiff_t>(at + 1));
  all = all_sum(*r_.comm, all);
  double loss = 0;
  std::vector<report::RankFigures> out;
  for (size_t k = 0; k < world; ++k) {
    loss += all[k * row];
    if (!keys.empty())
      out.push_back(report::RankFigures::from_vector(all.data() + k * row + 1, keys));
  }
  last_loss_ = loss / std::max(1.0, window_labels_);
  return out;
}

std::vector<nlohmann::json> Reporter::rank_records(int64_t step,
                                                   const std::vector<report::RankFigures>& ranks) {
  std::vector<nlohmann::json> out;
  if (r_.opt.rank_records)
    for (const report::RankFigures& f : ranks) out.push_back(f.record(step));
  if (ranks.size() < 2) return out;
  const report::StragglerDetector::Update u = stragglers_.update(step, ranks);
  for (const report::Straggler& g : u.named) {
    progress_.message(g.describe());
    out.push_back({{"event", "straggler"},
                   {"step", step},
                   {"rank", g.rank},
                   {"slower", g.slower},
                   {"steps", g.steps},
                   {"work_s", g.work_s},
                   {"median_work_s", g.median_work_s},
                   {"data_wait_s", g.data_wait_s},
                   {"median_data_wait_s", g.median_data_wait_s}});
  }
  for (const int rank : u.recovered) {
    progress_.message("rank " + std::to_string(rank) +
                      " is no longer slower than the others (step " + std::to_string(step) + ")");
    out.push_back({{"event", "straggler_recovered"}, {"step", step}, {"rank", rank}});
  }
  straggler_note_.clear();
  for (const report::Straggler& g : u.now)
    straggler_note_ += std::string(straggler_note_.empty() ? "slow: " : ", ") + "rank " +
                       std::to_string(g.rank) + " +" +
                       std::to_string(static_cast<int>(std::lround(100 * g.slower))) + "%";
  return out;
}

void Reporter::eval(int64_t step, const EvalResult& e) {
  if (!rank0_ || e.tokens <= 0) return;
  if (step > 0)
    progress_.message("eval at step " + std::to_string(step) + ": loss " + std::to_string(e.loss) +
                      ", perplexity " + std::to_string(std::exp(e.loss)));
  metrics_.write({{"event", "eval"},
                  {"step", step},
                  {"eval_loss", e.loss},
                  {"eval_ppl", std::exp(e.loss)},
                  {"eval_tokens", e.tokens}});
}

void Reporter::exact_match(const char* when, int64_t step, const ExactMatchResult& em) {
  if (!rank0_) return;
  nlohmann::json cats = nlohmann::json::object();
  for (const auto& [c, v] : em.by_category) cats[c] = v.second ? double(v.first) / v.second : 0.0;
  nlohmann::json rec = {{"event", "exact_match"}, {"when", when},
                        {"step", step},           {"accuracy", em.accuracy()},
                        {"questions", em.total},  {"by_category", cats}};
  // BLEU, ROUGE-L, response time (train/evaluate.cpp; docs/metrics.md).
  for (const EvalFigure& f : em.figures) rec[f.key] = f.value;
  if (rec.contains("bleu")) rec["bleu_tokenize"] = r_.opt.bleu_tokenize;
  metrics_.write(rec);
}

void Reporter::message(const std::string& line) {
  if (rank0_) progress_.message(line);
}

void Reporter::interrupted(int64_t step) {
  progress_.finish();
  if (rank0_) log_info("stopping at step " + std::to_string(step) + " on a signal");
  // The signal checkpoint comes next: a metrics file that cannot be written must not cost it.
  // The run still ends non-zero (interrupted, 130).
  try {
    metrics_.write({{"event", "interrupted"}, {"step", step}});
  } catch (const Error& e) {
    log_error(std::string(e.what()) + "; writing the checkpoint all the same");
  }
  write_html_report_or_warn(metrics_.path());
}

void Reporter::end(const checkpoint::TrainerState& st) {
  const double elapsed = seconds(run_start_, Clock::now());
  if (!rank0_) return;
  const double tps = (st.tokens - tokens_at_start_) / std::max(elapsed, 1e-9);
  nlohmann::json end = {
      {"event", "end"},        {"steps", st.step},      {"world_size", r_.ctx.world_size},
      {"updates", st.updates}, {"skipped", st.skipped}, {"tokens", st.tokens},
      {"elapsed_s", elapsed},  {"tokens_per_s", tps},   {"final_loss", last_loss_}};
  if (r_.ctx.device.is_cuda())
    end["peak_mem_gib"] = memory_stats(r_.ctx.device).peak_allocated / 1073741824.0;
  metrics_.write(end);
  write_html_report_or_warn(metrics_.path());
  log_info("done: " + std::to_string(st.step) + " steps, final loss " + std::to_string(last_loss_) +
           ", " + human_count(tps) + " tokens/s, " + human_duration(elapsed));
}

}  // namespace ciuic::train
