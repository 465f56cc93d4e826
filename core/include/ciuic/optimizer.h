// ciuic/optimizer.h — the optimizer slot ([optimizer] plugin = adamw | cpu_adam | ...).
//
// An Optimizer owns, for the calling rank, everything of one flat fp32 *shard* of the model that
// lives from one step to the next: the fp32 master weights, the optimizer's moments, and the
// gradient shard the Sharding fills. Where that memory is (device or host) and how the update runs
// is the optimizer's business; the Sharding only says which elements are in the shard.
//
// The protocol, driven by the Sharding (ciuic/sharding.h):
//
//   setup(s)                                    once, after the Sharding laid out its shard
//   per optimizer step:
//     offer_early_update(args)                    optional: before the step's first chunk, when
//                                                 the update is known in advance (below)
//     accumulate_grad(region, chunk, first, last)   for every reduced gradient chunk, as
//                                                   reductions complete (during backward)
//     finish_grads()                              -> this rank's sum of squares of its gradient
//     step(args, params_out)                      unless the step is skipped (overflow)
//   write_params(params_out)                    after load_state() (resume)
//
// Gradient regions. setup() lists the regions of the shard the Sharding delivers gradients for
// (OptimizerSetup::grad_regions: disjoint, covering the shard). In one optimizer step each region
// receives one or more chunks (one per reduced micro-batch): the first with first = true (the
// region's value becomes the chunk: the gradient shard is never zeroed), the others are added; the
// last has last = true, after which the region's gradient is final (an optimizer may then take
// its squares for the norm, or start moving it). `chunk` is 1-D, region-sized, contiguous, of
// OptimizerSetup::grad_dtype, on the run's device. When OptimizerSetup::one_chunk_per_step says
// so, every region receives exactly one chunk per step (first and last both true): nothing is
// accumulated, and an optimizer may keep its gradient in grad_dtype as it came (with one rank the
// Sharding reduces nothing and hands over the gradients in the parameter dtype, exactly as autograd
// produced them; an fp32 copy would hold the same values in twice the memory). The Sharding may reuse the chunk's memory
// as soon as accumulate_grad() returns: work the optimizer enqueues on the current CUDA stream
// before returning is ordered before any reuse (the caching allocator's stream order), so an
// asynchronous copy from it on the current stream is safe; anything else must be finished.
//
// Step. finish_grads() waits for whatever the optimizer still does with this step's gradient and
// returns the sum of squares of its final gradient shard (a one-element fp64 tensor on any device,
// ciuic/grad_norm.h's accuracy) — the Sharding turns it into the global norm, decides to skip or
// clip, then calls step() with grad_scale = clip coefficient / loss scale. step() updates the
// master and moments from grad_scale * gradient and writes the updated master weights, rounded
// to the parameter dtype by the precision policy (Precision::round_to_param), into params_out
// (this rank's shard of the model's parameters, on the run's device). When step() returns,
// params_out is complete as seen by the current stream (CUDA) or the caller (CPU).
// A skipped step calls finish_grads() but not step(): the next step's first chunks overwrite the
// gradient.
//
// Early update (optional). When a step's update does not depend on its global gradient — no
// clipping, a precision policy that cannot skip a finite step, and a non-finite gradient that ends
// the run (ciuic/sharding.h, Sharding::begin_step, says when a Sharding may claim this) — the
// Sharding may call offer_early_update(args) before the step's first accumulate_grad(), with
// exactly the args step() will receive. An optimizer that accepts (returns true) may update a
// region's master weights and moments as soon as the region's last chunk of the step (last =
// true) has arrived, while backward goes on with the other regions, provided the result is
// bit-identical to updating in step(). Contract:
//   - The Sharding then calls finish_grads() and step(args, params_out) with the offered args;
//     step() finishes whatever is not updated yet and writes params_out as usual. An optimizer
//     should throw ciuic::Error when step()'s args differ from the offered ones.
//   - No parameter is written before step(): params_out is handed over only then, and backward
//     still reads the model's parameters (with one rank, params_out IS the model's flat buffer).
//     Rounded parameters computed early stay in the optimizer's own memory until step().
//   - If the step is not applied after an accepted offer (a non-finite gradient: StepResult::
//     skipped), step() is not called and the optimizer's state is partly updated; the run ends
//     (that is what the Sharding promised). An optimizer may refuse save_state() and further
//     offers in that state with ciuic::Error, so that it is never saved or trained on.
//   - Declining (the default) costs nothing: the step runs as without an offer. An offer is for
//     one step; an optimizer accepts it again or not at the next.
// Threading: offer_early_update() on the training thread, like step(); the early work runs on
// the optimizer's own threads, and is finished (or its failure rethrown) by step().
//
// State. state_names() lists the optimizer's per-element fp32 state, "master" first (AdamW:
// master, exp_avg, exp_avg_sq). save_state() hands out one 1-D fp32 CPU tensor of numel elements
// per name (plus, optionally, small tensors of other shapes under other names, e.g. a step
// counter); load_state() takes the same back — checkpoints reassemble each named state across
// world sizes, so a resumed run may have another shard layout than the one that saved.
//
// Threading: setup/finish_grads/step/write_params/save/load on the training thread;
// accumulate_grad on the training thread or autograd's device thread, never concurrently with the
// other calls. Implementations may use their own threads and streams inside.
// Failure: ciuic::Error naming the plugin and what is wrong (shapes, dtypes, allocation sizes).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ciuic/plugin.h>
#include <ciuic/state.h>

namespace ciuic {

class Precision;

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
  virtual void setup(const OptimizerSetup& setup) = 0;
  // See "Early update" above: true when this step's regions will be updated as their last chunks
  // arrive. Default: false (update in step()).
  virtual bool offer_early_update(const OptimizerStep& args);
  virtual void accumulate_grad(int region, const at::Tensor& chunk, bool first, bool last) = 0;
  virtual at::Tensor finish_grads() = 0;
  virtual void step(const OptimizerStep& args, at::Tensor& params_out) = 0;
  // params_out <- master weights rounded by the precision policy (after load_state()).
  virtual void write_params(at::Tensor& params_out) = 0;

  virtual std::vector<std::string> state_names() const = 0;
  virtual void save_state(StateDict& out) const = 0;
  virtual void load_state(const StateDict& in) = 0;
  virtual OptimizerMemory memory() const = 0;
};

// Checks shared by optimizer implementations. Each throws ciuic::Error whose message starts with
// `who` (e.g. "optimizer cpu_adam") and names what is wrong.
//
// setup: numel >= 0; segments and grad_regions cover [0, numel) in order without gaps; initial
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
