// ciuic/precision.h — the precision policy slot ([precision] plugin = fp32 | bf16 | fp16 | ...).
//
// Decides the dtype of parameters and compute, the dtype gradients are reduced in, loss scaling,
// and how fp32 master weights become parameters (round_to_param). Master weights and optimizer
// moments are always fp32 (held by the Optimizer slot). Per optimizer step, the core
// (core/src/train/step.h):
//
//   scale = loss_scale()                  backward of loss * scale
//   skip = update(found_inf, step)        once, after the global norm (found_inf: non-finite)
//   if not skip: the optimizer applies gradient * clip / scale, and writes parameters through
//                round_to_param(master, out, t, positions)
//
// The defaults are plain fp32: parameters, compute and reductions in fp32, loss scale 1, no
// overflow check, never a skipped step, round to nearest even, no state. A policy overrides what
// it changes.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <ciuic/plugin.h>
#include <ciuic/state.h>

namespace ciuic {

// Elements [offset, offset + length) of a tensor handed to round_to_param() are the elements
// [global, global + length) of the model in its flat parameter order (the parameters in
// ShardingSetup::params order, each flattened, no padding between them) — the same numbers at
// every world size and shard layout. global = -1: padding, no model element.
struct PositionSpan {
  int64_t offset = 0;
  int64_t length = 0;
  int64_t global = -1;
};

class CIUIC_API Precision : public PluginObject {
 public:
  // dtype of the model's parameters and activations (kFloat, kBFloat16, kHalf); fixed for the
  // policy's life. Any thread. Default: kFloat.
  virtual at::ScalarType param_dtype() const;
  // dtype gradients are reduced in across ranks (and accumulated in, for an fp32 accumulator);
  // fixed. Any thread. Default: kFloat.
  virtual at::ScalarType reduce_dtype() const;

  // The factor the loss is multiplied by before backward; changes only inside update(). The core
  // reads it before backward and divides the gradient by that value, even when update() changes
  // it. Main thread. Default: 1.
  virtual double loss_scale() const;
  // true: the policy may skip a step whose gradient is finite, or change its scale (dynamic loss
  // scaling). false promises that update(false, step) returns false and loss_scale() is fixed: the
  // core may then let the optimizer update before the norm is known (Optimizer::
  // offer_early_update), and fails the step with ciuic::Error if the promise is broken. Fixed for
  // the policy's life. Default: false.
  virtual bool needs_overflow_check() const;
  // Called by the core exactly once per optimizer step, on every rank with the same arguments:
  // `found_inf` (the global gradient norm is not finite) and `step` (1-based, the step being
  // attempted, for messages). Returns true to skip the step (parameters and optimizer state are
  // then left bit-identical; a non-finite step is never applied whatever this returns). Main
  // thread. Failure: ciuic::Error when a dynamic scale would fall below its minimum (naming the
  // step). Default: false (never skip).
  virtual bool update(bool found_inf, int64_t step);

  // out <- master converted to out's dtype (param_dtype()). Assumes: `master` 1-D fp32, `out` the
  // same numel, both contiguous, on the same device (host optimizers round into host staging
  // memory); `t` the applied update whose parameters these are (1-based; after a resume, the last
  // applied one: write_params(.., t)); `positions` cover [0, numel) of out in order
  // (PositionSpan). Must give the same bits for the same (master, t, positions) whatever the
  // world size, the shard layout and how the shard is cut into calls — so a rounding with noise
  // draws it from a counter-based stream of (run seed, t, global position), never from a running
  // generator. Reentrant: an optimizer may call it from its own threads for disjoint parts of the
  // shard at once. Default: round to nearest even.
  virtual void round_to_param(const at::Tensor& master, at::Tensor& out, int64_t t,
                              const std::vector<PositionSpan>& positions) const;
  // true promises that round_to_param() is plain round-to-nearest-even, so an optimizer may fuse
  // the conversion into its own update kernel instead of calling it. Default: true.
  virtual bool rounds_to_nearest() const;

  // Checkpointed state (the scale and its counters): tensors of any shape, saved and loaded
  // between steps on the main thread; every rank holds the same. load_state() comes before the
  // parameters are rewritten from the loaded master weights. Default: none.
  virtual void save_state(StateDict& out) const;
  virtual void load_state(const StateDict& in);

  // API 9. true promises that this policy works with a Sharding that shards the parameters
  // themselves (Sharding::shards_parameters(): zero3): round_to_param() takes its bits from
  // (master, t, positions) alone also when the spans' global positions do not ascend (the shard is
  // in the Sharding's order: zero3 puts parameters below its param_persistence_threshold after the
  // layers) and when `out` is the Sharding's shard or a staging tensor, never the model's
  // parameters; and the policy holds nothing that refers to the model's parameters (the Sharding
  // frees and refills their storage between their groups' boundaries). A policy that rounds each
  // element from its value, t and global position (fp32, bf16 — nearest or stochastic — fp16)
  // keeps this; the conformance kit checks the rounding when this says true. Asked once by the
  // core, on the main thread, after the factory; must depend on nothing but the plugin's options.
  // Default: false — a policy written before API 9 has not said, so the core refuses it with such
  // a Sharding (ciuic::UsageError naming both plugins) instead of guessing; with any other
  // Sharding it is not asked.
  virtual bool accepts_sharded_parameters() const;
};

}  // namespace ciuic
