// Test plugin optimizer/test: constructs; its update is not meant to be called. It answers the
// memory planner with one item of a size the tests know (7 bytes per shard element, on the
// device), so that --plan shows a third-party plugin planned from its own answer.
#define CIUIC_PLUGIN_API 7
#include <ciuic/error.h>
#include <ciuic/optimizer.h>
#include <ciuic/plan.h>

namespace {

class TestOptimizer final : public ciuic::Optimizer {
 public:
  void setup(const ciuic::OptimizerSetup&) override {}
  void accumulate_grad(int, const at::Tensor&, bool, bool) override {}
  at::Tensor finish_grads() override { throw ciuic::Error("optimizer/test does not train"); }
  void step(const ciuic::OptimizerStep&, at::Tensor&) override {
    throw ciuic::Error("optimizer/test does not train");
  }
  void write_params(at::Tensor&, int64_t) override {}
  std::vector<std::string> state_names() const override { return {"master"}; }
  void save_state(ciuic::StateDict&) const override {}
  void load_state(const ciuic::StateDict&) override {}
};

void plan(const ciuic::Config&, ciuic::PlanContext& p) {
  p.add("test optimizer state", true, 7.0 * static_cast<double>(p.shard_numel),
        "7 bytes per shard element");
}

}  // namespace

CIUIC_DEFINE_PLUGIN_NO_OPTIONS_PLANNED(
    ciuic::Slot::kOptimizer, "test", "0.1.0", "optimizer for tests",
    [](const ciuic::PluginArgs&) -> ciuic::PluginObject* { return new TestOptimizer(); }, plan)
