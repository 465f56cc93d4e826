// optimizer/adamw — the default optimizer: AdamW of the rank's shard on the run's own device
// (GPU memory on CUDA runs, host memory on CPU runs).
//
// The update is PyTorch's AdamW (decoupled weight decay), for parameter p, gradient g, step t:
//   p  <- p * (1 - lr * weight_decay)
//   m  <- beta1 * m + (1 - beta1) * g
//   v  <- beta2 * v + (1 - beta2) * g^2
//   p  <- p - lr * (m / (1 - beta1^t)) / (sqrt(v / (1 - beta2^t)) + eps)
// through ATen's fused kernel at::_fused_adamw_ (CUDA: the multi-tensor kernel; CPU: ATen's
// vectorised, threaded kernel), one call per weight-decay group: the optim kit's ShardOptimizer
// and fused_adamw(), which other optimizer plugins can reuse.
// Results match torch::optim::AdamW to ~1 ulp per step (the fused kernel evaluates exp_avg as a
// lerp, torch::optim::AdamW as mul + add); tests/plugins/optimizer hold them to 1e-6 relative.
//
// State: master, exp_avg, exp_avg_sq (fp32) and the fp32 gradient shard: 16 bytes per shard
// element on the device.
#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/kit/shard_optimizer.h>
#include <ciuic/plugin.h>

namespace {

const ciuic::OptionSpec kOptions[] = {
    {"betas", ciuic::OptionType::kFloatList, "[0.9, 0.999]", "AdamW beta1, beta2 (each in [0, 1))",
     0.0, 1.0},
    {"eps", ciuic::OptionType::kFloat, "1e-8", "AdamW epsilon (added to sqrt(v))", 0.0, NAN},
};

class AdamW final : public ciuic::ShardOptimizer {
 public:
  explicit AdamW(const ciuic::Config& cfg)
      : ShardOptimizer("optimizer adamw", {"exp_avg", "exp_avg_sq"}) {
    const auto betas = cfg.get_float_list("betas");
    if (betas.size() != 2 || betas[0] >= 1.0 || betas[1] >= 1.0)
      cfg.fail("betas", "expected two numbers [beta1, beta2], each in [0, 1)");
    beta1_ = betas[0];
    beta2_ = betas[1];
    eps_ = cfg.get_float("eps");
  }

 protected:
  void update(Group& g, double lr, double weight_decay, int64_t t) override {
    ciuic::fused_adamw(g, lr, beta1_, beta2_, eps_, weight_decay, t);
  }

 private:
  double beta1_ = 0.9, beta2_ = 0.999, eps_ = 1e-8;
};

void plan(const ciuic::Config&, ciuic::PlanContext& p) {
  ciuic::ShardOptimizer::plan_device_state(p, 2, "master weights + AdamW moments");
}

}  // namespace

CIUIC_DEFINE_PLUGIN_PLANNED(ciuic::Slot::kOptimizer, "adamw", "1.0.0",
                            "AdamW of the shard on the run's device (ATen's fused kernel)",
                            kOptions,
                            [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
                              return new AdamW(a.config);
                            },
                            plan)
