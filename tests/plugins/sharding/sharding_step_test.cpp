// The optimizer step as the sharding plugins run it, in one process, against independent
// references: torch::optim::AdamW plus hand-written clipping (ddp, zero2 at world 1), and the fp16
// loss-scaling rules written out from DeepSpeed's DynamicLossScaler; when begin_step() offers the
// optimizer an early update (Optimizer::offer_early_update) and its misuse.
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

#include "registry/registry.h"

namespace {

using ciuic::Config;
using ciuic::Slot;

struct Env {
  ciuic::RunContext ctx;
  ciuic::Registry reg = ciuic::Registry::from_paths({CIUIC_PLUGIN_DIR});
  Env() {
    ctx.store = ciuic::make_local_store(std::chrono::seconds(30));
    ctx.output_dir = CIUIC_TEST_TMP;
  }
  template <class T>
  std::shared_ptr<T> make(Slot slot, const std::string& name, const std::string& toml = "") {
    return reg.create<T>(slot, name, with_defaults(reg.get(slot, name), toml), ctx);
  }
  // The plugin's defaults plus `toml`, as the recipe would hand them over.
  static Config with_defaults(const ciuic::PluginDescriptor& d, const std::string& toml) {
    std::string text;
    for (uint32_t i = 0; i < d.info->num_options; ++i) {
      const auto& o = d.info->options[i];
      if (("\n" + toml).find("\n" + std::string(o.key) + " =") == std::string::npos &&
          o.default_value)
        text += std::string(o.key) + " = " + o.default_value + "\n";
    }
    return Config::from_toml(ciuic::slot_name(d.slot), text + toml);
  }
};

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
  auto shard = env.make<ciuic::Sharding>(Slot::kSharding, sharding, "reduce_bucket_size = 100\n" + options);
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

  ciuic::StepInput in;
  in.lr = 1e-2;
  in.weight_decay = 0.1;
  in.max_grad_norm = clip;
  for (int step = 1; step <= 6; ++step) {
    at::manual_seed(100 + step);
    std::vector<std::pair<at::Tensor, at::Tensor>> batches;
    for (int m = 0; m < micro_batches; ++m) batches.emplace_back(at::randn({5, 8}), at::randn({5, 4}));
    for (int m = 0; m < micro_batches; ++m) {
      shard->begin_micro_batch(m, m + 1 == micro_batches);
      torch::autograd::backward({ours.loss(batches[m].first, batches[m].second)});
    }
    in.step = in.t = step;
    const ciuic::StepResult r = shard->step(in);
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
        compare_with_torch(sharding, clip, 3,
                           std::string("grad_accumulation = \"reduce_each\"\nlocal_accumulation_percent = ") + percent + "\n");
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
  ciuic::StepResult step(int64_t n, bool overflow) {
    at::manual_seed(500 + n);
    at::Tensor x = at::randn({3, 8}), y = at::randn({3, 4});
    shard->begin_micro_batch(0, true);
    at::Tensor loss = toy.loss(x, y) * prec->loss_scale();
    if (overflow) loss = loss * std::numeric_limits<float>::infinity();
    torch::autograd::backward({loss});
    ciuic::StepInput in;
    in.lr = 1e-3;
    in.step = n;
    in.t = n;
    return shard->step(in);
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
  EXPECT_EQ(rig.prec->skipped_steps(), 2);
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
  for (auto* p : {&ref.w1, &ref.w2, &ref.b}) sq += p->grad().to(at::kDouble).pow(2).sum().item<double>();
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

// ---- begin_step: when the optimizer is offered an early update ----------------------------------
// An optimizer that forwards to adamw and records the offers it gets; it accepts them when told
// to (adamw itself still updates in step(), which a Sharding cannot tell apart).
class Recording final : public ciuic::Optimizer {
 public:
  Recording(std::shared_ptr<ciuic::Optimizer> inner, bool accept) : inner_(std::move(inner)), accept_(accept) {}
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
  void write_params(at::Tensor& p) override { inner_->write_params(p); }
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
  at::ScalarType param_dtype() const override { return at::kFloat; }
  at::ScalarType reduce_dtype() const override { return at::kFloat; }
  double loss_scale() const override { return 1.0; }
  bool needs_overflow_check() const override { return false; }
  bool update(bool, int64_t) override { return true; }
  int64_t skipped_steps() const override { return 0; }
};

struct OfferRig {
  Env env;
  std::shared_ptr<ciuic::Comm> comm;
  std::shared_ptr<ciuic::Precision> prec;
  std::shared_ptr<ciuic::Sharding> shard;
  Recording opt;
  Toy toy;
  // `options`: more TOML for the sharding's section; `micro_batches`: the accumulation it is set up for.
  OfferRig(const std::string& sharding, ciuic::Precision* precision, bool accept,
           const std::string& prec_name = "fp32", const std::string& options = "", int64_t micro_batches = 1)
      : opt(env.make<ciuic::Optimizer>(Slot::kOptimizer, "adamw"), accept),
        toy(prec_name == "fp16" ? at::kHalf : at::kFloat, 13) {
    comm = env.make<ciuic::Comm>(Slot::kComm, "gloo");
    prec = env.make<ciuic::Precision>(Slot::kPrecision, prec_name);
    shard = env.make<ciuic::Sharding>(Slot::kSharding, sharding, "reduce_bucket_size = 100\n" + options);
    ciuic::ShardingSetup s;
    s.params = toy.params();
    s.comm = comm.get();
    s.precision = precision ? precision : prec.get();
    s.optimizer = &opt;
    s.gradient_accumulation_steps = micro_batches;
    shard->setup(s);
  }
  // begin_step(in) (when `announce`), then two micro-batches, then step(in).
  ciuic::StepResult step(const ciuic::StepInput& in, bool announce = true, bool poison = false) {
    if (announce) shard->begin_step(in);
    for (int i = 0; i < 2; ++i) {
      shard->begin_micro_batch(i, i == 1);
      at::manual_seed(700 + 10 * in.step + i);
      at::Tensor loss = toy.loss(at::randn({3, 8}), at::randn({3, 4}));
      if (poison && i == 1) loss = loss * std::numeric_limits<float>::infinity();
      torch::autograd::backward({loss});
    }
    return shard->step(in);
  }
};

ciuic::StepInput step_input(int64_t n, double clip = 0.0, bool nonfinite_stops = true) {
  ciuic::StepInput in;
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
  for (const Case& c : {Case{"ddp", "reduce_each", 2, false}, Case{"zero2", "reduce_each", 2, false},
                        Case{"zero2", "no_sync", 2, true}, Case{"ddp", "no_sync", 3, true},
                        Case{"zero2", "reduce_each", 1, true}}) {
    SCOPED_TRACE(c.sharding + " " + c.accumulation + " x" + std::to_string(c.micro_batches));
    Env env;
    auto comm = env.make<ciuic::Comm>(Slot::kComm, "gloo");
    auto prec = env.make<ciuic::Precision>(Slot::kPrecision, "bf16");  // reduce_dtype fp32 by default
    ASSERT_EQ(prec->reduce_dtype(), at::kFloat);
    auto shard = env.make<ciuic::Sharding>(Slot::kSharding, c.sharding,
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
    shard->step(step_input(1));
    const size_t regions = opt.seen.grad_regions.size();
    ASSERT_EQ(opt.chunks.size(), regions * (c.one_chunk ? 1 : static_cast<size_t>(c.micro_batches)));
    std::vector<int> seen(regions, 0);
    for (const auto& ch : opt.chunks) {
      EXPECT_EQ(ch.dtype, at::kBFloat16);
      const int k = seen.at(static_cast<size_t>(ch.region))++;
      EXPECT_EQ(ch.first, k == 0);
      EXPECT_EQ(ch.last, c.one_chunk || k + 1 == c.micro_batches);
    }
  }
}

TEST(ShardingBeginStep, OffersTheStepsExactArgumentsOnlyWhenNothingDependsOnTheNorm) {
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
    // Not offered: clipping; nonfinite = "skip"; no begin_step at all.
    rig.step(step_input(4, /*clip=*/1.0));
    rig.step(step_input(5, 0.0, /*nonfinite_stops=*/false));
    rig.step(step_input(6), /*announce=*/false);
    EXPECT_EQ(rig.opt.offers.size(), 3u);
    EXPECT_EQ(rig.opt.steps.size(), 6u);
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
    const std::string e = error_of(
        [&] { env.make<ciuic::Sharding>(Slot::kSharding, sharding, "grad_accumulation = \"auto\"\n"); });
    EXPECT_NE(e.find("[sharding] grad_accumulation = \"auto\": expected \"no_sync\" or \"reduce_each\" here"),
              std::string::npos) << sharding << ": " << e;
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
    rig.shard->step(step_input(1));
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

TEST(ShardingBeginStep, Misuse) {
  OfferRig rig("zero2", nullptr, /*accept=*/true);
  // step() must get the announced input.
  ciuic::StepInput in = step_input(1);
  rig.shard->begin_step(in);
  ciuic::StepInput other = in;
  other.lr *= 2;
  rig.shard->begin_micro_batch(0, true);
  torch::autograd::backward({rig.toy.loss(at::randn({3, 8}), at::randn({3, 4}))});
  std::string e = error_of([&] { rig.shard->step(other); });
  EXPECT_NE(e.find("sharding: step 1 was announced by begin_step() with other lr"), std::string::npos) << e;
  // begin_step after the step's first micro-batch.
  OfferRig late("zero2", nullptr, true);
  late.shard->begin_micro_batch(0, true);
  e = error_of([&] { late.shard->begin_step(step_input(1)); });
  EXPECT_NE(e.find("sharding: begin_step(1) after the step's first micro-batch began"), std::string::npos) << e;
  // A policy that skips a finite step after the optimizer began updating: an error, not a skip.
  SkipsFinite skips;
  OfferRig bad("zero2", &skips, true);
  e = error_of([&] { bad.step(step_input(1)); });
  EXPECT_NE(e.find("the precision policy skipped a step with a finite gradient"), std::string::npos) << e;
  // ... which without an accepted offer is an ordinary skip.
  OfferRig declined("zero2", &skips, /*accept=*/false);
  EXPECT_TRUE(declined.step(step_input(1)).skipped);
  // A non-finite gradient after an accepted offer: skipped (the caller ends the run).
  OfferRig nan("zero2", nullptr, true);
  const ciuic::StepResult r = nan.step(step_input(1), true, /*poison=*/true);
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

