// precision/fp32: parameters, compute and reduction in fp32; no loss scaling — the defaults of
// ciuic::Precision, named as a plugin.
#define CIUIC_PLUGIN_API 9
#include <ciuic/config.h>
#include <ciuic/plan.h>
#include <ciuic/precision.h>

namespace {

class Fp32 final : public ciuic::Precision {
 public:
  // Round to nearest even, element by element, no state: any shard layout (zero3's included).
  bool accepts_sharded_parameters() const override { return true; }
};

// The planner's answer: 4-byte parameters and reductions (the planner's defaults, said here).
void plan(const ciuic::Config&, ciuic::PlanContext& p) {
  p.param_bytes = 4;
  p.reduce_bytes = 4;
}

}  // namespace

CIUIC_DEFINE_PLUGIN_NO_OPTIONS_PLANNED(
    ciuic::Slot::kPrecision, "fp32", "1.0.0", "fp32 parameters, compute and gradient reduction",
    [](const ciuic::PluginArgs&) -> ciuic::PluginObject* { return new Fp32(); }, plan)
