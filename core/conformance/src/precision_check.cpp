// check_precision (ciuic/testing/conformance.h): the loss-scale and skip rules of
// ciuic/precision.h, observed through loss_scale() and update() alone, and a restored policy
// against the original.
#include <cmath>
#include <memory>
#include <random>
#include <string>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <ciuic/error.h>
#include <ciuic/precision.h>
#include <ciuic/store.h>
#include <ciuic/testing/conformance.h>

#include "support.h"

namespace ciuic::conformance {
namespace {

constexpr int64_t kMaxWindow = 100000;  // finite steps searched for a growth of the scale

struct Policy {
  RunContext ctx;
  std::shared_ptr<PluginObject> obj;
  Precision* p = nullptr;
};

std::unique_ptr<Policy> make(const PluginUnderTest& plugin, const Config& cfg,
                             const std::string& dir) {
  auto s = std::make_unique<Policy>();
  s->ctx = make_context(0, 1, make_local_store(std::chrono::seconds(10)), c10::Device(c10::kCPU),
                        dir, 1);
  s->obj = plugin.create(cfg, s->ctx);
  s->p = dynamic_cast<Precision*>(s->obj.get());
  if (!s->p) throw Error("the plugin's factory made no ciuic::Precision");
  return s;
}

// update() with the scale rules every policy keeps: a finite step is never skipped, an overflow
// never raises the scale, and the scale is positive and finite.
bool update(Precision& p, bool found_inf, int64_t step) {
  const double before = p.loss_scale();
  const bool skip = p.update(found_inf, step);
  const double after = p.loss_scale();
  EXPECT_FALSE(!found_inf && skip) << "step " << step << ": a finite step was skipped";
  EXPECT_FALSE(found_inf && after > before)
      << "step " << step << ": an overflow raised the scale from " << before << " to " << after;
  EXPECT_TRUE(std::isfinite(after) && after > 0) << "step " << step << ": loss_scale() = " << after;
  EXPECT_EQ(p.loss_scale(), after) << "loss_scale() changed outside update()";
  return skip;
}

// Finite steps from `step` on until the scale grows; the count, or 0 after kMaxWindow.
int64_t steps_to_growth(Precision& p, int64_t& step) {
  const double s = p.loss_scale();
  for (int64_t n = 1; n <= kMaxWindow; ++n) {
    update(p, false, step++);
    if (p.loss_scale() != s) return n;
  }
  return 0;
}

// round_to_param's contract (ciuic/precision.h): out in param_dtype(); the same bits for the same
// (master, t, positions) however the elements are cut into calls and shards; rounds_to_nearest()
// promises round-to-nearest-even (what ATen's conversion does). A rounding with noise must also be
// unbiased: the mean over many updates t of the rounded value of a fixed x lies within a few
// standard errors of x (not of x's nearest neighbour).
void check_rounding(const Precision& p) {
  constexpr int64_t kN = 4096;
  constexpr int64_t kGlobal = 1000003;  // where this "shard" sits in the model
  const at::ScalarType pd = p.param_dtype();
  auto gen = at::make_generator<at::CPUGeneratorImpl>(77);
  const at::Tensor master = at::randn({kN}, gen, at::TensorOptions().dtype(at::kFloat)) * 0.05;
  auto round = [&](const at::Tensor& m, int64_t t, const std::vector<PositionSpan>& pos) {
    at::Tensor out = at::empty({m.numel()}, at::TensorOptions().dtype(pd));
    p.round_to_param(m, out, t, pos);
    return out;
  };
  const at::Tensor whole = round(master, 5, {{0, kN, kGlobal}});
  ASSERT_EQ(whole.scalar_type(), pd);
  // Cut into two calls, the second half first, and into spans of another layout: the same bits.
  const int64_t half = 1531;
  const at::Tensor b =
      round(master.narrow(0, half, kN - half).contiguous(), 5, {{0, kN - half, kGlobal + half}});
  const at::Tensor a = round(master.narrow(0, 0, half).contiguous(), 5, {{0, half, kGlobal}});
  EXPECT_TRUE(at::cat({a, b}).equal(whole))
      << "round_to_param gives other bits when the elements come in two calls "
         "(the same global positions, the same t): the noise must be a function "
         "of (seed, t, global position), ciuic/precision.h";
  const at::Tensor spans = round(master, 5, {{0, 100, kGlobal}, {100, kN - 100, kGlobal + 100}});
  EXPECT_TRUE(spans.equal(whole))
      << "round_to_param gives other bits for the same positions in two spans";
  // accepts_sharded_parameters() (ciuic/precision.h, API 9): spans whose global positions do not
  // ascend, with padding between, as a parameter-sharding plugin's shard has them (zero3: small
  // persistent parameters after the layers) — the same bits at the same positions.
  if (p.accepts_sharded_parameters()) {
    const int64_t pad = 64;
    const at::Tensor shuffled =
        at::cat({master.narrow(0, 3000, kN - 3000), at::zeros({pad}, at::kFloat),
                 master.narrow(0, 0, 1000), master.narrow(0, 1000, 2000)});
    const at::Tensor r = round(shuffled, 5,
                               {{0, kN - 3000, kGlobal + 3000},
                                {kN - 3000, pad, -1},
                                {kN - 3000 + pad, 1000, kGlobal},
                                {kN - 2000 + pad, 2000, kGlobal + 1000}});
    const at::Tensor back =
        at::cat({r.narrow(0, kN - 3000 + pad, 3000), r.narrow(0, 0, kN - 3000)});
    EXPECT_TRUE(back.equal(whole))
        << "round_to_param gives other bits when the spans' global positions do not ascend (a "
           "shard laid out by a parameter-sharding plugin), yet accepts_sharded_parameters() is "
           "true";
  }
  if (pd == at::kFloat) {
    EXPECT_TRUE(whole.equal(master))
        << "param_dtype() is fp32 but round_to_param changed the values";
    return;
  }
  if (p.rounds_to_nearest()) {
    EXPECT_TRUE(whole.equal(master.to(pd)))
        << "rounds_to_nearest() is true, but round_to_param is not round to nearest "
           "even (ATen's conversion)";
    return;
  }
  // Noise: unbiased over t, and it depends on t.
  const at::Tensor m64 = master.to(at::kDouble);
  at::Tensor sum = at::zeros({kN}, at::kDouble);
  constexpr int kDraws = 400;
  bool varies = false;
  for (int t = 1; t <= kDraws; ++t) {
    const at::Tensor r = round(master, t, {{0, kN, kGlobal}});
    varies = varies || !r.equal(whole);
    sum += r.to(at::kDouble);
  }
  EXPECT_TRUE(varies)
      << "rounds_to_nearest() is false, yet round_to_param gives the same bits for 400 updates t";
  // Per element, a rounding between neighbours lo < x < hi has variance <= (hi - lo)^2 / 4; the
  // bound is 6 standard errors, the mean over all elements of the bias well within it.
  const at::Tensor ulp = (master.to(pd).to(at::kDouble) - m64).abs() * 2 +
                         m64.abs() * (pd == at::kBFloat16 ? 0x1p-7 : 0x1p-10);
  const at::Tensor bias = (sum / kDraws - m64).abs();
  const double worst = (bias - ulp * 6 / std::sqrt(4.0 * kDraws)).max().item<double>();
  EXPECT_LE(worst, 0.0) << "the stochastic rounding is biased: the mean of " << kDraws
                        << " roundings of a value strays further from it than 6 standard errors";
}

}  // namespace

void check_precision(const PluginUnderTest& plugin, const CheckOptions& o) {
  ASSERT_EQ(plugin.slot(), Slot::kPrecision) << plugin.path();
  const Config cfg = plugin.config(o.options_toml);
  const std::string dir = work_dir(o, "precision");
  auto a = make(plugin, cfg, dir);
  Precision& p = *a->p;
  const at::ScalarType pd = p.param_dtype(), rd = p.reduce_dtype();
  EXPECT_TRUE(pd == at::kFloat || pd == at::kBFloat16 || pd == at::kHalf)
      << "param_dtype() is " << c10::toString(pd) << ", expected fp32, bf16 or fp16";
  EXPECT_TRUE(rd == at::kFloat || rd == at::kBFloat16 || rd == at::kHalf)
      << "reduce_dtype() is " << c10::toString(rd) << ", expected fp32, bf16 or fp16";
  check_rounding(p);
  const double s0 = p.loss_scale();
  int64_t step = 1;

  if (!p.needs_overflow_check()) {
    // A policy that cannot skip a finite step, whose scale never changes (ciuic/precision.h).
    if (o.expect_scale) {
      EXPECT_EQ(s0, *o.expect_scale) << "loss_scale()";
    }
    for (; step <= 2000; ++step) update(p, false, step);
    EXPECT_EQ(p.loss_scale(), s0)
        << "the scale of a policy without an overflow check changed in 2000 finite steps";
    EXPECT_FALSE(o.expect_backoff || o.expect_growth || o.expect_window)
        << "backoff/growth/window expected, but the policy needs no overflow check (a fixed scale)";
    return;
  }

  // An overflow skips the step and does not raise the scale.
  EXPECT_TRUE(update(p, true, step++)) << "an overflowed step was not skipped";
  // Repeated overflows lower the scale (after a hysteresis of a few, if the policy has one).
  double s = p.loss_scale();
  int overflows = 1;
  while (p.loss_scale() == s0 && overflows < 64) {
    EXPECT_TRUE(update(p, true, step++)) << "an overflowed step was not skipped";
    ++overflows;
  }
  s = p.loss_scale();
  if (s == s0) {
    // A static scale that skips overflowed steps: the scale stays put.
    EXPECT_EQ(steps_to_growth(p, step), 0)
        << "a policy whose overflows do not lower the scale raised it";
    if (o.expect_scale) {
      EXPECT_EQ(s0, *o.expect_scale) << "loss_scale()";
    }
    EXPECT_FALSE(o.expect_backoff || o.expect_growth || o.expect_window)
        << "backoff/growth/window expected, but 64 overflows in a row left the scale at " << s0;
  } else {
    if (o.expect_backoff) {
      EXPECT_DOUBLE_EQ(s / s0, *o.expect_backoff) << "the scale went from " << s0 << " to " << s
                                                  << " after " << overflows << " overflow(s)";
    }
    // Finite steps raise it again, every `window` steps after the last overflow.
    const int64_t window = steps_to_growth(p, step);
    ASSERT_GT(window, 0) << "the scale did not grow in " << kMaxWindow
                         << " finite steps after an overflow";
    if (o.expect_window) {
      EXPECT_EQ(window, *o.expect_window) << "finite steps from an overflow to a growth";
    }
    if (o.expect_growth) {
      EXPECT_DOUBLE_EQ(p.loss_scale() / s, *o.expect_growth) << "growth factor";
    }
    EXPECT_EQ(steps_to_growth(p, step), window)
        << "the scale did not grow again after the same window";
    // An overflow half-way restarts the window.
    for (int64_t i = 0; i < window / 2; ++i) update(p, false, step++);
    const double before = p.loss_scale();
    update(p, true, step++);
    if (p.loss_scale() < before || window > 1) {
      // (with a hysteresis the scale may be kept; the window still restarts at the overflow)
      const int64_t again = steps_to_growth(p, step);
      EXPECT_EQ(again, window) << "after an overflow " << window / 2
                               << " steps into a window, the scale grew after " << again
                               << " finite steps, expected a whole window of " << window;
    }
  }

  // A restored policy decides exactly as the original, step for step, on a random mix of steps.
  {
    StateDict saved;
    p.save_state(saved);
    auto b = make(plugin, cfg, dir);
    b->p->load_state(saved);
    std::mt19937 gen(7);
    for (int i = 0; i < 3000; ++i, ++step) {
      const bool inf = gen() % 13 == 0;
      ASSERT_EQ(b->p->loss_scale(), p.loss_scale())
          << "restored policy, step " << step << ": another scale";
      bool sa = false, sb = false;
      std::string ea, eb;
      try {
        sa = p.update(inf, step);
      } catch (const Error& e) {
        ea = e.what();
      }
      try {
        sb = b->p->update(inf, step);
      } catch (const Error& e) {
        eb = e.what();
      }
      ASSERT_EQ(sa, sb) << "restored policy, step " << step << ": another skip decision";
      ASSERT_EQ(ea.empty(), eb.empty()) << "restored policy, step " << step << ": " << ea << eb;
      if (!ea.empty()) break;
    }
  }

  // Overflows without end: the scale stays positive, or update() throws ciuic::Error naming the
  // step.
  auto c = make(plugin, cfg, dir);
  for (int64_t i = 1; i <= 5000; ++i) {
    try {
      c->p->update(true, i);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(i)), std::string::npos)
          << "the error at step " << i << " does not name the step: " << e.what();
      break;
    }
    ASSERT_TRUE(c->p->loss_scale() > 0 && std::isfinite(c->p->loss_scale()))
        << "after " << i << " overflows in a row loss_scale() = " << c->p->loss_scale();
  }
}

}  // namespace ciuic::conformance
