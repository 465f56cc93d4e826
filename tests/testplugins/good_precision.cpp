// Test plugin precision/test: fp32, no loss scaling — ciuic::Precision's defaults.
#define CIUIC_PLUGIN_API 7
#include <ciuic/precision.h>

namespace {

class TestPrecision final : public ciuic::Precision {};

}  // namespace

CIUIC_DEFINE_PLUGIN_NO_OPTIONS(ciuic::Slot::kPrecision, "test", "0.1.0", "fp32 precision for tests",
                               [](const ciuic::PluginArgs&) -> ciuic::PluginObject* {
                                 return new TestPrecision();
                               })
