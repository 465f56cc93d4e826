// ciuic/kit/shard_optimizer.h — part of the optim kit (libciuic_optim_kit.a; a static library
// that optimizer plugins link, not part of the SDK's ABI): a skeleton for optimizers that keep
// their whole state on the run's device (GPU memory on CUDA runs, host memory on CPU runs), such
// as the in-tree `adamw`.
//
// ShardOptimizer implements the Optimizer protocol (ciuic/optimizer.h) except the arithmetic of
// the update:
//   - state: an fp32 master shard plus the moments the subclass names (zero at start), numel
//     elements each, on the run's device; checkpointed under "master" and those names;
//   - gradient sink: a gradient shard on the device; a region's first chunk of a step is copied
//     into it, later chunks added; when a region receives its last chunk, its sum of squares is
//     added to this step's total (fp32 within rows of 4096, fp64 across: ciuic/grad_norm.h), so
//     finish_grads() needs no pass over the shard. The shard is fp32, except when every region
//     gets one chunk a step (OptimizerSetup::one_chunk_per_step), the chunks are bf16 or fp16 and
//     the subclass's update_shard() takes such gradients (takes_narrow_grads()): then it keeps
//     them in their own dtype — the same values in half the memory (7B on one GPU: 13.8 GB);
//   - step(): update_shard() first, which a subclass may implement to update the whole shard in
//     one pass from the gradient as stored (scaling it by grad_scale on the fly) and to write the
//     rounded parameters itself when the precision policy rounds to nearest. Otherwise (the
//     default): the fp32 gradient shard is multiplied by grad_scale in place (it is the
//     optimizer's own), then update() is called once for the weight-decay group and once for the
//     rest, each with the views of every segment of that group; finally the precision policy
//     rounds the master into params_out.
//
// A subclass (AdamW, Lion, ...) passes its moment names to the constructor and implements
// update(), optionally update_shard() and takes_narrow_grads(). Memory: (1 + moments) x 4 bytes
// per shard element on the device plus the gradient shard (4 bytes, or 2 when kept narrow).
// Threading and failure: as ciuic/optimizer.h says; messages start with `who`.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ciuic/config.h>
#include <ciuic/optimizer.h>
#include <ciuic/plan.h>

namespace ciuic::kit {

class ShardOptimizer : public Optimizer {
 public:
  // Views of one weight-decay group: master[i], grad[i] and moments[k][i] are the same elements
  // (one segment of the shard). grad is fp32, already multiplied by grad_scale.
  struct Group {
    std::vector<at::Tensor> master, grad;
    std::vector<std::vector<at::Tensor>> moments;  // [moment index][segment]
    bool empty() const { return master.empty(); }
  };

  ShardOptimizer(std::string who, std::vector<std::string> moment_names);

  void setup(const OptimizerSetup& setup) final;
  void accumulate_grad(int region, const at::Tensor& chunk, bool first, bool last) final;
  at::Tensor finish_grads() final;
  void step(const OptimizerStep& args, at::Tensor& params_out) final;
  void write_params(at::Tensor& params_out, int64_t t) final;
  std::vector<std::string> state_names() const final;
  void save_state(StateDict& out) const override;
  void load_state(const StateDict& in) override;
  OptimizerMemory memory() const override;
  // optim_state_gib (master + moments + gradient shard), optim_step_s (host time of the last
  // step(); on a GPU the time to enqueue it).
  void append_metrics(Metrics& out) const override;

  // The planner's answer (ciuic/plan.h) for a ShardOptimizer with `moments` moments: master +
  // moments and the gradient shard, plan.shard_numel elements each, on the device.
  // `narrow_grads_on_cuda`: whether the subclass takes narrow gradients on CUDA devices (then a
  // sharding's one-chunk-per-step bf16/fp16 chunks are counted at their own size).
  static void plan_device_state(PlanContext& plan, int moments, const std::string& what,
                                bool narrow_grads_on_cuda = false);

 protected:
  // Updates one group in place (master and moments). `weight_decay` is 0 for the group without
  // weight decay; `t` the 1-based count of applied updates.
  virtual void update(Group& group, double lr, double weight_decay, int64_t t) = 0;
  // Optional: updates the whole shard in one call and returns true; false (the default) falls back
  // to update() per group. `grad` is the gradient shard as stored (fp32, or the chunks' narrow
  // dtype when takes_narrow_grads() said yes), NOT yet multiplied by args.grad_scale; `moments`
  // in the constructor's order; weight decay applies to shard().segments marked for it. When
  // `params_out` is not null (the precision policy rounds to nearest even), write the updated
  // master rounded to its dtype into it; otherwise the policy rounds afterwards.
  virtual bool update_shard(at::Tensor& master, const at::Tensor& grad,
                            std::vector<at::Tensor>& moments, at::Tensor* params_out,
                            const OptimizerStep& args);
  // Whether update_shard() takes a gradient of `dtype` (bf16 or fp16) on `device`. Default: no.
  virtual bool takes_narrow_grads(at::ScalarType dtype, const c10::Device& device) const;
  const std::string& who() const { return who_; }
  const OptimizerSetup& shard() const { return setup_; }

 private:
  void require_setup(const char* what) const;
  std::string who_;
  std::vector<std::string> moment_names_;
  bool ready_ = false;
  OptimizerSetup setup_;                 // without `initial` (not kept)
  std::vector<PositionSpan> positions_;  // of the whole shard, for round_to_param()
  at::Tensor master_, grad_, sum_sq_;
  std::vector<at::Tensor> moments_;
  double last_step_s_ = 0;
};

// PyTorch's AdamW (decoupled weight decay) on one group, through ATen's fused kernel
// (at::_fused_adamw_: CUDA's multi-tensor kernel, or ATen's vectorised CPU kernel): the update of
// the in-tree `adamw`, for optimizer plugins that want AdamW's arithmetic in their own skeleton.
// `group.moments` must hold exp_avg and exp_avg_sq, in that order.
void fused_adamw(ShardOptimizer::Group& group, double lr, double beta1, double beta2, double eps,
                 double weight_decay, int64_t t);

}  // namespace ciuic::kit
