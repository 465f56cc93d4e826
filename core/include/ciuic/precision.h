// ciuic/precision.h — the precision policy slot ([precision] plugin = fp32 | bf16 | fp16 | ...).
//
// Decides the dtype of parameters and compute, the dtype gradients are reduced in, loss scaling,
// and how fp32 master weights become parameters (round_to_param). Master weights and optimizer
// moments are always fp32 (held by the Optimizer slot).
//
// The step protocol, driven by the trainer and the Sharding:
//   1. loss * loss_scale() is back-propagated (loss_scale() is 1 without loss scaling);
//   2. if needs_overflow_check(), the Sharding checks its gradients for inf/nan and agrees the
//      result across ranks (all_reduce MAX through Comm);
//   3. the Sharding calls update(found_inf, step) exactly once per optimizer step; when it returns
//      true the step is skipped: parameters and optimizer state are left bit-identical;
//   4. gradients are multiplied by 1/loss_scale() *as it was before update()* — the Sharding reads
//      loss_scale() before calling update().
// A policy whose needs_overflow_check() is false promises that update(false, step) returns false
// (a finite step is never skipped) and that loss_scale() changes only inside update(): a Sharding
// relies on it to let the optimizer update before the step's norm is known (ciuic/sharding.h,
// begin_step), and fails the step with ciuic::Error if such a policy skips a finite step.
//
// Rounding: every optimizer writes updated parameters through round_to_param() — after each
// update and when a checkpoint is loaded — so a policy decides how the fp32 master becomes the
// parameter dtype (e.g. stochastic rounding). When rounds_to_nearest() is true (the default) the
// policy promises round_to_param() is plain round-to-nearest-even, and an optimizer may fuse that
// rounding into its own update kernel instead of calling it.
//
// Threading: main thread only, except round_to_param(), which an optimizer may call from its own
// threads for disjoint parts of the shard at once (it must be reentrant). Failure: update() throws
// ciuic::Error when a dynamic scale would fall below its minimum (the message names the step).
#pragma once

#include <cstdint>

#include <c10/core/ScalarType.h>

#include <ciuic/plugin.h>
#include <ciuic/state.h>

namespace ciuic {

class CIUIC_API Precision : public PluginObject {
 public:
  // dtype of the model's parameters and activations (kFloat, kBFloat16, kHalf).
  virtual at::ScalarType param_dtype() const = 0;
  // dtype gradients are reduced in across ranks (and accumulated in, for the fp32 accumulator).
  virtual at::ScalarType reduce_dtype() const = 0;
  virtual double loss_scale() const = 0;
  virtual bool needs_overflow_check() const = 0;
  // See the protocol above. `step` is the 1-based optimizer step being attempted.
  virtual bool update(bool found_inf, int64_t step) = 0;
  // Steps skipped so far because of overflow.
  virtual int64_t skipped_steps() const = 0;

  // out <- master rounded to out's dtype (param_dtype()). `master`: 1-D fp32, `out`: same numel,
  // both contiguous, on the same device (host optimizers round into host staging memory and copy
  // it to the device themselves). `shard_offset`: the
  // position of master[0] in the rank's shard and `t` the optimizer step, for rounding that
  // depends on position and time (a counter-based random stream). Default: round to nearest even.
  virtual void round_to_param(const at::Tensor& master, at::Tensor& out, int64_t shard_offset,
                              int64_t t) const;
  virtual bool rounds_to_nearest() const;

  // Checkpointed state (the scale and its counters); default: none.
  virtual void save_state(StateDict& out) const;
  virtual void load_state(const StateDict& in);
};

}  // namespace ciuic
