// precision/bf16: bf16 parameters and compute, fp32 master weights (in the optimizer), gradients
// reduced in fp32 (default) or bf16. bf16 has fp32's exponent range, so no loss scaling.
//
// rounding = "stochastic": the fp32 master becomes bf16 by stochastic rounding — a uniform 16-bit
// number is added to the low half of the fp32 bit pattern and the low half dropped, so a value
// between two bf16 neighbours goes to the upper one with probability equal to its distance from
// the lower (unbiased: E[round(x)] = x). The 16 bits come from a counter-based hash of (run seed,
// update t, the element's global position; ciuic/precision.h), so the same update writes the same
// bits on every run, world size and shard layout, and a resumed run the bits the saved one had.
// Infinities and NaNs are converted as by round to nearest.
#define CIUIC_PLUGIN_API 9
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <ATen/ops/empty.h>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/error.h>
#include <ciuic/plan.h>
#include <ciuic/precision.h>

namespace {

constexpr ciuic::Option<std::string> kReduceDtype{
    "reduce_dtype",
    "\"fp32\"",
    "dtype gradients are reduced in across ranks: fp32 (exact sums, 2x the bytes) or bf16",
    NAN,
    NAN,
    "fp32|bf16"};
constexpr ciuic::Option<std::string> kRounding{
    "rounding",
    "\"nearest\"",
    "how fp32 master weights become bf16 parameters: nearest (round to nearest even) or stochastic "
    "(unbiased, "
    "deterministic from the run seed, the update and the element's position)",
    NAN,
    NAN,
    "nearest|stochastic"};
const ciuic::OptionSpec kOptions[] = {kReduceDtype, kRounding};

uint64_t mix64(uint64_t z) {  // splitmix64's finaliser
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// fp32 bits -> bf16 bits: round to nearest even, NaN kept quiet.
uint16_t nearest_bf16(uint32_t bits) {
  if ((bits & 0x7F800000u) == 0x7F800000u && (bits & 0x007FFFFFu) != 0)
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  return static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
}

class Bf16 final : public ciuic::Precision {
 public:
  Bf16(const ciuic::Config& cfg, const ciuic::RunContext& ctx)
      : reduce_(cfg.get(kReduceDtype) == "bf16" ? at::kBFloat16 : at::kFloat),
        stochastic_(cfg.get(kRounding) == "stochastic"),
        seed_(mix64(ctx.seed ^ 0x5DEECE66DULL)) {}
  at::ScalarType param_dtype() const override { return at::kBFloat16; }
  at::ScalarType reduce_dtype() const override { return reduce_; }
  bool rounds_to_nearest() const override { return !stochastic_; }
  // Each element from its value, t and global position, spans in any order: zero3's shards too.
  bool accepts_sharded_parameters() const override { return true; }

  void round_to_param(const at::Tensor& master, at::Tensor& out, int64_t t,
                      const std::vector<ciuic::PositionSpan>& positions) const override {
    if (!stochastic_) return ciuic::Precision::round_to_param(master, out, t, positions);
    if (master.scalar_type() != at::kFloat || out.scalar_type() != at::kBFloat16 ||
        master.numel() != out.numel() || !master.is_contiguous() || !out.is_contiguous())
      throw ciuic::Error(
          "precision bf16: round_to_param needs a contiguous fp32 master and a bf16 output of the "
          "same "
          "size");
    // On the host element by element; a device tensor makes the trip through host memory.
    const bool host = master.is_cpu() && out.is_cpu();
    const at::Tensor m = host ? master : master.cpu();
    at::Tensor o = host ? out : at::empty({out.numel()}, out.options().device(c10::kCPU));
    const auto* src = static_cast<const uint32_t*>(m.data_ptr());
    auto* dst = static_cast<uint16_t*>(o.data_ptr());
    const uint64_t key = mix64(seed_ + static_cast<uint64_t>(t) * 0x9E3779B97F4A7C15ULL);
    int64_t covered = 0;
    for (const ciuic::PositionSpan& span : positions) {
      if (span.offset != covered || span.offset + span.length > out.numel())
        throw ciuic::Error(
            "precision bf16: round_to_param positions do not cover the tensor in order");
      for (int64_t i = 0; i < span.length; ++i) {
        const uint32_t bits = src[span.offset + i];
        if (span.global < 0 || (bits & 0x7F800000u) == 0x7F800000u) {  // padding, inf, NaN
          dst[span.offset + i] = nearest_bf16(bits);
          continue;
        }
        const auto noise =
            static_cast<uint32_t>(mix64(key ^ static_cast<uint64_t>(span.global + i)) >> 48);
        // A carry into the exponent is the correct rounding up (to the next binade, or to inf from
        // the largest finite value, as the exact value then is within one bf16 step of it).
        dst[span.offset + i] = static_cast<uint16_t>((bits + noise) >> 16);
      }
      covered += span.length;
    }
    if (covered != out.numel())
      throw ciuic::Error("precision bf16: round_to_param positions cover " +
                         std::to_string(covered) + " of " + std::to_string(out.numel()) +
                         " elements");
    if (!host) out.copy_(o);
  }

 private:
  at::ScalarType reduce_;
  bool stochastic_;
  uint64_t seed_;
};

// The planner's answer: 2-byte parameters, reductions in fp32 or bf16.
void plan(const ciuic::Config& cfg, ciuic::PlanContext& p) {
  p.param_bytes = 2;
  p.reduce_bytes = cfg.get(kReduceDtype) == "bf16" ? 2 : 4;
}

}  // namespace

CIUIC_DEFINE_PLUGIN_PLANNED(
    ciuic::Slot::kPrecision, "bf16", "1.1.0",
    "bf16 parameters and compute, fp32 master weights, fp32 or bf16 reduction, "
    "round to nearest or stochastic rounding",
    kOptions,
    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
      return new Bf16(a.config, a.context);
    },
    plan)
