// The core's default Offload: AdamW of the rank's flat fp32 shard on the run's own device, used
// when the recipe names no [offload] plugin.
//
// State: fp32 master weights, exp_avg and exp_avg_sq of the shard, each `numel` elements on
// OffloadSetup::device (GPU memory on CUDA runs, host memory on CPU runs).
//
// step() is PyTorch's AdamW (ciuic/optim.h) through ATen's fused kernel at::_fused_adamw_
// (CUDA: the multi-tensor kernel; CPU: ATen's vectorised, at::parallel_for-threaded kernel — as
// fast as a hand-written loop of the same arithmetic, see docs/performance/optim.md). The
// weight-decay and no-decay segments of the shard form two tensor lists, so a step is one fused
// call per group. A gradient that is not fp32, or a grad_scale other than 1, is first converted /
// multiplied (g * grad_scale in fp32, as the reference does) into a bounded fp32 scratch buffer,
// chunk by chunk, so that the caller's gradient is never written. The updated master is then
// copied into params_out in the parameter dtype; ATen's float->bf16/fp16 conversion rounds to
// nearest even (checked by tests/optim).
//
// Results match torch::optim::AdamW to ~1 ulp per step (the fused kernel evaluates exp_avg as a
// lerp, torch::optim::AdamW as mul + add); tests hold them to 1e-6 relative over 20 steps.
//
// memory(): device_bytes = master + moments + scratch on the run's device (for a CPU run that
// "device" is host memory); host_bytes = 0.
//
// Threading: main thread only (see ciuic/offload.h). Failure: ciuic::Error naming what was wrong
// (shape, dtype, device, segment layout, missing state key).
#pragma once

#include <memory>

#include <ciuic/offload.h>

namespace ciuic::optim {

CIUIC_API std::unique_ptr<Offload> make_device_adamw();

}  // namespace ciuic::optim
