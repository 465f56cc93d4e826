// Internal: the optimizer step's protocol, owned by the core — norm -> skip -> clip -> update.
//
// The slots supply mechanism only: the Sharding finishes its reductions and returns its gradient
// squares (Sharding::finish_grads), the precision policy decides a skip (Precision::update), the
// Sharding applies the update the core decided (Sharding::update, which hands the Optimizer its
// shard). The loop (trainer.cpp) reads, as llm.c's does:
//
//   Step step(slots, input);                    // before backward: may offer the early update
//   ... micro-batches: forward, backward ...
//   const GradNorm norm = step.global_norm();   // reductions finished, one all-reduce
//   if (!step.skip(norm)) step.update(step.clip_coefficient(norm));
//
// Threading: the training thread; every rank makes the same calls (collectives inside).
// Failure: ciuic::Error from the slots; Step's own errors name the step and the broken promise.
#pragma once

#include <cstdint>

#include <ciuic/export.h>
#include <ciuic/grad_norm.h>
#include <ciuic/optimizer.h>

namespace ciuic {
class Comm;
class Precision;
class Sharding;
}  // namespace ciuic

namespace ciuic::train {

// What the loop asks of one optimizer step.
struct StepInput {
  double lr = 0.0;               // this step's scheduled learning rate
  double weight_decay = 0.0;     // [optimizer] weight_decay
  double max_grad_norm = 0.0;    // <= 0: no clipping
  int64_t step = 1;              // 1-based optimizer step (for messages and the precision policy)
  int64_t t = 1;                 // the optimizer's t if this step is applied: 1 + updates applied
                                 // so far (skipped steps do not count, as in PyTorch and DeepSpeed)
  bool nonfinite_stops = false;  // a non-finite gradient ends the run ([train] nonfinite = "stop"):
                                 // nothing trains on or saves the optimizer state afterwards
};

struct StepResult {
  double grad_norm = 0.0;  // before clipping, of the unscaled gradient; NaN/inf on overflow
  bool skipped = false;    // no update was applied: precision.update() said skip, or the
                           // gradient was non-finite (never applied, whatever the policy)
};

struct StepSlots {
  Comm* comm = nullptr;
  Precision* precision = nullptr;
  Optimizer* optimizer = nullptr;
  Sharding* sharding = nullptr;
};

class CIUIC_API Step {
 public:
  // Before the step's first micro-batch. Reads the loss scale the backward uses, and offers the
  // optimizer an early update (Optimizer::offer_early_update) exactly when nothing can depend on
  // the gradient norm: no clipping, a precision policy without overflow check, and a run that ends
  // on a non-finite gradient.
  Step(const StepSlots& slots, const StepInput& input);

  // The loss scale of this step's backward.
  double loss_scale() const { return scale_; }
  // The global L2 norm of the unscaled gradient (Sharding::finish_grads, then one all-reduce when
  // the shards are disjoint); nonfinite on overflow. Call once, after the last backward.
  GradNorm global_norm();
  // precision.update(found_inf) — exactly once — and whether the step is skipped (the policy
  // said so, or the norm is not finite). After an accepted early update, a skip of a finite step
  // is the policy breaking its promise (ciuic/precision.h): ciuic::Error.
  bool skip(const GradNorm& norm);
  // max_grad_norm / (norm + 1e-6) when clipping is on and the norm exceeds it (PyTorch's
  // clip_grad_norm_), else 1.
  double clip_coefficient(const GradNorm& norm) const;
  // The update: Sharding::update with grad_scale = clip / loss scale (the offered arguments after
  // an accepted early update, which then are the same).
  void update(double clip_coefficient);

  // What the loop records: the norm and whether the step was skipped (after skip()).
  StepResult result() const { return result_; }
  // Host seconds of global_norm()'s two parts: the sharding's finish_grads() and the norm.
  double drain_s() const { return drain_s_; }
  double norm_s() const { return norm_s_; }

 private:
  OptimizerStep args(double clip_coefficient) const;

  StepSlots slots_;
  StepInput in_;
  double scale_ = 1.0;
  bool early_ = false;  // the optimizer accepted the early update
  StepResult result_;
  double drain_s_ = 0, norm_s_ = 0;
};

// The four lines of the loop in one call, for tests and tools that drive a step.
CIUIC_API StepResult run_step(Step& step);

}  // namespace ciuic::train
