// The optimizer step as the core drives it (train/step.h) through the sharding plugins, in one
// process, against independent references: torch::optim::AdamW plus hand-written clipping (ddp,
// zero2 at world 1), and the fp16 loss-scaling rules written out from DeepSpeed's
// DynamicLossScaler; when the core offers the optimizer an early update
// (Optimizer::offer_early_update) and its misuse; bf16's stochastic rounding against the exact
// values it rounds.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/optim/adamw.h>

#include <ciuic/comm.h>
#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/error.h>
#include <ciuic/precision.h>
#include <ciuic/sharding.h>

#include <ciuic/grad_norm.h>
#include <ciuic/optimizer.h>

#include "plugin_env.h"
#include "registry/registry.h"
#include "train/step.h"

namespace {

using ciuic::Config;
using ciuic::Slot;
using ciuic::train::StepInput;
using ciuic::train::StepResult;

// One optimizer step as the trainer runs it: the Step is made before the micro-batches (it may
// offer the early update), `backward` runs them, then norm -> skip -> clip -> update.
StepResult run_step(ciuic::Comm& comm, ciuic::Precision& prec, ciuic::Optimizer& opt,
                    ciuic::Sharding& shard, const StepInput& in,
                    const std::function<void()>& backward) {
  ciuic::train::Step step({&comm, &prec, &opt, &shard}, in);
  backward();
  return ciuic::train::run_step(step);
}

using ciuic_test::Env;

// A two-layer toy model: loss = sum((x W1^T) W2^T - y)^2 / n, with a bias-like vector.
struct Toy {
  at::Tensor w1, w2, b;
  Toy(at::ScalarType dtype, uint64_t seed) {
    at::manual_seed(seed);
    w1 = at::randn({16, 8}).to(dtype).set_requires_grad(true);
    w2 = at::randn({4, 16}).to(dtype).set_requires_grad(true);
    b = at::randn({4}).to(dtype).set_requires_grad(true);
  }
  std::vector<ciuic::ShardingParam> params() {
    return {{"w1", w1, true}, {"w2", w2, true}, {"b", b, false}};
  }
  at::Tensor loss(const at::Tensor& x, const at::Tensor& y) const {
    at::Tensor h = at::matmul(x.to(w1.scalar_type()), w1.t());
    at::Tensor out = at::matmul(h, w2.t()) + b;
    return (out.to(at::kFloat) - y).pow(2).sum() / x.size(0);
  }
};

double rel_err(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).norm().item<double>() /
         b.to(at::kDouble).norm().item<double>();
}

// Runs `steps` AdamW steps through a sharding plugin and through torch::optim::AdamW with manual
// clipping on copies of the same parameters; compares.
// `micro_batches` micro-batches a step, each its own random batch (the reference accumulates their
// gradients); `options`: more TOML for the sharding's section.
void compare_with_torch(const std::string& sharding, double clip, int micro_batches = 1,
                        const std::string& options = "") {
  Env env;
  auto comm = env.make<ciuic::Comm>(Slot::kComm, "gloo");
  auto prec = env.make<ciuic::Precision>(Slot::kPrecision, "fp32");
  auto shard =
      env.make<ciuic::Sharding>(Slot::kSharding, sharding, "reduce_bucket_size = 100\n" + options);
  auto optimizer = env.make<ciuic::Optimizer>(Slot::kOptimizer, "adamw", "betas = [0.9, 0.95]\n");

  Toy ours(at::kFloat, 7), ref(at::kFloat, 7);
  ciuic::ShardingSetup s;
  s.params = ours.params();
  s.comm = comm.get();
  s.precision = prec.get();
  s.optimizer = optimizer.get();
  s.gradient_accumulation_steps = micro_batches;
  shard->setup(s);

  torch::optim::AdamWOptions o(1e-2);
  o.betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1);
  torch::optim::AdamW ref_opt_decay({ref.w1, ref.w2}, o);
  torch::optim::AdamWOptions o2 = o;
  o2.weight_decay(0.0);
  torch::optim::AdamW ref_opt_nodecay({ref.b}, o2);

  StepInput in;
  in.lr = 1e-2;
  in.weight_decay = 0.1;
  in.max_grad_norm = clip;
  for (int step = 1; step <= 6; ++step) {
    at::manual_seed(100 + step);
    std::vector<std::pair<at::Tensor, at::Tensor>> batches;
    for (int m = 0; m < micro_batches; ++m)
      batches.emplace_back(at::randn({5, 8}), at::randn({5, 4}));
    in.step = in.t = step;
    const StepResult r = run_step(*comm, *prec, *optimizer, *shard, in, [&] {
      for (int m = 0; m < micro_batches; ++m) {
        shard->begin_micro_batch(m, m + 1 == micro_batches);
        torch::autograd::backward({ours.loss(batches[m].first, batches[m].second)});
      }
    });
    ASSERT_FALSE(r.skipped);

    ref_opt_decay.zero_grad();
    ref_opt_nodecay.zero_grad();
    for (const auto& [x, y] : batches) torch::autograd::backward({ref.loss(x, y)});
    double sq = 0;
    for (auto* p : {&ref.w1, &ref.w2, &ref.b}) sq += p->grad().pow(2).sum().item<double>();
    const double norm = std::sqrt(sq);
    EXPECT_NEAR(r.grad_norm, norm, 1e-5 * norm) << "step " << step;
    if (clip > 0 && norm > clip) {
      const double c = clip / (norm + 1e-6);
      for (auto* p : {&ref.w1, &ref.w2, &ref.b}) p->mutable_grad().mul_(c);
    }
    ref_opt_decay.step();
    ref_opt_nodecay.step();
    for (auto [a, b] : {std::pair{ours.w1, ref.w1}, {ours.w2, ref.w2}, {ours.b, ref.b}})
      EXPECT_LT(rel_err(a.detach(), b.detach()), 1e-6) << sharding << " step " << step;
  }
}

TEST(ShardingStep, DdpMatchesTorchAdamW) { compare_with_torch("ddp", 0.0); }
TEST(ShardingStep, Zero2MatchesTorchAdamW) { compare_with_torch("zero2", 0.0); }
TEST(ShardingStep, ClippingMatchesReference) {
  compare_with_torch("ddp", 0.5);
  compare_with_torch("zero2", 0.5);
}
// local_accumulation_percent: part of the buckets accumulate on the device over the micro-batches
// and are reduced once; the update is torch's AdamW of the summed gradient, as for reduce_each.
TEST(ShardingStep, PartlyLocalAccumulationMatchesTorchAdamW) {
  for (const char* sharding : {"ddp", "zero2"})
    for (const char* percent : {"0", "50", "100"})
      for (double clip : {0.0, 0.5}) {
        SCOPED_TRACE(std::string(sharding) + " " + percent + "% clip " + std::to_string(clip));
        compare_with_torch(
            sharding, clip, 3,
            std::string("grad_accumulation = \"reduce_each\"\nlocal_accumulation_percent = ") +
                percent + "\n");
      }
}

TEST(ShardingStep, ParametersAreViewsOfOneFlatBuffer) {
  Env env;
  auto comm = env.make<ciuic::Comm>(Slot::kComm, "gloo");
  auto prec = env.make<ciuic::Precision>(Slot::kPrecision, "fp32");
  auto shard = env.make<ciuic::Sharding>(Slot::kSharding, "zero2");
  auto optimizer = env.make<ciuic::Optimizer>(Slot::kOptimizer, "adamw");
  Toy t(at::kFloat, 3);
  const at::Tensor before = t.w1.detach().clone();
  ciuic::ShardingSetup s;
  s.params = t.params();
  s.comm = comm.get();
  s.precision = prec.get();
  s.optimizer = optimizer.get();
  shard->setup(s);
  EXPECT_TRUE(at::equal(t.w1.detach(), before));  // values survive the move
  const auto base = t.w1.storage().data();
  EXPECT_EQ(t.w2.storage().data(), base);
  EXPECT_EQ(t.b.storage().data(), base);
  // Layout covers every element once.
  int64_t total = 0;
  for (const auto& sl : shard->layout()) total += sl.length;
  EXPECT_EQ(total, 16 * 8 + 4 * 16 + 4);
}

// ---- fp16 dynamic loss scaling -----------------------------------------------------------------
struct Fp16Rig {
  Env env;
  std::shared_ptr<ciuic::Comm> comm;
  std::shared_ptr<ciuic::Precision> prec;
  std::shared_ptr<ciuic::Sharding> shard;
  std::shared_ptr<ciuic::Optimizer> optimizer;
  Toy toy{at::kHalf, 11};
  explicit Fp16Rig(const std::string& prec_toml) {
    comm = env.make<ciuic::Comm>(Slot::kComm, "gloo");
    prec = env.make<ciuic::Precision>(Slot::kPrecision, "fp16", prec_toml);
    shard = env.make<ciuic::Sharding>(Slot::kSharding, "ddp");
    optimizer = env.make<ciuic::Optimizer>(Slot::kOptimizer, "adamw");
    ciuic::ShardingSetup s;
    s.params = toy.params();
    s.comm = comm.get();
    s.precision = prec.get();
    s.optimizer = optimizer.get();
    shard->setup(s);
  }
  // One step; `overflow` poisons the loss with inf.
  StepResult step(int64_t n, bool overflow) {
    at::manual_seed(500 + n);
    at::Tensor x = at::randn({3, 8}), y = at::randn({3, 4});
    StepInput in;
    in.lr = 1e-3;
    in.step = n;
    in.t = n;
    return run_step(*comm, *prec, *optimizer, *shard, in, [&] {
      shard->begin_micro_batch(0, true);
      at::Tensor loss = toy.loss(x, y) * prec->loss_scale();
      if (overflow) loss = loss * std::numeric_limits<float>::infinity();
      torch::autograd::backward({loss});
    });
  }
};

TEST(Fp16, OverflowSkipsStepBitIdenticalAndFollowsHysteresis) {
  Fp16Rig rig("initial_scale_power = 8\nloss_scale_window = 3\nhysteresis = 2\n");
  EXPECT_EQ(rig.prec->loss_scale(), 256.0);
  rig.step(1, false);
  const at::Tensor w1 = rig.toy.w1.detach().clone(), b = rig.toy.b.detach().clone();
  // First overflow: skipped, scale kept (hysteresis 2 -> 1).
  auto r = rig.step(2, true);
  EXPECT_TRUE(r.skipped);
  EXPECT_FALSE(std::isfinite(r.grad_norm));
  EXPECT_TRUE(at::equal(rig.toy.w1.detach(), w1));
  EXPECT_TRUE(at::equal(rig.toy.b.detach(), b));
  EXPECT_EQ(rig.prec->loss_scale(), 256.0);
  // Second overflow: skipped, scale halved.
  r = rig.step(3, true);
  EXPECT_TRUE(r.skipped);
  EXPECT_TRUE(at::equal(rig.toy.w1.detach(), w1));
  EXPECT_EQ(rig.prec->loss_scale(), 128.0);
  ciuic::Metrics m;
  rig.prec->append_metrics(m);
  ASSERT_EQ(m.values.size(), 2u);
  EXPECT_EQ(m.values[1], (std::pair<std::string, double>{"skipped_total", 2.0}));
  // DeepSpeed: the scale doubles when (iter - last_overflow_iter) % window == 0. The last overflow
  // was iteration 2 (0-based); iterations 3, 4 are good, 5 = 2 + 3 doubles.
  EXPECT_FALSE(rig.step(4, false).skipped);
  EXPECT_FALSE(rig.step(5, false).skipped);
  EXPECT_EQ(rig.prec->loss_scale(), 128.0);
  EXPECT_FALSE(rig.step(6, false).skipped);
  EXPECT_EQ(rig.prec->loss_scale(), 256.0);
  EXPECT_FALSE(at::equal(rig.toy.w1.detach(), w1));  // good steps do update
}

TEST(Fp16, UnscaledGradientNormIsReported) {
  Fp16Rig rig("initial_scale_power = 4\n");
  Toy ref(at::kHalf, 11);
  at::manual_seed(501);
  at::Tensor x = at::randn({3, 8}), y = at::randn({3, 4});
  torch::autograd::backward({ref.loss(x, y)});
  double sq = 0;
  for (auto* p : {&ref.w1, &ref.w2, &ref.b})
    sq += p->grad().to(at::kDouble).pow(2).sum().item<double>();
  const auto r = rig.step(1, false);
  EXPECT_NEAR(r.grad_norm, std::sqrt(sq), 2e-2 * std::sqrt(sq));  // fp16 gradients
}

TEST(Fp16, OverflowAtMinimumScaleStopsWithStep) {
  Fp16Rig rig("initial_scale_power = 1\nmin_loss_scale = 1.0\nhysteresis = 1\n");
  rig.step(1, true);  // 2 -> 1
  EXPECT_EQ(rig.prec->loss_scale(), 1.0);
  try {
    rig.step(2, true);
    FAIL() << "expected an error at the minimum loss scale";
  } catch (const ciuic::Error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("step 2"), std::string::npos) << m;
    EXPECT_NE(m.find("minimum"), std::string::npos) << m;
  }
}

TEST(Fp16, StaticScaleNeverChanges) {
  Fp16Rig rig("loss_scale = 64.0\n");
  EXPECT_TRUE(rig.step(1, true).skipped);
  EXPECT_EQ(rig.prec->loss_scale(), 64.0);
  for (int i = 2; i < 5; ++i) EXPECT_FALSE(rig.step(i, false).skipped);
  EXPECT_EQ(rig.prec->loss_scale(), 64.0);
}

TEST(Fp16, StateRoundTrip) {
  Fp16Rig a("initial_scale_power = 6\nhysteresis = 3\n");
  a.step(1, true);
  a.step(2, false);
  ciuic::StateDict sd;
  a.prec->save_state(sd);
  Fp16Rig b("initial_scale_power = 6\nhysteresis = 3\n");
  b.prec->load_state(sd);
  for (int i = 3; i < 8; ++i) {
    const bool of = i == 5 || i == 6;
    EXPECT_EQ(a.prec->update(of, i), b.prec->update(of, i));
    EXPECT_EQ(a.prec->loss_scale(), b.prec->loss_scale());
  }
}

// ---- the step: when the core offers the optimizer an early update
// -------------------------------- An optimizer that forwards to adamw and records the offers it
// gets; it accepts them when told to (adamw itself still updates in step(), which a Sharding cannot
// tell apart).
class Recording final : public ciuic::Optimizer {
 public:
  Recording(std::shared_ptr<ciuic::Optimizer> inner, bool accept)
      : inner_(std::move(inner)), accept_(accept) {}
  void setup(const ciuic::OptimizerSetup& s) override {
    seen = s;
    inner_->setup(s);
  }
  bool offer_early_update(const ciuic::OptimizerStep& a) override {
    offers.push_back(a);
    return accept_;
  }
  void accumulate_grad(int r, const at::Tensor& c, bool f, bool l) override {
    chunks.push_back({r, c.scalar_type(), f, l});
    inner_->accumulate_grad(r, c, f, l);
  }
  at::Tensor finish_grads() override { return inner_->finish_grads(); }
  void step(const ciuic::OptimizerStep& a, at::Tensor& p) override {
    steps.push_back(a);
    inner_->step(a, p);
  }
  void write_params(at::Tensor& p, int64_t t) override { inner_->write_params(p, t); }
  std::vector<std::string> state_names() const override { return inner_->state_names(); }
  void save_state(ciuic::StateDict& o) const override { inner_->save_state(o); }
  void load_state(const ciuic::StateDict& i) override { inner_->load_state(i); }
  ciuic::OptimizerMemory memory() const override { return inner_->memory(); }
  std::vector<ciuic::OptimizerStep> offers, steps;
  ciuic::OptimizerSetup seen;  // what setup() was told
  struct Chunk {
    int region;
    at::ScalarType dtype;
    bool first, last;
  };
  std::vector<Chunk> chunks;  // every accumulate_grad() call

 private:
  std::shared_ptr<ciuic::Optimizer> inner_;
  bool accept_;
};

// fp32 that skips every step it is asked about: a policy breaking its promise (ciuic/precision.h).
class SkipsFinite final : public ciuic::Precision {
 public:
  bool update(bool, int64_t) override { return true; }
};

struct OfferRig {
  Env env;
  std::shared_ptr<ciuic::Comm> comm;
  std::shared_ptr<ciuic::Precision> prec;
  std::shared_ptr<ciuic::Sharding> shard;
  Recording opt;
  Toy toy;
  // `options`: more TOML for the sharding's section; `micro_batches`: the accumulation it is set up
  // for.
  OfferRig(const std::string& sharding, ciuic::Precision* precision, bool accept,
           const std::string& prec_name = "fp32", const std::string& options = "",
           int64_t micro_batches = 1)
      : opt(env.make<ciuic::Optimizer>(Slot::kOptimizer, "adamw"), accept),
        toy(prec_name == "fp16" ? at::kHalf : at::kFloat, 13) {
    comm = env.make<ciuic::Comm>(Slot::kComm, "gloo");
    prec = env.make<ciuic::Precision>(Slot::kPrecision, prec_name);
    shard = env.make<ciuic::Sharding>(Slot::kSharding, sharding,
                                      "reduce_bucket_size = 100\n" + options);
    ciuic::ShardingSetup s;
    s.params = toy.params();
    s.comm = comm.get();
    s.precision = precision ? precision : prec.get();
    s.optimizer = &opt;
    s.gradient_accumulation_steps = micro_batches;
    shard->setup(s);
    s_precision = precision;
  }
  // A step of two micro-batches as the core runs it.
  StepResult step(const StepInput& in, bool poison = false) {
    return run_step(*comm, s_precision ? *s_precision : *prec, opt, *shard, in, [&] {
      for (int i = 0; i < 2; ++i) {
        shard->begin_micro_batch(i, i == 1);
        at::manual_seed(700 + 10 * in.step + i);
        at::Tensor loss = toy.loss(at::randn({3, 8}), at::randn({3, 4}));
        if (poison && i == 1) loss = loss * std::numeric_limits<float>::infinity();
        torch::autograd::backward({loss});
      }
    });
  }
  ciuic::Precision* s_precision = nullptr;  // the policy given to setup(), when not `prec`
};

StepInput step_input(int64_t n, double clip = 0.0, bool nonfinite_stops = true) {
  StepInput in;
  in.lr = 1e-3 * static_cast<double>(n);
  in.weight_decay = 0.1;
  in.max_grad_norm = clip;
  in.step = in.t = n;
  in.nonfinite_stops = nonfinite_stops;
  return in;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ciuic::Error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

// What the optimizer is told and handed: with one rank nothing is reduced, so chunks come in the
// parameter dtype (bf16 here, where the reduce dtype is fp32); one chunk per region and step unless
// every micro-batch is reduced ("reduce_each" with accumulation); the flags say which.
TEST(ShardingSetup, WorldOfOneHandsOverTheParameterDtypeOnceAStepWhenNothingAccumulates) {
  struct Case {
    std::string sharding, accumulation;
    int64_t micro_batches;
    bool one_chunk;
  };
  for (const Case& c : {Case{"ddp", "reduce_each", 2, false},
                        Case{"zero2", "reduce_each", 2, false}, Case{"zero2", "no_sync", 2, true},
                        Case{"ddp", "no_sync", 3, true}, Case{"zero2", "reduce_each", 1, true}}) {
    SCOPED_TRACE(c.sharding + " " + c.accumulation + " x" + std::to_string(c.micro_batches));
    Env env;
    auto comm = env.make<ciuic::Comm>(Slot::kComm, "gloo");
    auto prec =
        env.make<ciuic::Precision>(Slot::kPrecision, "bf16");  // reduce_dtype fp32 by default
    ASSERT_EQ(prec->reduce_dtype(), at::kFloat);
    auto shard = env.make<ciuic::Sharding>(
        Slot::kSharding, c.sharding,
        "reduce_bucket_size = 100\ngrad_accumulation = \"" + c.accumulation + "\"\n");
    Recording opt(env.make<ciuic::Optimizer>(Slot::kOptimizer, "adamw"), false);
    Toy toy(at::kBFloat16, 21);
    ciuic::ShardingSetup s;
    s.params = toy.params();
    s.comm = comm.get();
    s.precision = prec.get();
    s.optimizer = &opt;
    s.gradient_accumulation_steps = c.micro_batches;
    shard->setup(s);
    EXPECT_EQ(opt.seen.grad_dtype, at::kBFloat16);
    EXPECT_EQ(opt.seen.one_chunk_per_step, c.one_chunk);
    for (int64_t i = 0; i < c.micro_batches; ++i) {
      shard->begin_micro_batch(i, i + 1 == c.micro_batches);
      at::manual_seed(900 + i);
      torch::autograd::backward({toy.loss(at::randn({3, 8}), at::randn({3, 4}))});
    }
    run_step(*comm, *prec, opt, *shard, step_input(1), [] {});  // after the micro-batches above
    const size_t regions = opt.seen.grad_regions.size();
    ASSERT_EQ(opt.chunks.size(),
              regions * (c.one_chunk ? 1 : static_cast<size_t>(c.micro_batches)));
    std::vector<int> seen(regions, 0);
    for (const auto& ch : opt.chunks) {
      EXPECT_EQ(ch.dtype, at::kBFloat16);
      const int k = seen.at(static_cast<size_t>(ch.region))++;
      EXPECT_EQ(ch.first, k == 0);
      EXPECT_EQ(ch.last, c.one_chunk || k + 1 == c.micro_batches);
    }
  }
}

TEST(StepProtocol, OffersTheStepsExactArgumentsOnlyWhenNothingDependsOnTheNorm) {
  for (const char* sharding : {"zero2", "ddp"}) {
    SCOPED_TRACE(sharding);
    OfferRig rig(sharding, nullptr, /*accept=*/true);
    // Offered: no clipping, fp32, a non-finite gradient stops the run. step() then gets exactly
    // the offered arguments.
    for (int64_t n = 1; n <= 3; ++n) ASSERT_FALSE(rig.step(step_input(n)).skipped);
    ASSERT_EQ(rig.opt.offers.size(), 3u);
    ASSERT_EQ(rig.opt.steps.size(), 3u);
    for (size_t i = 0; i < 3; ++i) {
      const auto &o = rig.opt.offers[i], &st = rig.opt.steps[i];
      EXPECT_EQ(o.lr, st.lr);
      EXPECT_EQ(o.weight_decay, st.weight_decay);
      EXPECT_EQ(o.grad_scale, st.grad_scale);
      EXPECT_EQ(o.t, st.t);
    }
    // Not offered: clipping; nonfinite = "skip".
    rig.step(step_input(4, /*clip=*/1.0));
    rig.step(step_input(5, 0.0, /*nonfinite_stops=*/false));
    EXPECT_EQ(rig.opt.offers.size(), 3u);
    EXPECT_EQ(rig.opt.steps.size(), 5u);
  }
  // Not offered: a loss scale that may skip the step (fp16).
  OfferRig fp16("zero2", nullptr, true, "fp16");
  fp16.step(step_input(1));
  EXPECT_TRUE(fp16.opt.offers.empty());
  EXPECT_EQ(fp16.opt.steps.size(), 1u);
}

// grad_accumulation = "auto" is the core's memory planner's to choose (kOptionPlanned): should it
// ever reach the plugin, the plugin refuses it by name rather than taking it for one of the two.
TEST(ShardingSetup, UnresolvedAutoAccumulationIsRefusedByName) {
  for (const char* sharding : {"zero2", "ddp"}) {
    Env env;
    const std::string e = error_of([&] {
      env.make<ciuic::Sharding>(Slot::kSharding, sharding, "grad_accumulation = \"auto\"\n");
    });
    EXPECT_NE(e.find("[sharding] grad_accumulation = \"auto\": expected \"no_sync\" or "
                     "\"reduce_each\" here"),
              std::string::npos)
        << sharding << ": " << e;
  }
}

// What the optimizer is handed with local_accumulation_percent: the local buckets' regions one
// chunk a step (first and last), after the last micro-batch; the others one a micro-batch. The
// local ones are whole buckets in backward order within the share of the elements.
TEST(ShardingSetup, PartlyLocalBucketsAreHandedOverOnceAStep) {
  for (const char* sharding : {"zero2", "ddp"}) {
    SCOPED_TRACE(sharding);
    OfferRig rig(sharding, nullptr, false, "fp32",
                 "grad_accumulation = \"reduce_each\"\nlocal_accumulation_percent = 50\n", 3);
    Recording& opt = rig.opt;
    EXPECT_FALSE(opt.seen.one_chunk_per_step);
    for (int64_t i = 0; i < 3; ++i) {
      rig.shard->begin_micro_batch(i, i == 2);
      at::manual_seed(900 + i);
      torch::autograd::backward({rig.toy.loss(at::randn({3, 8}), at::randn({3, 4}))});
    }
    run_step(*rig.comm, *rig.prec, opt, *rig.shard, step_input(1),
             [] {});  // after the micro-batches above
    const auto& regions = opt.seen.grad_regions;
    std::vector<std::vector<Recording::Chunk>> per(regions.size());
    for (const auto& ch : opt.chunks) per.at(static_cast<size_t>(ch.region)).push_back(ch);
    int64_t total = 0, local = 0;
    size_t locals = 0;
    for (const auto& r : regions) total += r.numel;
    for (size_t r = 0; r < regions.size(); ++r) {
      if (per[r].size() == 1) {  // local: a prefix of the buckets
        EXPECT_EQ(locals, r) << "region " << r;
        ++locals;
        local += regions[r].numel;
        EXPECT_TRUE(per[r][0].first && per[r][0].last) << "region " << r;
        continue;
      }
      ASSERT_EQ(per[r].size(), 3u) << "region " << r;
      for (size_t k = 0; k < 3; ++k) {
        EXPECT_EQ(per[r][k].first, k == 0) << "region " << r;
        EXPECT_EQ(per[r][k].last, k == 2) << "region " << r;
      }
    }
    EXPECT_GE(locals, 1u);
    EXPECT_LT(locals, regions.size());
    EXPECT_LE(local * 100, 50 * total);
    EXPECT_GT((local + regions[locals].numel) * 100, 50 * total);  // the next bucket would not fit
  }
}

TEST(StepProtocol, Misuse) {
  // A policy that skips a finite step after the optimizer began updating: an error, not a skip.
  SkipsFinite skips;
  OfferRig bad("zero2", &skips, true);
  const std::string e = error_of([&] { bad.step(step_input(1)); });
  EXPECT_NE(e.find("the precision policy skipped a step with a finite gradient"), std::string::npos)
      << e;
  // ... which without an accepted offer is an ordinary skip.
  OfferRig declined("zero2", &skips, /*accept=*/false);
  EXPECT_TRUE(declined.step(step_input(1)).skipped);
  // A non-finite gradient after an accepted offer: skipped (the caller ends the run).
  OfferRig nan("zero2", nullptr, true);
  const StepResult r = nan.step(step_input(1), /*poison=*/true);
  EXPECT_TRUE(r.skipped);
  EXPECT_FALSE(std::isfinite(r.grad_norm));
  EXPECT_TRUE(nan.opt.steps.empty());
}

// The norm of a gradient held whole (ciuic/grad_norm.h) against fp64:
// one fp32 reduction over 800k elements was off by 3.6e-5 relative; rows summed in fp64 are not.
TEST(GradNorm, WholeShardNormIsAccurate) {
  Env env;
  auto comm = env.make<ciuic::Comm>(Slot::kComm, "gloo");
  at::manual_seed(5);
  for (int64_t n : {int64_t{1000}, int64_t{800000}, int64_t{(1 << 12) * 50 + 3}}) {
    const at::Tensor g = at::randn({n}) * at::rand({n}).pow(4);
    const ciuic::GradNorm gn = ciuic::global_grad_norm(g, *comm, /*sharded=*/true);
    const double want = g.to(at::kDouble).norm().item<double>();
    EXPECT_NEAR(gn.norm, want, 5e-7 * want) << n;
    EXPECT_FALSE(gn.nonfinite);
  }
  at::Tensor bad = at::ones({300000});
  bad[123456] = INFINITY;
  EXPECT_TRUE(ciuic::global_grad_norm(bad, *comm, true).nonfinite);
}

// ---- bf16 stochastic rounding ([precision] rounding = "stochastic")
// ---------------------------------
namespace {

// The exact value of each bf16 in `t`, as doubles.
std::vector<double> values(const at::Tensor& t) {
  const at::Tensor d = t.to(at::kDouble).contiguous();
  return std::vector<double>(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
}

std::shared_ptr<ciuic::Precision> bf16(Env& env, const std::string& rounding, uint64_t seed = 11) {
  env.ctx.seed = seed;
  return env.make<ciuic::Precision>(Slot::kPrecision, "bf16", "rounding = \"" + rounding + "\"\n");
}

at::Tensor rounded(const ciuic::Precision& p, const at::Tensor& master, int64_t t,
                   const std::vector<ciuic::PositionSpan>& positions) {
  at::Tensor out = at::empty({master.numel()}, at::kBFloat16);
  p.round_to_param(master, out, t, positions);
  return out;
}

}  // namespace

// The mean of many roundings of one value is the value (an independent reference: the exact fp32
// value, as a double). The values sit 0.7 of a bf16 step above a bf16 number, so round to nearest
// (always up: 0.3 steps off) and truncation (always down: 0.7 steps off) both miss the bound by
// far.
TEST(Bf16Rounding, StochasticRoundingIsUnbiased) {
  Env env;
  auto p = bf16(env, "stochastic");
  EXPECT_FALSE(p->rounds_to_nearest());
  const int64_t n = 20000;
  for (double lower : {1.0, -3.0, 1.5 * std::ldexp(1.0, -10), 640.0}) {  // bf16 numbers
    // The bf16 step above |lower| (lower is a bf16 number): 8 significant bits.
    const double step = std::ldexp(1.0, std::ilogb(std::fabs(lower)) - 7);
    const float x = static_cast<float>(lower + (lower > 0 ? 0.7 : -0.7) * step);
    const double exact = static_cast<double>(x);
    const at::Tensor master = at::full({n}, x, at::kFloat);
    double sum = 0;
    int64_t count = 0;
    for (int64_t t = 1; t <= 5; ++t) {
      const auto v = values(rounded(*p, master, t, {{0, n, 1000 * t}}));
      for (double r : v) {
        ASSERT_TRUE(r == lower || r == lower + (lower > 0 ? step : -step))
            << r << " is not a neighbour of " << exact;
        sum += r;
      }
      count += n;
    }
    const double mean = sum / static_cast<double>(count);
    // Standard deviation of one rounding: step * sqrt(0.7 * 0.3) = 0.46 step; of the mean of 1e5:
    // 0.0015 step.
    EXPECT_LT(std::fabs(mean - exact), 0.01 * step) << "value " << exact << ": mean " << mean;
    const double nearest = static_cast<double>(c10::BFloat16(x));
    EXPECT_GT(std::fabs(nearest - exact), 0.25 * step);  // the bound would catch round to nearest
  }
}

// The bits depend on (seed, t, global position) only: not on how the elements are cut into calls
// or where they sit in the tensor; another t or seed gives other bits. Padding, infinities and
// NaNs round to nearest; "nearest" is ATen's conversion.
TEST(Bf16Rounding, StochasticBitsFollowSeedStepAndGlobalPosition) {
  Env env;
  auto p = bf16(env, "stochastic");
  at::manual_seed(3);
  const int64_t n = 4096;
  const at::Tensor master = at::randn({n});
  const at::Tensor whole = rounded(*p, master, 7, {{0, n, 5000}});
  // The same elements in two calls, the second half first, and as spans of one call.
  const at::Tensor b =
      rounded(*p, master.narrow(0, n / 2, n / 2).contiguous(), 7, {{0, n / 2, 5000 + n / 2}});
  const at::Tensor a = rounded(*p, master.narrow(0, 0, n / 2).contiguous(), 7, {{0, n / 2, 5000}});
  EXPECT_TRUE(at::equal(at::cat({a, b}), whole));
  EXPECT_TRUE(at::equal(rounded(*p, master, 7, {{0, 100, 5000}, {100, n - 100, 5100}}), whole));
  // A rank holding the same elements of the model elsewhere in its shard (another world size).
  const at::Tensor shifted = at::cat({at::zeros({64}), master});
  const at::Tensor s = rounded(*p, shifted, 7, {{0, 64, -1}, {64, n, 5000}});
  EXPECT_TRUE(at::equal(s.narrow(0, 64, n), whole));
  EXPECT_TRUE(at::equal(s.narrow(0, 0, 64), at::zeros({64}, at::kBFloat16)));
  // Other update, other position, other seed: other noise (most of 4096 elements differ somewhere).
  EXPECT_FALSE(at::equal(rounded(*p, master, 8, {{0, n, 5000}}), whole));
  EXPECT_FALSE(at::equal(rounded(*p, master, 7, {{0, n, 5001}}), whole));
  Env other;
  EXPECT_FALSE(
      at::equal(rounded(*bf16(other, "stochastic", 12), master, 7, {{0, n, 5000}}), whole));
  // Special values, and padding, as round to nearest.
  const at::Tensor special = at::tensor(std::vector<float>{INFINITY, -INFINITY, NAN, 0.f, 1.7f});
  const at::Tensor r = rounded(*p, special, 1, {{0, 4, 0}, {4, 1, -1}});
  EXPECT_TRUE(at::equal(r.narrow(0, 0, 2), special.narrow(0, 0, 2).to(at::kBFloat16)));
  EXPECT_TRUE(std::isnan(r[2].item<float>()));
  EXPECT_EQ(r[3].item<float>(), 0.f);
  EXPECT_EQ(r[4].item<float>(), static_cast<float>(c10::BFloat16(1.7f)));
  // rounding = "nearest" (the default) is ATen's round to nearest even.
  Env plain;
  auto nearest = bf16(plain, "nearest");
  EXPECT_TRUE(nearest->rounds_to_nearest());
  EXPECT_TRUE(at::equal(rounded(*nearest, master, 7, {{0, n, 5000}}), master.to(at::kBFloat16)));
  // Misuse: positions that do not cover the tensor.
  const std::string e = error_of([&] { rounded(*p, master, 7, {{0, n - 1, 5000}}); });
  EXPECT_NE(e.find("precision bf16: round_to_param positions cover 4095 of 4096 elements"),
            std::string::npos)
      << e;
}

// A resume rewrites the parameters from the loaded master weights through the policy
// (Sharding::load_state(fetch, t) -> Optimizer::write_params(out, t)). With stochastic rounding
// they are the bits the saved run computed with, whatever the shard layout of the resumed run:
// here ddp with another bucket size, so every parameter but the first sits at another shard
// offset (what another world size does to a shard). The control: rewritten for another update
// (t = 0, the t a resume used before plugin API 7), the bits differ.
TEST(Bf16Rounding, ResumeRewritesTheSavedBitsOnAnotherShardLayout) {
  struct Rig {
    Env env;
    std::shared_ptr<ciuic::Comm> comm;
    std::shared_ptr<ciuic::Precision> prec;
    std::shared_ptr<ciuic::Sharding> shard;
    std::shared_ptr<ciuic::Optimizer> opt;
    Toy toy{at::kBFloat16, 17};
    explicit Rig(const std::string& bucket) {
      comm = env.make<ciuic::Comm>(Slot::kComm, "gloo");
      prec = bf16(env, "stochastic", 5);
      shard = env.make<ciuic::Sharding>(Slot::kSharding, "ddp",
                                        "reduce_bucket_size = " + bucket + "\n");
      opt = env.make<ciuic::Optimizer>(Slot::kOptimizer, "adamw");
      ciuic::ShardingSetup s;
      s.params = toy.params();
      s.comm = comm.get();
      s.precision = prec.get();
      s.optimizer = opt.get();
      shard->setup(s);
    }
    std::vector<at::Tensor> params() const {
      return {toy.w1.detach().clone(), toy.w2.detach().clone(), toy.b.detach().clone()};
    }
  };
  Rig saved("100");
  for (int64_t n = 1; n <= 3; ++n) {
    StepInput in = step_input(n);
    in.lr = 0.05;  // large steps: the masters move by many bf16 steps
    ASSERT_FALSE(
        run_step(*saved.comm, *saved.prec, *saved.opt, *saved.shard, in, [&] {
          saved.shard->begin_micro_batch(0, true);
          at::manual_seed(40 + n);
          torch::autograd::backward({saved.toy.loss(at::randn({3, 8}), at::randn({3, 4}))});
        }).skipped);
  }
  const std::vector<at::Tensor> want = saved.params();
  ciuic::StateDict state;
  saved.shard->save_state(state);
  const std::vector<ciuic::ShardSlice> layout = saved.shard->layout();
  // The checkpoint's slices, as the core's ShardSet serves them.
  const ciuic::SliceFetcher fetch = [&](const std::string& name, const std::string& param,
                                        int64_t off, int64_t len) {
    for (const auto& sl : layout)
      if (sl.param == param && off >= sl.param_offset && off + len <= sl.param_offset + sl.length)
        return ciuic::state_get(state, name)
            .narrow(0, sl.shard_offset + off - sl.param_offset, len)
            .clone();
    ADD_FAILURE() << "no slice of " << param;
    return at::Tensor();
  };
  Rig resumed("37");
  const auto other = resumed.shard->layout();
  ASSERT_EQ(other.size(), layout.size());
  bool moved = false;
  for (size_t i = 0; i < layout.size(); ++i)
    moved |= other[i].shard_offset != layout[i].shard_offset;
  ASSERT_TRUE(moved) << "the two bucket sizes give the same layout: the test shows nothing";
  resumed.shard->load_state(fetch, 3);
  const std::vector<at::Tensor> got = resumed.params();
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_TRUE(at::equal(got[i], want[i])) << "parameter " << i;
  resumed.shard->load_state(fetch, 0);
  bool differs = false;
  const std::vector<at::Tensor> at_zero = resumed.params();
  for (size_t i = 0; i < want.size(); ++i) differs |= !at::equal(at_zero[i], want[i]);
  EXPECT_TRUE(differs) << "rounding for t = 0 gave the same bits: the noise does not depend on t";
}
