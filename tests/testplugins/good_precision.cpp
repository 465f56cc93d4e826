// Test plugin precision/test: fp32, no loss scaling.
#include <ciuic/precision.h>

namespace {

class TestPrecision final : public ciuic::Precision {
 public:
  at::ScalarType param_dtype() const override { return at::kFloat; }
  at::ScalarType reduce_dtype() const override { return at::kFloat; }
  double loss_scale() const override { return 1.0; }
  bool needs_overflow_check() const override { return false; }
  bool update(bool, int64_t) override { return false; }
  int64_t skipped_steps() const override { return 0; }
};

}  // namespace

CIUIC_DEFINE_PLUGIN_NO_OPTIONS(ciuic::Slot::kPrecision, "test", "0.1.0", "fp32 precision for tests",
                               [](const ciuic::PluginArgs&) -> ciuic::PluginObject* {
                                 return new TestPrecision();
                               })
