// Learning-rate schedules with DeepSpeed's names and meanings, built from the recipe's
// [scheduler] section (deepspeed/runtime/lr_schedules.py: WarmupLR, WarmupDecayLR,
// WarmupCosineLR), plus `constant`.
//
// A schedule is a pure function of the optimizer step index: lr(step) for step = 0, 1, 2, ... is
// the learning rate of the optimizer step about to run (0-based). It holds no state, so a resumed
// run only needs the step counter.
//
//   type = "constant"       lr(s) = optimizer lr
//   type = "warmup"         WarmupLR: from warmup_min_lr to warmup_max_lr over warmup_num_steps
//                           steps (warmup_type "log": gamma = log(s + 1) / log(N); "linear":
//                           gamma = s / N), lr = min + (max - min) * gamma; then warmup_max_lr.
//   type = "warmup_decay"   WarmupDecayLR: the warmup above, then linear decay reaching 0 at
//                           total_num_steps: lr = max * max(0, (T - s) / max(1, T - N)).
//   type = "warmup_cosine"  WarmupCosineLR, as ratios of the optimizer lr: warmup from
//                           warmup_min_ratio to 1 (min_ratio + gamma * (1 - min_ratio)), then
//                           cosine from ~1 down to cos_min_ratio at total_num_steps:
//                           progress = min(1, (s - N + 1) / max(1, T - N)),
//                           ratio = cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi * progress))
//                           / 2.
//
// Keys ([scheduler], see the recipe reference): warmup_min_lr (0), warmup_max_lr (-1 = the
// optimizer lr), warmup_num_steps (0), warmup_type ("log"), total_num_steps (0 = train.max_steps),
// warmup_min_ratio (0), cos_min_ratio (1e-4).
//
// Where ciuic differs from DeepSpeed, on purpose:
//  * Step indexing. DeepSpeed's engine applies the value for last_batch_iteration = -1 (the
//    minimum) to its first optimizer step and the value for s - 1 to step s; ciuic applies the
//    value for s to step s. The curve is the same, ciuic is one step ahead of DeepSpeed's engine.
//  * warmup_num_steps = 0 means "no warmup" (DeepSpeed rejects 0). For N >= 1 the warmup length
//    is max(2, N), as in DeepSpeed.
//  * Invalid combinations DeepSpeed only warns about are errors here (total_num_steps below
//    warmup_num_steps, an unknown warmup_type); keys the chosen type does not use are logged as
//    warnings.
//  * The cosine phase clamps its progress at 1 (as recent DeepSpeed does): after total_num_steps
//    the learning rate stays at cos_min_ratio * lr instead of rising again.
//
// Thread-safety: immutable after create(); lr() may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ciuic/config.h>
#include <ciuic/export.h>

namespace ciuic::schedule {

class CIUIC_API LrSchedule {
 public:
  // Builds the schedule of `scheduler` (the [scheduler] section; keys may be absent, then the
  // defaults above apply). `optimizer_lr` is [optimizer] lr; `max_steps` is [train] max_steps
  // (used when total_num_steps = 0). Throws UsageError through scheduler.fail(key, ...) naming the
  // key at fault, its location and what was expected.
  static std::unique_ptr<LrSchedule> create(const Config& scheduler, double optimizer_lr,
                                            int64_t max_steps);

  // The learning rate of 0-based optimizer step `step` (>= 0; a negative step throws Error).
  virtual double lr(int64_t step) const = 0;

  // One line for the log, e.g. "warmup_cosine (total 1000 steps, warmup 100 linear from ratio 0,
  // cosine to ratio 0.0001, base lr 0.0003)".
  virtual std::string describe() const = 0;

  virtual ~LrSchedule();
};

}  // namespace ciuic::schedule
