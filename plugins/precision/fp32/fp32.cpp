// precision/fp32: parameters, compute and reduction in fp32; no loss scaling.
#include <ciuic/config.h>
#include <ciuic/plan.h>
#include <ciuic/precision.h>

namespace {

class Fp32 final : public ciuic::Precision {
 public:
  at::ScalarType param_dtype() const override { return at::kFloat; }
  at::ScalarType reduce_dtype() const override { return at::kFloat; }
  double loss_scale() const override { return 1.0; }
  bool needs_overflow_check() const override { return false; }
  bool update(bool /*found_inf*/, int64_t /*step*/) override { return false; }
  int64_t skipped_steps() const override { return 0; }
};

// The planner's answer: 4-byte parameters and reductions (the planner's defaults, said here).
void plan(const ciuic::Config&, ciuic::PlanContext& p) {
  p.param_bytes = 4;
  p.reduce_bytes = 4;
}

}  // namespace

CIUIC_DEFINE_PLUGIN_NO_OPTIONS_PLANNED(ciuic::Slot::kPrecision, "fp32", "1.0.0",
                                       "fp32 parameters, compute and gradient reduction",
                                       [](const ciuic::PluginArgs&) -> ciuic::PluginObject* {
                                         return new Fp32();
                                       },
                                       plan)
