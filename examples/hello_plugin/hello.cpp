// precision/hello — a complete, minimal ciuic plugin (walked through in docs/plugins.md).
//
// An fp32 precision policy with a static loss scale: the loss is multiplied by `loss_scale`
// before backward and gradients are divided by it again, which never overflows in fp32 and so
// needs no overflow check. It also greets the user once, to show how a plugin reads its options
// and logs.
//
// Recipe:
//   [precision]
//   plugin = "hello"
//   greeting = "hi there"   # optional, default "hello"
//   loss_scale = 1024.0     # optional, default 1.0, must be > 0
#include <string>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/log.h>
#include <ciuic/plugin.h>
#include <ciuic/precision.h>

namespace {

class HelloPrecision final : public ciuic::Precision {
 public:
  HelloPrecision(const ciuic::Config& config, const ciuic::RunContext& context)
      : loss_scale_(config.get_float("loss_scale")) {
    // Options are validated by the core before the factory runs: get_*() of a declared key never
    // fails. Checks the schema cannot express go through config.fail(), which names the recipe
    // file, line and column.
    const std::string greeting = config.get_string("greeting");
    if (greeting.empty()) config.fail("greeting", "must not be empty");
    if (context.rank == 0)
      ciuic::log_info("precision/hello: " + greeting + " (static loss scale " + std::to_string(loss_scale_) + ")");
  }

  at::ScalarType param_dtype() const override { return at::kFloat; }
  at::ScalarType reduce_dtype() const override { return at::kFloat; }
  double loss_scale() const override { return loss_scale_; }
  bool needs_overflow_check() const override { return false; }
  bool update(bool /*found_inf*/, int64_t /*step*/) override { return false; }  // never skips
  int64_t skipped_steps() const override { return 0; }

 private:
  double loss_scale_;
};

// key, type, default (a TOML literal; nullptr = required), help, min, max, choices
const ciuic::OptionSpec kOptions[] = {
    {"greeting", ciuic::OptionType::kString, "\"hello\"", "printed once by rank 0 when the plugin is created"},
    {"loss_scale", ciuic::OptionType::kFloat, "1.0", "static loss scale (gradients are unscaled again)", 1e-30, 1e30},
};

}  // namespace

CIUIC_DEFINE_PLUGIN(ciuic::Slot::kPrecision, "hello", "1.0.0", "fp32 with a static loss scale and a greeting",
                    kOptions, [](const ciuic::PluginArgs& args) -> ciuic::PluginObject* {
                      return new HelloPrecision(args.config, args.context);
                    })
