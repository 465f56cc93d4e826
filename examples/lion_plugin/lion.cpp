// optimizer/lion — Lion (Chen et al., "Symbolic Discovery of Optimization Algorithms", 2023,
// Algorithm 2), written against the installed SDK and the optim kit. Memory-light: one moment per
// element instead of AdamW's two (12 bytes per shard element with the master weights and the
// gradient, against AdamW's 16). For parameter p, gradient g, momentum m:
//   c <- beta1 * m + (1 - beta1) * g
//   p <- p * (1 - lr * weight_decay) - lr * sign(c)
//   m <- beta2 * m + (1 - beta2) * g
// ShardOptimizer (ciuic/kit/shard_optimizer.h) does everything but this arithmetic: state on the
// device, the gradient sink and its squares for the norm, checkpoints, rounding through the
// precision policy.
//
// Plugin API 9: Lion updates each element from its own moment and gradient and the kit writes
// params_out whole from the master weights, so it says it accepts sharded parameters (zero3;
// ciuic/optimizer.h lists the promises, ciuic-plugin-check checks them).
#define CIUIC_PLUGIN_API 9
#include <vector>

#include <ATen/ops/lerp.h>

#include <ciuic/config.h>
#include <ciuic/kit/shard_optimizer.h>
#include <ciuic/plugin.h>

namespace {

constexpr ciuic::Option<std::vector<double>> kBetas{
    "betas", "[0.9, 0.99]",
    "Lion beta1 (interpolation for the update), beta2 (momentum decay); each in [0, 1)", 0.0, 1.0};
const ciuic::OptionSpec kOptions[] = {kBetas};

class Lion final : public ciuic::kit::ShardOptimizer {
 public:
  explicit Lion(const ciuic::Config& cfg) : ShardOptimizer("optimizer lion", {"exp_avg"}) {
    const auto betas = cfg.get(kBetas);
    if (betas.size() != 2 || betas[0] >= 1.0 || betas[1] >= 1.0)
      cfg.fail(kBetas.key(), "expected two numbers [beta1, beta2], each in [0, 1)");
    beta1_ = betas[0];
    beta2_ = betas[1];
  }

  bool accepts_sharded_parameters() const override { return true; }

 protected:
  void update(Group& g, double lr, double weight_decay, int64_t /*t*/) override {
    for (size_t i = 0; i < g.master.size(); ++i) {
      at::Tensor& p = g.master[i];
      const at::Tensor& grad = g.grad[i];
      at::Tensor& m = g.moments[0][i];
      at::Tensor c = at::lerp(grad, m, beta1_);  // grad + beta1 * (m - grad)
      if (weight_decay != 0.0) p.mul_(1.0 - lr * weight_decay);
      p.add_(c.sign_(), -lr);
      m.lerp_(grad, 1.0 - beta2_);  // m + (1 - beta2) * (grad - m)
    }
  }

 private:
  double beta1_ = 0.9, beta2_ = 0.99;
};

void plan(const ciuic::Config&, ciuic::PlanContext& p) {
  ciuic::kit::ShardOptimizer::plan_device_state(p, /*moments=*/1, "master weights + Lion momentum");
}

}  // namespace

CIUIC_DEFINE_PLUGIN_PLANNED(
    ciuic::Slot::kOptimizer, "lion", "1.0.0",
    "Lion (sign of interpolated momentum; one moment per element): an "
    "out-of-tree example on the optim kit",
    kOptions, [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* { return new Lion(a.config); },
    plan)
