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
// its squares for the norm, or start moving it). `chunk` is 1-D, region-sized, contiguous, fp32
// or the precision's reduce dtype, on the run's device. The Sharding may reuse the chunk's memory
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
// A chunk for `region` (an index into setup.grad_regions).
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
