// ciuic/offload.h — where and how the optimizer update of one flat fp32 shard runs
// ([offload] plugin = "cpu_adam"; without an [offload] plugin the core's device AdamW is used).
//
// An Offload owns, for the calling rank, the fp32 master copy of its parameter shard and the
// AdamW moments (m, v), and turns a gradient shard into updated parameters:
//
//   setup(numel, segments, master_init, ...)        once, after the Sharding laid out its shard
//   grad_ready(offset, grad)  (optional, repeated)  a region of the final gradient shard is ready
//   step(grad, grad_scale, hyper, t, params_out)    once per non-skipped optimizer step
//
// Shapes: every shard tensor is 1-D with `numel` elements. `grad` is on the run's device in the
// reduce dtype or fp32; `grad_scale` multiplies it before use (loss-scale inverse times the
// clipping coefficient). `params_out` is the device shard in the parameter dtype: step() writes
// the updated master weights rounded to that dtype (round-to-nearest-even) into it. When step()
// returns, params_out is complete as seen by the current stream (CUDA) / the caller (CPU).
//
// Threading: all calls on the main thread; implementations may use their own worker threads and
// streams internally but must have finished using `grad` when step() returns.
// Failure: throws ciuic::Error (e.g. pinned allocation failed: names the bytes asked for).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ciuic/optim.h>
#include <ciuic/plugin.h>
#include <ciuic/state.h>

namespace ciuic {

// Elements [begin, end) of the shard, and whether weight decay applies to them.
struct ShardSegment {
  int64_t begin = 0;
  int64_t end = 0;
  bool weight_decay = true;
};

struct OffloadSetup {
  int64_t numel = 0;
  // Covers [0, numel) in order, without gaps (padding is a segment without weight decay).
  std::vector<ShardSegment> segments;
  // Initial master weights: fp32, 1-D, numel elements, any device. Copied; not kept.
  at::Tensor master_init;
  at::ScalarType param_dtype = at::kFloat;
  c10::Device device{c10::kCPU};  // where grad and params_out live
};

struct OffloadMemory {
  uint64_t host_bytes = 0;    // master + moments + staging in host memory
  uint64_t device_bytes = 0;  // same, on the device
};

class CIUIC_API Offload : public PluginObject {
 public:
  virtual void setup(const OffloadSetup& setup) = 0;
  // Optional early notice that grad[offset, offset + region.numel()) is final for this step, so
  // device->host copies can start while backward still runs. `region` stays valid and unchanged
  // until step() returns. Default: ignored.
  virtual void grad_ready(int64_t offset, const at::Tensor& region);
  virtual void step(const at::Tensor& grad, double grad_scale, const AdamWHyper& hyper,
                    int64_t t, at::Tensor& params_out) = 0;
  // Where step() wants `grad` when the run is on a GPU: false (default) = on the device; true =
  // in host memory (a CPU offload: the Sharding then accumulates its reduced gradient shard in
  // pinned host memory and no full-size fp32 gradient shard occupies the device). On CPU runs
  // both are host memory.
  virtual bool wants_host_grad() const;

  // State as 1-D fp32 CPU tensors of numel elements: "master", "exp_avg", "exp_avg_sq".
  virtual void save_state(StateDict& out) const = 0;
  virtual void load_state(const StateDict& in) = 0;
  virtual OffloadMemory memory() const = 0;
};

// Checks shared by every Offload implementation (the core's and plugins'). Each throws
// ciuic::Error whose message starts with `who` (e.g. "offload cpu_adam") and names what is wrong.
//
// setup: numel >= 0; segments cover [0, numel) in order without gaps or overlaps; master_init a
// defined fp32 tensor of numel elements; param_dtype fp32, bf16 or fp16.
CIUIC_API void check_offload_setup(const OffloadSetup& setup, std::string_view who);
// step() arguments against what setup() received: grad of numel elements on `device` or in
// host memory (see wants_host_grad()), fp32/bf16/fp16, contiguous; params_out of numel elements, `param_dtype`, on `device`,
// contiguous; finite grad_scale > 0; t >= 1.
CIUIC_API void check_offload_step(int64_t numel, c10::Device device, at::ScalarType param_dtype,
                                  const at::Tensor& grad, double grad_scale, int64_t t,
                                  const at::Tensor& params_out, std::string_view who);
// load_state(): state[key] as a 1-D fp32 tensor of numel elements.
CIUIC_API at::Tensor offload_state_tensor(const StateDict& state, const std::string& key,
                                          int64_t numel, std::string_view who);

}  // namespace ciuic
