// precision/fp16: fp16 parameters and compute, fp32 master weights, dynamic loss scaling with
// DeepSpeed's knobs and meaning (runtime/fp16/loss_scaler.py, DynamicLossScaler):
//
//   scale starts at 2^initial_scale_power.
//   On an overflowed step (always skipped): if the hysteresis budget is down to 1, the scale is
//   halved (never below min_loss_scale; an overflow AT the minimum stops the run); otherwise the
//   budget is decremented and the scale kept.
//   On a good step: with consecutive_hysteresis the budget is refilled; every loss_scale_window
//   iterations since the last overflow the scale doubles (and, without consecutive_hysteresis, the
//   budget is refilled then).
//   loss_scale > 0 selects a static scale instead (overflowed steps are still skipped).
#define CIUIC_PLUGIN_API 9
#include <algorithm>
#include <cmath>
#include <string>

#include <ATen/ops/scalar_tensor.h>

#include <ciuic/config.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <ciuic/plan.h>
#include <ciuic/precision.h>

namespace {

constexpr ciuic::Option<int64_t> kInitialScalePower{
    "initial_scale_power", "16", "dynamic scaling starts at 2^initial_scale_power", 0, 64};
constexpr ciuic::Option<int64_t> kLossScaleWindow{
    "loss_scale_window", "1000",
    "good iterations since the last overflow after which the scale doubles", 1, NAN};
constexpr ciuic::Option<int64_t> kHysteresis{
    "hysteresis", "2",
    "overflows tolerated (skipped without lowering the scale) before the scale is halved", 1, NAN};
constexpr ciuic::Option<bool> kConsecutiveHysteresis{
    "consecutive_hysteresis", "false",
    "refill the hysteresis budget after every good step (else only when the scale grows)"};
constexpr ciuic::Option<double> kMinLossScale{
    "min_loss_scale", "1.0",
    "the scale never goes below this; an overflow at this scale stops the run", 0x1p-24, NAN};
constexpr ciuic::Option<double> kLossScale{
    "loss_scale", "0.0", "static loss scale; 0 selects dynamic scaling", 0.0, NAN};
constexpr ciuic::Option<std::string> kReduceDtype{
    "reduce_dtype",
    "\"fp32\"",
    "dtype gradients are reduced in across ranks: fp32 or fp16",
    NAN,
    NAN,
    "fp32|fp16"};
const ciuic::OptionSpec kOptions[] = {
    kInitialScalePower, kLossScaleWindow, kHysteresis, kConsecutiveHysteresis,
    kMinLossScale,      kLossScale,       kReduceDtype};

class Fp16 final : public ciuic::Precision {
 public:
  explicit Fp16(const ciuic::Config& cfg)
      : dynamic_(cfg.get(kLossScale) == 0.0),
        window_(cfg.get(kLossScaleWindow)),
        hysteresis_(cfg.get(kHysteresis)),
        consecutive_hysteresis_(cfg.get(kConsecutiveHysteresis)),
        min_scale_(cfg.get(kMinLossScale)),
        reduce_(cfg.get(kReduceDtype) == "fp16" ? at::kHalf : at::kFloat) {
    scale_ = dynamic_ ? std::ldexp(1.0, static_cast<int>(cfg.get(kInitialScalePower)))
                      : cfg.get(kLossScale);
    if (dynamic_ && scale_ < min_scale_)
      cfg.fail(kInitialScalePower.key(),
               "2^initial_scale_power = " + std::to_string(scale_) +
                   " is below min_loss_scale = " + std::to_string(min_scale_));
    cur_hysteresis_ = hysteresis_;
  }

  at::ScalarType param_dtype() const override { return at::kHalf; }
  at::ScalarType reduce_dtype() const override { return reduce_; }
  double loss_scale() const override { return scale_; }
  bool needs_overflow_check() const override { return true; }
  // Rounds to nearest element by element; the scale is one number for the model: any shard layout.
  bool accepts_sharded_parameters() const override { return true; }

  bool update(bool found_inf, int64_t step) override {
    if (!dynamic_) {
      if (found_inf) ++skipped_;
      return found_inf;
    }
    if (found_inf) {
      if (cur_hysteresis_ <= 1) {
        if (scale_ <= min_scale_)
          throw ciuic::Error(
              "fp16: gradients overflowed at step " + std::to_string(step) +
              " with the loss scale already at its minimum (min_loss_scale = " +
              std::to_string(min_scale_) +
              "); training cannot continue. Lower the learning rate, check the data, or use "
              "[precision] plugin = \"bf16\"");
        const double next = std::max(scale_ / 2.0, min_scale_);
        ciuic::log_info("fp16: overflow at step " + std::to_string(step) +
                        ", step skipped; loss scale " + std::to_string(scale_) + " -> " +
                        std::to_string(next));
        scale_ = next;
      } else {
        --cur_hysteresis_;
        ciuic::log_info("fp16: overflow at step " + std::to_string(step) +
                        ", step skipped; loss scale kept at " + std::to_string(scale_) +
                        " (hysteresis left " + std::to_string(cur_hysteresis_) + ")");
      }
      last_overflow_iter_ = cur_iter_;
      ++skipped_;
    } else {
      if (consecutive_hysteresis_) cur_hysteresis_ = hysteresis_;
      if ((cur_iter_ - last_overflow_iter_) % window_ == 0) {
        if (!consecutive_hysteresis_) cur_hysteresis_ = hysteresis_;
        scale_ *= 2.0;
      }
    }
    ++cur_iter_;
    return found_inf;
  }

  void save_state(ciuic::StateDict& out) const override {
    auto f64 = [](double v) { return at::scalar_tensor(v, at::kDouble); };
    auto i64 = [](int64_t v) { return at::scalar_tensor(v, at::kLong); };
    out.emplace_back("loss_scale", f64(scale_));
    out.emplace_back("cur_hysteresis", i64(cur_hysteresis_));
    out.emplace_back("cur_iter", i64(cur_iter_));
    out.emplace_back("last_overflow_iter", i64(last_overflow_iter_));
    out.emplace_back("skipped", i64(skipped_));
  }

  void load_state(const ciuic::StateDict& in) override {
    auto get = [&](const char* k) {
      at::Tensor t = ciuic::state_get(in, k);
      if (!t.defined())
        throw ciuic::Error(std::string("fp16: checkpoint lacks loss-scaler state '") + k + "'");
      return t;
    };
    scale_ = get("loss_scale").item<double>();
    cur_hysteresis_ = get("cur_hysteresis").item<int64_t>();
    cur_iter_ = get("cur_iter").item<int64_t>();
    last_overflow_iter_ = get("last_overflow_iter").item<int64_t>();
    skipped_ = get("skipped").item<int64_t>();
  }

  void append_metrics(ciuic::Metrics& m) const override {
    m.set("loss_scale", scale_);
    m.set("skipped_total", static_cast<double>(skipped_));
  }

 private:
  const bool dynamic_;
  const int64_t window_;
  const int64_t hysteresis_;
  const bool consecutive_hysteresis_;
  const double min_scale_;
  const at::ScalarType reduce_;
  double scale_ = 1.0;
  int64_t cur_hysteresis_ = 1;
  int64_t cur_iter_ = 0;
  int64_t last_overflow_iter_ = -1;
  int64_t skipped_ = 0;
};

// The planner's answer: 2-byte parameters, reductions in fp32 or fp16.
void plan(const ciuic::Config& cfg, ciuic::PlanContext& p) {
  p.param_bytes = 2;
  p.reduce_bytes = cfg.get(kReduceDtype) == "fp16" ? 2 : 4;
}

}  // namespace

CIUIC_DEFINE_PLUGIN_PLANNED(
    ciuic::Slot::kPrecision, "fp16", "1.0.0",
    "fp16 parameters and compute, fp32 master weights, dynamic loss scaling", kOptions,
    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* { return new Fp16(a.config); }, plan)
