// ciuic/sharding.h — the sharding slot ([sharding] plugin = ddp | zero2 | ...).
//
// A Sharding is mechanism only: it lays parameters, gradients and optimizer state out across
// ranks, moves them between ranks, and hands the Optimizer (ciuic/optimizer.h) its shard. The
// step's policy — the global gradient norm, the precision policy's skip decision, clipping, when
// to update — is the core's (core/src/train/step.h). Per optimizer step of A micro-batches:
//
//   for i in 0..A-1:
//     begin_micro_batch(i, /*last=*/i == A-1)
//     forward                       before_group(g, kForward) / after_group(g, kForward), g = 0, 1,
//     .. (loss * loss_scale).backward()  before_group(g, kBackward) .. after_group(g, kBackward),
//                                   g = .., 1, 0; inside a checkpointed layer's backward
//                                   before_group(g, kRecompute) / after_group(g, kRecompute);
//                                   the Sharding's autograd hooks see gradients as they come
//   squares = finish_grads()        the core: global norm -> precision.update -> skip? -> clip
//   update(args)                    unless the core skips the step
//
// Evaluation and generation run forward passes (kForward boundaries, no backward) outside this
// sequence, between steps. setup() comes first, once; layout(), save_state() and load_state() run
// between steps.
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

// Parameters the model computes with together: in a Llama model, group 0 is the embedding
// ("embed": model.embed_tokens.weight), groups 1..L the decoder layers ("layers.<i>": its nine
// tensors) and group L + 1 the head ("head": model.norm.weight and lm_head.weight — or, with tied
// embeddings, model.embed_tokens.weight again: a parameter may belong to several groups, and its
// gradient is final only after the backward of the last of them, in backward order the lowest).
struct ParamGroup {
  std::string name;
  std::vector<int> params;  // indices into ShardingSetup::params, in forward order
};

// The initial value of a parameter the Sharding builds itself (Sharding::builds_parameters()):
// writes elements [offset, offset + out.numel()) of parameter `param`'s flattened initial value
// (`param` indexes ShardingSetup::params) into `out`, a 1-D contiguous tensor of the parameter's
// dtype on any device (the shard's: the run's device, or host memory with a host shard). Every
// rank gets the same values for the same range (random initialisation from the run's seed, or the
// model folder's safetensors, of which only the bytes of the range are read). Transient memory:
// at most one whole parameter (random initialisation draws the parameter whole, in fp32, so that
// its values are the unsharded run's) — never the model. Main thread, inside setup() only (the
// function and what it captures are the core's and end with setup()). Failure: ciuic::Error
// naming the file and tensor at fault (a shape or dtype the model does not take is refused
// before setup(), so a failure here is I/O).
using ParamValues = std::function<void(int param, int64_t offset, const at::Tensor& out)>;

struct ShardingSetup {
  // In forward order (embedding first). With builds_parameters(): leaf tensors of the right shape,
  // dtype and device with requires_grad whose storage has no memory (reading them throws "data is
  // not allocated"); their values come from `values`.
  std::vector<ShardingParam> params;
  // The model's groups in forward order, announced by before_group()/after_group() with their
  // index. Empty when the caller announces none (then no boundary is ever called).
  std::vector<ParamGroup> groups;
  Comm* comm = nullptr;            // never null (a world of 1 still has a Comm)
  Precision* precision = nullptr;  // never null
  Optimizer* optimizer = nullptr;  // never null
  int64_t gradient_accumulation_steps = 1;
  // API 8. Set only when the Sharding's builds_parameters() said true (else empty: the params
  // hold their values, rank 0's on every rank).
  ParamValues values;
};

// Which pass of a group a boundary belongs to.
enum class GroupPass : uint32_t {
  kForward = 0,    // the group's forward (training, evaluation and generation alike)
  kBackward = 1,   // the group's backward: its parameters' gradients are produced in between
  kRecompute = 2,  // an activation-checkpointed layer recomputing its forward inside its backward
};

// What the core needs for the global gradient norm (finish_grads()).
struct GradSquares {
  // This rank's sum of squares of the gradient it holds (as scaled by the loss scale): a
  // one-element fp64 tensor on any device (ciuic/grad_norm.h's accuracy), e.g.
  // Optimizer::finish_grads()'s.
  at::Tensor local_sum_sq;
  // true: the ranks hold disjoint parts of the gradient (ZeRO) and the core sums local_sum_sq over
  // ranks (one all_reduce); false: every rank holds the whole gradient (DDP): nothing is exchanged.
  bool disjoint = false;
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
  // Lays the shard out and calls setup.optimizer->setup() once, with OptimizerSetup::positions
  // filled from the layout (each shard element's position in the model, ciuic/optimizer.h).
  // Assumes: params are leaf tensors on the run's device in the parameter dtype with
  // requires_grad, each listed once; the pointers outlive the Sharding. May move the parameters'
  // storage into its own buffers (param.set_data with a view: the model keeps the same tensor
  // objects) and register autograd hooks on them. Every rank must start from rank 0's values.
  // Main thread. Failure: ciuic::Error naming what does not fit (shapes, dtypes, memory).
  virtual void setup(const ShardingSetup& setup) = 0;

  // Micro-batch `index` of the step begins (0 first: no gradient of the previous step remains);
  // `last`: it is the step's last, after which finish_grads() comes. Gradients arriving at the
  // hooks are of sum(token losses) / global label tokens on each rank, so reductions across ranks
  // are a SUM, never an average. Main thread.
  virtual void begin_micro_batch(int64_t index, bool last) = 0;

  // Layer boundaries, announced by the model for each group of ShardingSetup::groups. Default:
  // nothing (ddp and zero2 keep every parameter whole on every rank).
  //   before_group(g, pass): the group's computation in `pass` is about to start. When it returns,
  //     the group's parameters must hold their current values (a parameter-sharding strategy
  //     gathers them here, or waits for a prefetch it started earlier).
  //   after_group(g, pass): the group's computation in `pass` is done. kForward/kRecompute: its
  //     parameters are not read again until the next before_group of the group (they may be
  //     released). kBackward: autograd has produced and accumulated the gradients of every
  //     parameter of the group whose gradient this backward computes (a strategy may
  //     reduce-scatter them now; for a parameter in several groups, only after the last).
  // Order, per micro-batch with autograd on: kForward boundaries for g = 0, 1, .., G-1, each
  // before..after; then kBackward for g = G-1 down to 0, each before..after, and within a
  // checkpointed layer's kBackward one kRecompute pair of the same g. The backward of group 0 (no
  // input that needs a gradient) ends when the whole backward ends. Evaluation and generation:
  // kForward pairs only (no_grad), any number of times, outside a step's micro-batches.
  // Threading: kForward on the main thread; kBackward and kRecompute on the thread autograd runs
  // backward on (the caller's for CPU; autograd's device thread for CUDA, where implementations
  // must only enqueue work on the current stream, as in the gradient hooks). Failure: ciuic::Error
  // (it propagates out of forward or backward and fails the step).
  virtual void before_group(int group, GroupPass pass);
  virtual void after_group(int group, GroupPass pass);

  // The last micro-batch's backward has returned: finishes every gradient reduction, hands the
  // last chunks to the optimizer and returns what the core needs for the norm (usually
  // Optimizer::finish_grads() and whether shards are disjoint). Called once per step, on every
  // rank (collectives inside are allowed). After it no gradient state of the step remains in the
  // Sharding: the next begin_micro_batch(0, ..) starts from zero whether update() comes or not.
  // Main thread. Failure: ciuic::Error; a Comm timeout propagates from Work::wait().
  virtual GradSquares finish_grads() = 0;

  // Applies the step the core decided (not called on a skipped step): calls
  // optimizer.step(args, params_out) with `args` exactly as given (grad_scale already holds the
  // clip coefficient over the loss scale) and this rank's shard of the parameters as params_out,
  // then makes the parameters every rank computes with current (ZeRO: all-gather the shards).
  // Main thread; every rank calls it. Failure: ciuic::Error; Comm timeouts propagate.
  virtual void update(const OptimizerStep& args) = 0;

  // Checkpoints (between steps, main thread, every rank). layout() describes this rank's shard;
  // save_state() returns the optimizer's state (1-D fp32 CPU tensors in layout() order,
  // Optimizer::save_state) plus anything else the plugin needs. load_state(fetch, t) rebuilds each
  // of the optimizer's state_names() for its shard from per-parameter slices (any world size wrote
  // them), hands them to the optimizer, and makes the parameters current through
  // Optimizer::write_params(params_out, t) — `t` is the last applied update's (0 before any); the
  // precision policy's state is already loaded. Failure: ciuic::Error naming the slice at fault.
  virtual std::vector<ShardSlice> layout() const = 0;
  virtual void save_state(StateDict& out) const = 0;
  virtual void load_state(const SliceFetcher& fetch, int64_t t) = 0;

  // What the Sharding holds now, for the core's set-up line and the `shard_*_gib` metrics. Any
  // thread; cheap. Default: nothing counted.
  virtual ShardingMemory memory() const;

  // API 8. true: this Sharding materialises only its share of the parameters, so the core must not
  // build the model whole. The core then creates every parameter without memory (shape, dtype,
  // device and requires_grad as usual; see ShardingSetup::params) and passes setup() the values
  // (ShardingSetup::values); setup() must give each parameter memory that holds its value (a view
  // of the plugin's buffers, param.set_data) or keep its storage without memory until the
  // plugin's own boundaries fill it, and must read no value of `params` itself. Asked once, on the
  // main thread, after the factory and before the model is built; must not depend on anything but
  // the plugin's options. Default: false (the model is built and initialised whole on each rank
  // before setup(), as ddp and zero2 need).
  virtual bool builds_parameters() const;

  // API 9. true: this Sharding shards the parameters themselves — each rank keeps only its shard of
  // them (the parameter dtype, the optimizer's params_out); a parameter has memory, gathered from
  // the shards, only between its groups' before_group() and after_group(), and its storage is
  // freed and refilled between them (zero3). The optimizer and the precision policy must then
  // accept sharded parameters (Optimizer::accepts_sharded_parameters(),
  // Precision::accepts_sharded_parameters(): the promises are listed there); the core asks them
  // and refuses the run at start with ciuic::UsageError (exit 2) naming the plugins, their recipe
  // keys and the fix when either says false. Asked once, on the main thread, after the factories
  // and before the model is built; must depend on nothing but the plugin's options. A strategy
  // whose builds_parameters() is true usually says true here too. Default: false (every rank
  // computes with whole parameters between steps, as in ddp and zero2).
  virtual bool shards_parameters() const;
};

}  // namespace ciuic
