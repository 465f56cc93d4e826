// The optimizer step's protocol (train/step.h).
#include "train/step.h"

#include <chrono>
#include <cmath>
#include <string>

#include <ciuic/comm.h>
#include <ciuic/error.h>
#include <ciuic/precision.h>
#include <ciuic/sharding.h>

namespace ciuic::train {

namespace {
double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}
}  // namespace

Step::Step(const StepSlots& slots, const StepInput& input) : slots_(slots), in_(input) {
  if (!slots_.comm || !slots_.precision || !slots_.optimizer || !slots_.sharding)
    throw Error("step: a comm, a precision policy, an optimizer and a sharding are needed");
  scale_ = slots_.precision->loss_scale();
  // The update is known before the gradient norm only without clipping, without a loss scaler that
  // may skip the step, and when a non-finite gradient ends the run (a partly updated state is then
  // never used).
  if (in_.max_grad_norm <= 0 && !slots_.precision->needs_overflow_check() && in_.nonfinite_stops)
    early_ = slots_.optimizer->offer_early_update(args(1.0));
}

OptimizerStep Step::args(double clip_coefficient) const {
  OptimizerStep a;
  a.lr = in_.lr;
  a.weight_decay = in_.weight_decay;
  a.grad_scale = clip_coefficient / scale_;
  a.t = in_.t;
  return a;
}

GradNorm Step::global_norm() {
  auto t = std::chrono::steady_clock::now();
  const GradSquares sq = slots_.sharding->finish_grads();
  drain_s_ = seconds_since(t);
  t = std::chrono::steady_clock::now();
  GradNorm gn = global_grad_norm_from_squares(sq.local_sum_sq, *slots_.comm, sq.disjoint);
  if (!gn.nonfinite) gn.norm /= scale_;
  norm_s_ = seconds_since(t);
  result_.grad_norm = gn.norm;
  return gn;
}

bool Step::skip(const GradNorm& norm) {
  const bool skip = slots_.precision->update(norm.nonfinite, in_.step) || norm.nonfinite;
  // After an accepted early update the optimizer's state is partly updated: only a non-finite
  // gradient, which ends the run (StepInput::nonfinite_stops), may skip the step then.
  if (skip && early_ && !norm.nonfinite)
    throw Error("step " + std::to_string(in_.step) +
                ": the precision policy skipped a step with a finite gradient although it needs no "
                "overflow "
                "check (ciuic/precision.h), after the optimizer had begun updating");
  result_.skipped = skip;
  return skip;
}

double Step::clip_coefficient(const GradNorm& norm) const {
  if (in_.max_grad_norm > 0 && norm.norm > in_.max_grad_norm)
    return in_.max_grad_norm / (norm.norm + 1e-6);
  return 1.0;
}

void Step::update(double clip_coefficient) { slots_.sharding->update(args(clip_coefficient)); }

StepResult run_step(Step& step) {
  const GradNorm norm = step.global_norm();
  if (!step.skip(norm)) step.update(step.clip_coefficient(norm));
  return step.result();
}

}  // namespace ciuic::train
