// ciuic/sharding.h — the optimizer sharding slot ([sharding] plugin = ddp | zero2 | ...).
//
// A Sharding decides how parameters, gradients and optimizer state are laid out across ranks and
// when collectives run. The trainer drives it like this, once per optimizer step of
// `gradient_accumulation_steps` micro-batches:
//
//   begin_step(input)                                       // optional (see below)
//   for i in 0..A-1:
//     begin_micro_batch(i, /*last=*/i == A-1)
//     forward; (loss * precision.loss_scale()).backward()   // the Sharding's hooks see gradients
//   result = step(input)                                    // reduce, check, clip, update, gather
//
// setup() receives the model's parameters (leaf tensors on the run's device in the parameter
// dtype, requires_grad). It may move their storage into its own flat buffers (param.set_data with
// a view — the model keeps the same tensor objects) and registers autograd hooks on them. After
// step() returns, every parameter holds its updated value on every rank and no gradient state of
// this step remains (the next begin_micro_batch(0, ..) starts from zero).
//
// The Sharding decides WHICH elements of the model each rank updates (its shard) and moves
// gradients and parameters between ranks; the Optimizer (ciuic/optimizer.h) holds the shard's
// state and does the update. setup() lays the shard out and calls optimizer.setup(); as
// reductions complete it hands each reduced chunk to optimizer.accumulate_grad() (no gradient
// shard of its own).
//
// step() must: finish all gradient reductions; take optimizer.finish_grads() and turn it into the
// global gradient L2 norm (summing across ranks when shards differ); call precision.update()
// exactly once (a non-finite norm is the overflow signal); on a skipped step leave parameters and
// optimizer state untouched; otherwise clip to max_grad_norm when > 0, call optimizer.step() with
// grad_scale = clip coefficient / loss scale, and make every rank's parameters current.
//
// begin_step(input) announces the step before begin_micro_batch(0, ..), with the StepInput that
// step() will receive (a caller that never calls it gets the plain protocol; the default does
// nothing). A Sharding may then offer the optimizer an early update (Optimizer::
// offer_early_update: regions updated while backward goes on) — but only when the update cannot
// depend on the global gradient norm: input.max_grad_norm <= 0 (no clipping), the precision
// policy needs no overflow check (it cannot skip a finite step, and its loss scale is fixed for
// the step: ciuic/precision.h), and input.nonfinite_stops (a non-finite gradient ends the run, so
// a partly updated state is never used). After an accepted offer step() must call
// optimizer.step() with exactly the offered arguments, and must fail (ciuic::Error) rather than
// skip a step whose gradient is finite.
//
// Gradients arriving at the hooks are of sum(token losses) / global_label_tokens per rank, so the
// reduction across ranks is a SUM (never an average): the trainer normalises the loss.
//
// Threading: main thread (autograd runs hooks on the thread that calls backward, for CPU; for
// CUDA on autograd's device thread — implementations must only enqueue work there).
// Failure: ciuic::Error; a Comm timeout propagates from Work::wait().
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ciuic/optimizer.h>
#include <ciuic/plugin.h>
#include <ciuic/state.h>

namespace ciuic {

class Comm;
class Optimizer;
class Precision;

struct ShardingParam {
  std::string name;  // the HF name, e.g. "model.layers.0.self_attn.q_proj.weight"
  at::Tensor tensor;
  bool weight_decay = true;
};

struct ShardingSetup {
  std::vector<ShardingParam> params;  // in forward order (embedding first)
  Comm* comm = nullptr;               // never null (a world of 1 still has a Comm)
  Precision* precision = nullptr;     // never null
  Optimizer* optimizer = nullptr;     // never null
  int64_t gradient_accumulation_steps = 1;
};

struct StepInput {
  double lr = 0.0;             // this step's scheduled learning rate
  double weight_decay = 0.0;   // [optimizer] weight_decay
  double max_grad_norm = 0.0;  // <= 0: no clipping
  int64_t step = 1;            // 1-based optimizer step (for messages and the precision policy)
  int64_t t = 1;               // the optimizer's t if this step is applied: 1 + updates applied
                               // so far (skipped steps do not count, as in PyTorch and DeepSpeed)
  bool nonfinite_stops = false;  // a step returned as skipped with a non-finite grad_norm ends the
                                 // run ([train] nonfinite = "stop"): nothing trains on or saves
                                 // the optimizer state afterwards. false: the caller may go on, so
                                 // a skipped step must leave the state untouched
};

struct StepResult {
  double grad_norm = 0.0;  // before clipping, of the unscaled gradient; NaN/inf on overflow
  bool skipped = false;    // no update was applied: precision.update() said skip, or the
                           // gradient was non-finite (never applied, whatever the policy)
};

// What the Sharding itself holds (the optimizer's memory is Optimizer::memory()).
struct ShardingMemory {
  uint64_t param_bytes = 0;  // device bytes of parameters held by this rank
  uint64_t grad_bytes = 0;   // device bytes of gradient buffers (buckets in flight, peak)
};

// Part of a parameter held in this rank's shard: elements [param_offset, param_offset + length)
// of the flattened parameter sit at [shard_offset, shard_offset + length) of the shard.
struct ShardSlice {
  std::string param;
  int64_t param_offset = 0;
  int64_t length = 0;
  int64_t shard_offset = 0;
};

// Returns elements [offset, offset + length) of the flattened fp32 `state` (one of the optimizer's
// state_names(), e.g. "master", "exp_avg") of parameter `param`, as a 1-D fp32 CPU tensor —
// whatever world size wrote it.
using SliceFetcher = std::function<at::Tensor(const std::string& state, const std::string& param,
                                              int64_t offset, int64_t length)>;

class CIUIC_API Sharding : public PluginObject {
 public:
  virtual void setup(const ShardingSetup& setup) = 0;
  // See begin_step() above. Default: nothing.
  virtual void begin_step(const StepInput& input);
  virtual void begin_micro_batch(int64_t index, bool last) = 0;
  virtual StepResult step(const StepInput& input) = 0;
  virtual ShardingMemory memory() const = 0;

  // Checkpoints. layout() describes this rank's shard; save_state() returns the optimizer's state
  // (1-D fp32 CPU tensors in layout() order, Optimizer::save_state) plus anything else the plugin
  // needs; load_state() rebuilds each of the optimizer's state_names() for its shard from
  // per-parameter slices, hands them to the optimizer and makes the parameters current.
  virtual std::vector<ShardSlice> layout() const = 0;
  virtual void save_state(StateDict& out) const = 0;
  virtual void load_state(const SliceFetcher& fetch) = 0;
};

}  // namespace ciuic
