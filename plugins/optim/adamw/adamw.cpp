// optimizer/adamw — the default optimizer: AdamW of the rank's shard on the run's own device
// (GPU memory on CUDA runs, host memory on CPU runs).
//
// The update is PyTorch's AdamW (decoupled weight decay), for parameter p, gradient g, step t:
//   p  <- p * (1 - lr * weight_decay)
//   m  <- beta1 * m + (1 - beta1) * g
//   v  <- beta2 * v + (1 - beta2) * g^2
//   p  <- p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// Two implementations, chosen by `kernel`:
//   "auto" (default): on CUDA devices the optim kit's FusedAdamWShard (ciuic/kit/fused_adamw.h):
//          the whole shard in one launch that also scales the gradient and writes the rounded
//          parameters, reading the gradient in bf16/fp16 when the sharding hands it over that way
//          once a step (one rank: the gradient shard then takes 2 bytes per element instead of 4);
//          elsewhere (CPU runs) as "aten";
//   "aten": ATen's at::_fused_adamw_ (CUDA: the multi-tensor kernel; CPU: ATen's vectorised,
//          threaded kernel), one call per weight-decay group on an fp32 gradient shard, then the
//          precision policy's rounding — the optim kit's ShardOptimizer and fused_adamw(), which
//          other optimizer plugins can reuse.
// Results match torch::optim::AdamW to ~1 ulp per step (ATen's kernel evaluates exp_avg as a
// lerp, torch::optim::AdamW as mul + add); tests/plugins/optimizer hold both to 1e-6 relative.
//
// State: master, exp_avg, exp_avg_sq (fp32) and the gradient shard (fp32, or bf16/fp16 as above):
// 14 to 16 bytes per shard element on the device.
#define CIUIC_PLUGIN_API 9
#include <memory>
#include <string>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/kit/adam_options.h>
#include <ciuic/kit/fused_adamw.h>
#include <ciuic/kit/shard_optimizer.h>
#include <ciuic/log.h>
#include <ciuic/plugin.h>

namespace {

constexpr ciuic::Option<std::string> kKernel{
    "kernel",
    "\"auto\"",
    "auto: on CUDA one fused launch over the shard (scale, update, rounding; bf16 gradients kept "
    "as they come with one rank), else ATen; aten: ATen's multi-tensor AdamW per group",
    NAN,
    NAN,
    "auto|aten"};
const ciuic::OptionSpec kOptions[] = {ciuic::kit::kAdamBetas, ciuic::kit::kAdamEps, kKernel};

class AdamW final : public ciuic::kit::ShardOptimizer {
 public:
  explicit AdamW(const ciuic::Config& cfg)
      : ShardOptimizer("optimizer adamw", {"exp_avg", "exp_avg_sq"}) {
    const ciuic::kit::AdamHyper h = ciuic::kit::adam_hyper(cfg);
    beta1_ = h.beta1;
    beta2_ = h.beta2;
    eps_ = h.eps;
    fused_ = cfg.get(kKernel) == "auto";
  }

  // Element-wise update; params_out written whole from the master weights, never read: zero3 too.
  bool accepts_sharded_parameters() const override { return true; }

 protected:
  void update(Group& g, double lr, double weight_decay, int64_t t) override {
    ciuic::kit::fused_adamw(g, lr, beta1_, beta2_, eps_, weight_decay, t);
  }

  bool takes_narrow_grads(at::ScalarType, const c10::Device& device) const override {
    return use_shard_kernel(device);
  }

  bool update_shard(at::Tensor& master, const at::Tensor& grad, std::vector<at::Tensor>& moments,
                    at::Tensor* params_out, const ciuic::OptimizerStep& args) override {
    if (!use_shard_kernel(shard().device)) return false;
    if (!kernel_) {
      kernel_ = std::make_unique<ciuic::kit::FusedAdamWShard>(shard().segments, shard().numel,
                                                              shard().device);
      ciuic::log_info("optimizer adamw: one fused launch over the shard (" +
                      std::to_string(kernel_->tiles()) + " tiles), gradient kept in " +
                      c10::toString(grad.scalar_type()) +
                      (params_out ? ", parameters rounded in the same pass" : ""));
    }
    ciuic::kit::FusedAdamWShard::Hyper h;
    h.lr = args.lr;
    h.beta1 = beta1_;
    h.beta2 = beta2_;
    h.eps = eps_;
    h.weight_decay = args.weight_decay;
    h.grad_scale = args.grad_scale;
    h.t = args.t;
    kernel_->step(master, grad, moments.at(0), moments.at(1), params_out, h);
    return true;
  }

 private:
  bool use_shard_kernel(const c10::Device& device) const {
    return fused_ && ciuic::kit::FusedAdamWShard::available(device);
  }
  double beta1_ = 0.9, beta2_ = 0.999, eps_ = 1e-8;
  bool fused_ = true;
  std::unique_ptr<ciuic::kit::FusedAdamWShard> kernel_;
};

void plan(const ciuic::Config& cfg, ciuic::PlanContext& p) {
  ciuic::kit::ShardOptimizer::plan_device_state(
      p, 2, "master weights + AdamW moments",
      /*narrow_grads_on_cuda=*/cfg.get(kKernel) == "auto");
}

}  // namespace

CIUIC_DEFINE_PLUGIN_PLANNED(
    ciuic::Slot::kOptimizer, "adamw", "1.0.0",
    "AdamW of the shard on the run's device (ATen's fused kernel)", kOptions,
    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* { return new AdamW(a.config); }, plan)
