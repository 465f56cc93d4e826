// The body of one worker process: the training loop, read top to bottom.
//
// run_worker() builds a Run (train/run.h: context, plugins, model, data, schedule), then train()
// runs one optimizer step per iteration:
//
//   1. data      this step's micro-batches; the global count of label tokens (and whether any
//                rank was asked to stop) agreed in one tiny all-reduce
//   2. backward  the step begins (train/step.h: it may let the optimizer update during backward
//                when nothing depends on the gradient norm); per micro-batch: loss = sum of token
//                losses / global label tokens, times the precision's loss scale; backward; the
//                sharding's hooks reduce gradients as buckets complete and hand them to the
//                optimizer (the model announces its layer groups to the sharding on the way)
//   3. step      norm -> skip -> clip -> update, as llm.c's loop: the sharding finishes the
//                reductions and gives its squares, the core takes the global norm, the precision
//                policy decides a skip, the core clips, the sharding applies the update
//   4. report    metrics.jsonl (every rank's own figures too: data wait, phases, memory, link)
//                and the progress line (train/report.h); evaluation when due (train/evaluate.h);
//                checkpoints when due (train/checkpoints.h)
//
// Loss normalisation is exact whatever the split into ranks and micro-batches: every micro-batch
// contributes sum(token losses) / N, with N the label tokens of the whole global batch, and the
// sharding SUMs gradients across ranks. So the step's gradient is that of the mean token loss of
// the global batch (the trap of averaging per-micro-batch means is avoided).
#include "train/worker.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>

#include <ATen/TensorOperators.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>
#include <torch/csrc/autograd/autograd.h>

#include <ciuic/error.h>
#include <ciuic/log.h>

#include "recipe/recipe.h"
#include "train/checkpoints.h"
#include "train/device_info.h"
#include "train/evaluate.h"
#include "train/options.h"
#include "train/profile.h"
#include "train/report.h"
#include "train/run.h"
#include "train/step.h"

namespace ciuic::train {

namespace {

// ---- signals: SIGINT/SIGTERM ask for a clean stop at the next step boundary -----------------
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal.store(sig); }

class StopSignals {
 public:
  StopSignals() {
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int_);
    sigaction(SIGTERM, &sa, &old_term_);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int_, nullptr);
    sigaction(SIGTERM, &old_term_, nullptr);
  }
  static bool requested() { return g_stop_signal.load() != 0; }

 private:
  struct sigaction old_int_ {
  }, old_term_{};
};

// Host seconds between laps; on timed steps the device is synchronised first, so that a lap
// measures the device work it enqueued.
class Stopwatch {
 public:
  Stopwatch(c10::Device device, bool on)
      : device_(device), on_(on), t_(std::chrono::steady_clock::now()) {}
  double lap() {
    if (!on_) return 0.0;
    synchronize(device_);
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - t_).count();
    t_ = now;
    return s;
  }

 private:
  c10::Device device_;
  bool on_;
  std::chrono::steady_clock::time_point t_;
};

// The micro-batches of one step, and what every rank agreed on before training on them.
struct StepData {
  std::vector<Batch> batches;
  double global_labels = 1;  // label tokens of the global batch (at least 1)
  bool stop = false;         // a rank was asked to stop: no rank trains this step
  double wait_s = 0;   // this rank's time in DataSource::next() (per-rank records, stragglers)
  double agree_s = 0;  // then in the agreement's all-reduce (waiting for the other ranks' data)
};

StepData next_step_data(Run& r) {
  StepData d;
  double local_labels = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < r.opt.accumulation; ++i) {
    d.batches.push_back(r.data->next());
    local_labels += static_cast<double>(d.batches.back().num_label_tokens);
  }
  const auto t1 = std::chrono::steady_clock::now();
  d.wait_s = std::chrono::duration<double>(t1 - t0).count();
  const auto agreed = all_sum(*r.comm, {local_labels, StopSignals::requested() ? 1.0 : 0.0});
  d.agree_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  d.global_labels = std::max(1.0, agreed[0]);
  d.stop = agreed[1] > 0;
  return d;
}

// The step's counters; a non-finite gradient that no loss scaler accounts for stops the run, or
// is skipped up to [train] max_nonfinite_skips times.
void count_step(Run& r, checkpoint::TrainerState& st, const StepResult& res,
                const Checkpoints& ckpt, Reporter& report) {
  ++st.step;
  st.tokens += static_cast<double>(r.opt.tokens_per_step(r.ctx.world_size));
  if (!res.skipped) {
    ++st.updates;
    return;
  }
  ++st.skipped;
  if (std::isfinite(res.grad_norm) || r.precision->needs_overflow_check()) return;
  ++st.nonfinite_skips;
  if (!r.opt.nonfinite_skip || st.nonfinite_skips > r.opt.max_nonfinite_skips)
    throw Error("non-finite gradient norm (" + std::to_string(res.grad_norm) + ") at step " +
                std::to_string(st.step) +
                (r.opt.nonfinite_skip ? " after " + std::to_string(st.nonfinite_skips - 1) +
                                            " skipped steps ([train] max_nonfinite_skips)"
                                      : "; set [train] nonfinite = \"skip\" to skip such steps") +
                (ckpt.last_good().empty() ? "; no checkpoint was written"
                                          : "; last good checkpoint: " + ckpt.last_good()));
  report.message("step " + std::to_string(st.step) + ": non-finite gradient, step skipped");
}

// ---- the loop ---------------------------------------------------------------------------------
int train(Run& r, const WorkerOptions& options) {
  Checkpoints ckpt(r, options.resume);  // resumes when asked
  checkpoint::TrainerState& st = ckpt.state();
  Reporter report(r, st);
  Evaluator eval(r);
  report.announce();
  eval.before_training(st.step, report);
  StopSignals signals;
  StepProfiler profiler(r.opt.profile_start, r.opt.profile_steps,
                        (std::filesystem::path(r.opt.output_dir) / "profile").string(), r.ctx.rank,
                        r.opt.cuda);
  report.begin_training();

  while (st.step < r.opt.max_steps) {
    profiler.before_step(st.step + 1);
    report.begin_step();
    // 1. Data for the whole step; every rank agrees on the label count and on stopping.
    const std::string cursor = r.data->cursor();  // where this step's data begins
    StepData data = next_step_data(r);
    if (data.stop) {
      report.interrupted(st.step);
      ckpt.on_signal(cursor);
      return kExitInterrupted;
    }

    // 2. Forward and backward, micro-batch by micro-batch.
    StepStats s;
    s.step = st.step + 1;
    s.lr = r.schedule->lr(st.step);
    s.global_labels = data.global_labels;
    s.data_wait_s = data.wait_s;
    s.agree_s = data.agree_s;
    Step step(r.slots(), {.lr = s.lr,
                          .weight_decay = r.opt.weight_decay,
                          .max_grad_norm = r.opt.clip,
                          .step = s.step,
                          .t = st.updates + 1,                         // skipped steps do not count
                          .nonfinite_stops = !r.opt.nonfinite_skip});  // count_step() throws then
    s.loss_scale = step.loss_scale();
    Stopwatch clock(r.ctx.device, /*on=*/report.logged(s.step));
    report.compute_begin();
    for (int64_t i = 0; i < r.opt.accumulation; ++i) {
      r.sharding->begin_micro_batch(i, /*last=*/i + 1 == r.opt.accumulation);
      const at::Tensor sum =
          loss_sum(r, to_device(data.batches[i], r.ctx.device, r.opt.micro_batch));
      torch::autograd::backward({sum * (s.loss_scale / data.global_labels)});
      report.add_loss(sum.detach());
    }
    s.fwd_bwd_s = clock.lap();

    // 3. The optimizer step (train/step.h): norm -> skip -> clip -> update.
    const GradNorm norm =
        step.global_norm();  // the sharding finishes its reductions; one all-reduce
    if (!step.skip(norm))    // precision.update(); a non-finite norm is never applied
      step.update(
          step.clip_coefficient(norm));  // the sharding hands the optimizer its shard, publishes
    report.compute_end();
    s.result = step.result();
    s.norm_s = step.norm_s();
    s.optim_s = clock.lap();
    count_step(r, st, s.result, ckpt, report);
    profiler.after_step(s.step);

    // 4. Report, evaluate, checkpoint.
    report.step(s, st);
    eval.after_step(st.step, report);
    ckpt.after_step();
  }
  report.finish_progress();
  eval.after_training(st.step, report);
  ckpt.finish();
  report.end(st);
  return kExitOk;
}

}  // namespace

int run_worker(const Recipe& recipe, const Registry& registry, const launch::WorkerEnv& env,
               const WorkerOptions& options) {
  set_log_rank(env.world_size > 1 ? env.rank : -1);
  const TrainOptions opt = TrainOptions::from(recipe);
  try {
    Run run = build_run(recipe, registry, env, options);
    return train(run, options);
  } catch (const c10::OutOfMemoryError& e) {
    // LibTorch's message is long and generic: name the rank, the cap and the peaks instead
    // (the first sentence of LibTorch's message, with the size it tried, is kept).
    std::string detail = e.what_without_backtrace();
    if (const auto dot = detail.find(". "); dot != std::string::npos) detail.resize(dot);
    if (!opt.cuda)
      throw Error("rank " + std::to_string(env.rank) + " ran out of host memory: " + detail);
    throw Error(
        launch::out_of_memory_message(env.rank, env.local_rank, opt.memory_cap_gib, detail));
  } catch (const c10::Error& e) {
    // The CPU allocator reports a failed allocation as a plain c10::Error.
    const std::string m = e.what_without_backtrace();
    const auto at = m.find("DefaultCPUAllocator: can't allocate memory");
    if (at == std::string::npos) throw;
    std::string detail = m.substr(at + std::string("DefaultCPUAllocator: ").size());
    if (const auto code = detail.find(". Error code"); code != std::string::npos)
      detail.resize(code);
    throw Error("rank " + std::to_string(env.rank) + " ran out of host memory: " + detail +
                " (model, optimizer state and batches of this recipe do not fit)");
  }
}

}  // namespace ciuic::train
