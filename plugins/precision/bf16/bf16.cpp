// precision/bf16: bf16 parameters and compute, fp32 master weights (in the Offload), gradients
// reduced in fp32 (default) or bf16. bf16 has fp32's exponent range, so no loss scaling.
#include <string>

#include <ciuic/config.h>
#include <ciuic/plan.h>
#include <ciuic/precision.h>

namespace {

const ciuic::OptionSpec kOptions[] = {
    {"reduce_dtype", ciuic::OptionType::kString, "\"fp32\"",
     "dtype gradients are reduced in across ranks: fp32 (exact sums, 2x the bytes) or bf16", NAN,
     NAN, "fp32|bf16"},
};

class Bf16 final : public ciuic::Precision {
 public:
  explicit Bf16(const ciuic::Config& cfg)
      : reduce_(cfg.get_string("reduce_dtype") == "bf16" ? at::kBFloat16 : at::kFloat) {}
  at::ScalarType param_dtype() const override { return at::kBFloat16; }
  at::ScalarType reduce_dtype() const override { return reduce_; }
  double loss_scale() const override { return 1.0; }
  bool needs_overflow_check() const override { return false; }
  bool update(bool /*found_inf*/, int64_t /*step*/) override { return false; }
  int64_t skipped_steps() const override { return 0; }

 private:
  at::ScalarType reduce_;
};

// The planner's answer: 2-byte parameters, reductions in fp32 or bf16.
void plan(const ciuic::Config& cfg, ciuic::PlanContext& p) {
  p.param_bytes = 2;
  p.reduce_bytes = cfg.get_string("reduce_dtype") == "bf16" ? 2 : 4;
}

}  // namespace

CIUIC_DEFINE_PLUGIN_PLANNED(ciuic::Slot::kPrecision, "bf16", "1.0.0",
                            "bf16 parameters and compute, fp32 master weights, fp32 or bf16 reduction",
                            kOptions,
                            [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
                              return new Bf16(a.config);
                            },
                            plan)
