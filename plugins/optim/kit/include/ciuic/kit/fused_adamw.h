// ciuic/kit/fused_adamw.h — part of the optim kit (libciuic_optim_kit.a, not part of the SDK's
// ABI): AdamW over a whole flat fp32 shard in ONE CUDA launch, for optimizers built on
// ShardOptimizer (the in-tree `adamw` uses it on CUDA devices unless `kernel = "aten"`).
//
// What it does per element, in fp32: the gradient (fp32, bf16 or fp16 — a shard may keep its
// gradient in the training dtype, ciuic/kit/shard_optimizer.h) times grad_scale; decoupled weight
// decay on the segments marked for it; PyTorch's AdamW update of master and moments; and, when
// asked, the updated master rounded to nearest even into the model's parameters. ATen's path does
// the same in three passes over the shard (scale the gradient, the multi-tensor AdamW, the cast);
// here each value is read and written once. Results agree with torch::optim::AdamW to ~1 ulp per
// step (tests/plugins/optimizer, the CUDA cases).
//
// Ownership: holds a small device table of tiles (one per 65536 elements of a segment), built once
// from the shard's segments. Threading: step() enqueues on the current CUDA stream of the tensors'
// device and returns; one step() at a time per object. Failure: ciuic::Error for tensors that do
// not fit the shard (size, dtype, device, contiguity, 16-byte alignment) and for launch errors; the
// constructor throws ciuic::Error where available() is false.
#pragma once

#include <cstdint>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <ciuic/optimizer.h>

namespace ciuic::kit {

class FusedAdamWShard {
 public:
  // True when this build has the kernel (a CUDA build) and `device` is a CUDA device.
  static bool available(const c10::Device& device);

  FusedAdamWShard(const std::vector<ShardSegment>& segments, int64_t numel, c10::Device device);

  struct Hyper {
    double lr = 0, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0, grad_scale = 1;
    int64_t t = 1;  // 1-based count of applied updates (bias correction)
  };
  // master, exp_avg, exp_avg_sq: fp32; grad: fp32, bf16 or fp16; params_out: null, or fp32, bf16
  // or fp16 (written with the rounded master). Every tensor contiguous, numel elements, on the
  // device given at construction, its data 16-byte aligned.
  void step(at::Tensor& master, const at::Tensor& grad, at::Tensor& exp_avg, at::Tensor& exp_avg_sq,
            at::Tensor* params_out, const Hyper& h) const;

  int64_t numel() const { return numel_; }
  int64_t tiles() const { return num_tiles_; }

 private:
  at::Tensor tiles_;  // [num_tiles, 2] int64 on the device: begin, count | decay << 32
  int64_t numel_ = 0, num_tiles_ = 0;
  c10::Device device_;
};

}  // namespace ciuic::kit
