// Test plugin sharding/test: constructs; its training methods are not meant to be called.
#include <ciuic/error.h>
#include <ciuic/sharding.h>

namespace {

class TestSharding final : public ciuic::Sharding {
 public:
  void setup(const ciuic::ShardingSetup&) override {}
  void begin_micro_batch(int64_t, bool) override {}
  ciuic::StepResult step(const ciuic::StepInput&) override {
    throw ciuic::Error("sharding/test does not train");
  }
  ciuic::ShardingMemory memory() const override { return {}; }
  std::vector<ciuic::ShardSlice> layout() const override { return {}; }
  void save_state(ciuic::StateDict&) const override {}
  void load_state(const ciuic::SliceFetcher&) override {}
};

}  // namespace

CIUIC_DEFINE_PLUGIN_NO_OPTIONS(ciuic::Slot::kSharding, "test", "0.1.0", "sharding for tests",
                               [](const ciuic::PluginArgs&) -> ciuic::PluginObject* {
                                 return new TestSharding();
                               })
