// ciuic/optimizer.h — the optimizer slot ([optimizer] plugin = adamw | cpu_adam | ...).
//
// An Optimizer owns, for the calling rank, everything of one flat fp32 *shard* of the model that
// lives from one step to the next: the fp32 master weights, the optimizer's moments, and the
// gradient shard the Sharding fills. Where that memory is (device or host) and how the update runs
// is the optimizer's business; the Sharding (ciuic/sharding.h) says which elements are in the
// shard and delivers their gradients; the core (core/src/train/step.h) decides the step.
//
//   setup(s)                                      once, called by the Sharding's setup()
//   per optimizer step:
//     offer_early_update(args)                    by the core, before the step's first
//                                                 micro-batch, only when the update cannot depend
//                                                 on the gradient norm (below)
//     accumulate_grad(region, chunk, first, last)   by the Sharding, for every reduced chunk
//     finish_grads()                              by the Sharding (Sharding::finish_grads)
//     step(args, params_out)                      by the Sharding (Sharding::update), unless the
//                                                 core skips the step
//   save_state / load_state + write_params(params_out, t)   between steps (checkpoints)
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ciuic/plugin.h>
#include <ciuic/precision.h>
#include <ciuic/state.h>

namespace ciuic {

// Elements [begin, end) of the shard, and whether weight decay applies to them (matrices: yes;
// norms, biases, padding: no).
struct ShardSegment {
  int64_t begin = 0;
  int64_t end = 0;
  bool weight_decay = true;
};

// Elements [offset, offset + numel) of the shard: the unit in which gradients arrive.
struct ShardRegion {
  int64_t offset = 0;
  int64_t numel = 0;
};

// Current parameter values of part of the shard: `values` (a view into the model's parameters,
// parameter dtype, run's device) holds shard elements [shard_offset, shard_offset + numel).
struct ShardValues {
  int64_t shard_offset = 0;
  at::Tensor values;
};

struct OptimizerSetup {
  int64_t numel = 0;
  // Cover [0, numel) in order, without gaps or overlaps.
  std::vector<ShardSegment> segments;
  std::vector<ShardRegion> grad_regions;
  // Where each shard element sits in the model (PositionSpan::offset in the shard): cover
  // [0, numel) in order; global = -1 for padding. What the optimizer hands round_to_param()
  // (positions_of() below cuts the spans of a piece).
  std::vector<PositionSpan> positions;
  // The initial master weights, as pieces covering [0, numel). Read during setup() only.
  std::vector<ShardValues> initial;
  at::ScalarType param_dtype = at::kFloat;
  c10::Device device{c10::kCPU};         // the run's device: where chunks and params_out live
  const Precision* precision = nullptr;  // never null; outlives the optimizer
  int64_t gradient_accumulation_steps = 1;
  // The dtype of every chunk accumulate_grad() receives: the precision's reduce dtype, or the
  // parameter dtype when the Sharding reduces nothing (one rank).
  at::ScalarType grad_dtype = at::kFloat;
  // Every region receives exactly one chunk per step (no accumulation in the optimizer): true when
  // the Sharding reduces once per step (no_sync accumulation, or one micro-batch per step).
  bool one_chunk_per_step = false;
};

// What step() applies. Optimizer-specific hyper-parameters (betas, eps, ...) are the plugin's
// own options; these come from the core ([optimizer] lr, weight_decay, the schedule, clipping).
struct OptimizerStep {
  double lr = 0.0;            // this step's scheduled learning rate
  double weight_decay = 0.0;  // decoupled, applied to segments marked for it
  double grad_scale = 1.0;    // multiplies the gradient: clip coefficient / loss scale
  int64_t t = 1;              // 1-based count of applied updates (skipped steps do not count)
};

struct OptimizerMemory {
  uint64_t device_bytes = 0;  // on the run's device (host memory on CPU runs)
  uint64_t host_bytes = 0;    // in host memory on GPU runs (pinned or not)
};

class CIUIC_API Optimizer : public PluginObject {
 public:
  // Allocates the shard's state and builds the master weights from setup.initial (read here
  // only). Assumes: check_optimizer_setup() holds (call it); setup.precision outlives the
  // optimizer. Called once, by Sharding::setup(), on the main thread. Failure: ciuic::Error naming
  // the plugin and the allocation or argument at fault.
  virtual void setup(const OptimizerSetup& setup) = 0;

  // Offered by the core before a step's first micro-batch only when the update cannot depend on
  // the step's gradient: no clipping, a precision policy that needs no overflow check (so it never
  // skips a finite step and its loss scale is fixed), and a run that ends on a non-finite
  // gradient. `args` are exactly what step() will receive. Returning true accepts: the optimizer
  // may then update a region's master weights and moments as soon as the region's last chunk of
  // the step (last = true) arrived, while backward goes on, provided the result is bit-identical
  // to updating in step(). Then:
  //   - step(args, params_out) comes with the offered args (throw ciuic::Error if not) and writes
  //     params_out as usual; no parameter may be written before it (backward still reads them;
  //     rounded values computed early stay in the optimizer's own memory until then);
  //   - if the step is not applied (a non-finite gradient), step() never comes and the state is
  //     partly updated; the run ends. An optimizer may refuse save_state() and further offers in
  //     that state with ciuic::Error.
  // An offer is for one step. Main thread; early work runs on the optimizer's own threads and is
  // finished (or its failure rethrown) by step(). Default: false (declining costs nothing).
  virtual bool offer_early_update(const OptimizerStep& args);

  // Region `region` (an index into OptimizerSetup::grad_regions) receives a reduced chunk: 1-D,
  // region-sized, contiguous, of OptimizerSetup::grad_dtype, on the run's device. first = true:
  // the region's gradient becomes the chunk (the gradient shard is never zeroed); otherwise the
  // chunk is added. last = true: the region's gradient is final for this step (one_chunk_per_step:
  // every chunk is first and last). The Sharding may reuse the chunk's memory as soon as this
  // returns: work enqueued on the current CUDA stream before returning is ordered before any reuse,
  // anything else must be finished. Threading: the main thread or autograd's device thread, never
  // concurrently with the other methods. Failure: ciuic::Error (check_grad_chunk()).
  virtual void accumulate_grad(int region, const at::Tensor& chunk, bool first, bool last) = 0;

  // Every region's last chunk of the step has arrived: waits for whatever the optimizer still does
  // with the gradient and returns the sum of squares of the final gradient shard (a one-element
  // fp64 tensor on any device, ciuic/grad_norm.h's accuracy). Called once per step, also on steps
  // the core then skips (the next step's first chunks overwrite the gradient). Main thread.
  virtual at::Tensor finish_grads() = 0;

  // Updates the master weights and moments from args.grad_scale * gradient and writes the updated
  // master weights, rounded by the precision policy (Precision::round_to_param with args.t and the
  // elements' OptimizerSetup::positions), into params_out: this rank's shard of the parameters,
  // OptimizerSetup::numel elements of the parameter dtype on the run's device. When it returns,
  // params_out is complete as seen by the current stream (CUDA) or the caller (CPU). Assumes:
  // check_optimizer_step() holds. Main thread. Failure: ciuic::Error.
  virtual void step(const OptimizerStep& args, at::Tensor& params_out) = 0;

  // params_out <- the master weights rounded by the precision policy for update `t` (the last
  // applied update; 0 before any), after load_state() — the same bits step(t) wrote, so that a
  // resumed run computes with what the saved run computed with. Main thread.
  virtual void write_params(at::Tensor& params_out, int64_t t) = 0;

  // Per-element fp32 state, "master" first (AdamW: master, exp_avg, exp_avg_sq). save_state() hands
  // out one 1-D fp32 CPU tensor of numel elements per name (plus, optionally, small tensors of
  // other shapes under other names, e.g. a step counter); load_state() takes the same back —
  // reassembled across world sizes, so the shard layout may differ from the one that saved.
  // Between steps, main thread. Failure: ciuic::Error naming the missing or misshapen entry.
  virtual std::vector<std::string> state_names() const = 0;
  virtual void save_state(StateDict& out) const = 0;
  virtual void load_state(const StateDict& in) = 0;

  // Memory held now, for the core's set-up line. Any thread; cheap. Default: nothing counted.
  virtual OptimizerMemory memory() const;

  // API 9. true promises that this optimizer works with a Sharding that shards the parameters
  // themselves (Sharding::shards_parameters(): zero3), where
  //   - params_out of step() and write_params() is the Sharding's own shard buffer, or a staging
  //     tensor for it (zero3's shard in host memory on a GPU run): possibly a new tensor at every
  //     call, whose contents before the call are unspecified. The optimizer writes every element
  //     of it and reads none;
  //   - the model's parameters have memory only inside their groups' boundaries (the Sharding
  //     frees and refills their storage): the optimizer keeps no tensor it was handed in setup()
  //     (OptimizerSetup::initial is read there only, as always) and reaches the model no other way;
  //   - the shard is in the Sharding's order, not the model's: a parameter may be cut into pieces
  //     and pieces may come out of model order (zero3 puts parameters below its
  //     param_persistence_threshold after the layers). An element relates to the model only
  //     through OptimizerSetup::positions and segments — no rule that needs a whole parameter, or
  //     the pieces of one in order (a matrix-wise update such as Shampoo's says false).
  // An optimizer that updates each element from its own state and gradient (AdamW, Lion, the
  // optim kit's ShardOptimizer) keeps these; the conformance kit checks the first two when this
  // says true. Asked once by the core, on the main thread, after the factory and before setup();
  // must depend on nothing but the plugin's options. Default: false — an optimizer written
  // before API 9 has not said, so the core refuses it with such a Sharding (ciuic::UsageError
  // naming both plugins) instead of guessing; with any other Sharding it is not asked.
  virtual bool accepts_sharded_parameters() const;
};

// The spans of OptimizerSetup::positions for shard elements [shard_offset, shard_offset + numel),
// with offsets relative to shard_offset (what round_to_param() takes for a piece of the shard).
CIUIC_API std::vector<PositionSpan> positions_of(const OptimizerSetup& setup, int64_t shard_offset,
                                                 int64_t numel);

// Checks shared by optimizer implementations. Each throws ciuic::Error whose message starts with
// `who` (e.g. "optimizer cpu_adam") and names what is wrong.
//
// setup: numel >= 0; segments, grad_regions and positions (when given) cover [0, numel) in
// order without gaps; initial
// pieces inside [0, numel) and of the parameter dtype; param_dtype fp32, bf16 or fp16; precision
// set.
CIUIC_API void check_optimizer_setup(const OptimizerSetup& setup, std::string_view who);
// A chunk for `region` (an index into setup.grad_regions), of setup.grad_dtype.
CIUIC_API void check_grad_chunk(const OptimizerSetup& setup, int region, const at::Tensor& chunk,
                                std::string_view who);
// step() arguments: finite grad_scale > 0, t >= 1, params_out a contiguous tensor of numel
// elements in the parameter dtype on the run's device.
CIUIC_API void check_optimizer_step(const OptimizerSetup& setup, const OptimizerStep& args,
                                    const at::Tensor& params_out, std::string_view who);
// load_state(): state[key] as a 1-D fp32 tensor of numel elements.
CIUIC_API at::Tensor optimizer_state_tensor(const StateDict& state, const std::string& key,
                                            int64_t numel, std::string_view who);

}  // namespace ciuic
