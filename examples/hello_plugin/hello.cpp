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
#define CIUIC_PLUGIN_API 7
#include <string>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/log.h>
#include <ciuic/plugin.h>
#include <ciuic/precision.h>

namespace {

// Options, declared once as typed handles: each is listed in kOptions (what the core validates the
// recipe section against) and read with config.get(handle), so a key is written in one place only.
// Arguments: key, default (a TOML literal; nullptr = required), help, min, max, choices.
constexpr ciuic::Option<std::string> kGreeting{"greeting", "\"hello\"",
                                               "printed once by rank 0 when the plugin is created"};
constexpr ciuic::Option<double> kLossScale{
    "loss_scale", "1.0", "static loss scale (gradients are unscaled again)", 1e-30, 1e30};
const ciuic::OptionSpec kOptions[] = {kGreeting, kLossScale};

// ciuic::Precision's defaults are fp32 with a loss scale of 1 that never skips a step: a policy
// overrides only what it changes.
class HelloPrecision final : public ciuic::Precision {
 public:
  HelloPrecision(const ciuic::Config& config, const ciuic::RunContext& context)
      : loss_scale_(config.get(kLossScale)) {
    // Options are validated by the core before the factory runs: reading a declared option never
    // fails. Checks the schema cannot express go through config.fail(), which names the recipe
    // file, line and column.
    const std::string greeting = config.get(kGreeting);
    if (greeting.empty()) config.fail(kGreeting.key(), "must not be empty");
    if (context.rank == 0)
      ciuic::log_info("precision/hello: " + greeting + " (static loss scale " +
                      std::to_string(loss_scale_) + ")");
  }

  // Never overflows in fp32, so no overflow check and never a skipped step (the defaults).
  double loss_scale() const override { return loss_scale_; }

 private:
  double loss_scale_;
};

}  // namespace

CIUIC_DEFINE_PLUGIN(ciuic::Slot::kPrecision, "hello", "1.0.0",
                    "fp32 with a static loss scale and a greeting", kOptions,
                    [](const ciuic::PluginArgs& args) -> ciuic::PluginObject* {
                      return new HelloPrecision(args.config, args.context);
                    })
