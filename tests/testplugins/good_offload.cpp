// Test plugin offload/test: constructs; its update is not meant to be called.
#include <ciuic/error.h>
#include <ciuic/offload.h>

namespace {

class TestOffload final : public ciuic::Offload {
 public:
  void setup(const ciuic::OffloadSetup&) override {}
  void step(const at::Tensor&, double, const ciuic::AdamWHyper&, int64_t, at::Tensor&) override {
    throw ciuic::Error("offload/test does not train");
  }
  void save_state(ciuic::StateDict&) const override {}
  void load_state(const ciuic::StateDict&) override {}
  ciuic::OffloadMemory memory() const override { return {}; }
};

}  // namespace

CIUIC_DEFINE_PLUGIN_NO_OPTIONS(ciuic::Slot::kOffload, "test", "0.1.0", "offload for tests",
                               [](const ciuic::PluginArgs&) -> ciuic::PluginObject* {
                                 return new TestOffload();
                               })
