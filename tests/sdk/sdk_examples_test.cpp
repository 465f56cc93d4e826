// The out-of-tree example plugins that sdk_install_test built against the installed SDK and the
// optim kit (<build>/sdk-examples; a ctest fixture), each against an independent reference:
//   * ZeRO-1 (examples/zero1_plugin) trains exactly like DDP and like one process, world 1-4;
//   * Lion (examples/lion_plugin) matches the published update computed independently in NumPy
//     (tests/fixtures/gen_lion.py -> tests/fixtures/optim/lion.json);
//   * the memory planner plans both from their own answers.
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include <ciuic/context.h>
#include <ciuic/optimizer.h>
#include <ciuic/precision.h>
#include <ciuic/store.h>

#include "e2e_support.h"
#include "recipe/recipe.h"
#include "registry/registry.h"

namespace fs = std::filesystem;
using namespace ciuic::e2e;

namespace {

const std::string kExamples = std::string(CIUIC_BUILD_DIR) + "/sdk-examples";
const std::string kZero1 = kExamples + "/zero1/plugins";
const std::string kLion = kExamples + "/lion/plugins";

TEST(SdkExamples, Zero1MatchesDdpAndOneProcessAtWorldSizes1To4) {
  ASSERT_TRUE(fs::exists(kZero1 + "/libciuic_sharding_zero1.so")) << "run sdk_install_test first";
  const Result ref = run("zero1-ref", Shape{.world = 1, .micro = 12, .sharding = "ddp"});
  EXPECT_RUN_OK(ref);
  const Weights w_ref = exported(ref);
  for (int world : {1, 2, 3, 4}) {
    Shape z{.world = world, .micro = 12 / world, .sharding = "zero1", .plugin_paths = {kZero1}};
    const Result rz = run("zero1-w" + std::to_string(world), z);
    EXPECT_RUN_OK(rz);
    EXPECT_LT(max_rel(exported(rz), w_ref), 1e-6) << "zero1 world " << world;
    EXPECT_LT(max_norm_rel(rz, ref), 1e-5) << "zero1 world " << world;
    if (world == 1) continue;
    Shape d = z;
    d.sharding = "ddp";
    const Result rd = run("zero1-ddp-w" + std::to_string(world), d);
    EXPECT_RUN_OK(rd);
    EXPECT_LT(max_rel(exported(rz), exported(rd)), 1e-6) << "zero1 vs ddp, world " << world;
  }
}

// Rounds to nearest even (the base class's default).
class Fp32 final : public ciuic::Precision {
 public:
  at::ScalarType param_dtype() const override { return at::kFloat; }
  at::ScalarType reduce_dtype() const override { return at::kFloat; }
  double loss_scale() const override { return 1.0; }
  bool needs_overflow_check() const override { return false; }
  bool update(bool, int64_t) override { return false; }
  int64_t skipped_steps() const override { return 0; }
};

at::Tensor tensor(const nlohmann::json& j) { return at::tensor(j.get<std::vector<float>>()); }

TEST(SdkExamples, LionMatchesThePublishedUpdate) {
  ASSERT_TRUE(fs::exists(kLion + "/libciuic_optimizer_lion.so")) << "run sdk_install_test first";
  nlohmann::json fx;
  std::ifstream(std::string(CIUIC_FIXTURES_DIR) + "/optim/lion.json") >> fx;
  const int64_t n = fx["numel"], decay_end = fx["decay_end"];
  const auto betas = fx["betas"].get<std::vector<double>>();

  const ciuic::Registry reg = ciuic::Registry::from_paths({kLion});
  const ciuic::Recipe recipe = ciuic::Recipe::parse(
      "[train]\nmax_steps = 1\n[data]\nplugin = \"x\"\n[optimizer]\nplugin = \"lion\"\nbetas = [" +
          std::to_string(betas[0]) + ", " + std::to_string(betas[1]) + "]\n",
      "lion.toml");
  ciuic::RunContext ctx;
  ctx.store = ciuic::make_local_store(std::chrono::seconds(1));
  auto lion = reg.create<ciuic::Optimizer>(
      ciuic::Slot::kOptimizer, "lion",
      recipe.plugin_config(ciuic::Slot::kOptimizer, *reg.get(ciuic::Slot::kOptimizer, "lion").info), ctx);
  EXPECT_EQ(lion->state_names(), (std::vector<std::string>{"master", "exp_avg"}));

  const Fp32 fp32;
  ciuic::OptimizerSetup s;
  s.numel = n;
  s.segments = {{0, decay_end, true}, {decay_end, n, false}};
  s.grad_regions = {{0, decay_end}, {decay_end, n - decay_end}};
  s.initial = {ciuic::ShardValues{0, tensor(fx["init"])}};
  s.precision = &fp32;
  lion->setup(s);
  at::Tensor params = at::empty({n});
  const auto& lrs = fx["lr"];
  for (size_t i = 0; i < lrs.size(); ++i) {
    const at::Tensor g = tensor(fx["grads"][i]);
    lion->accumulate_grad(1, g.narrow(0, decay_end, n - decay_end).contiguous(), true, true);
    lion->accumulate_grad(0, g.narrow(0, 0, decay_end).contiguous(), true, true);
    const double sq = lion->finish_grads().item<double>();
    EXPECT_NEAR(sq, g.to(at::kDouble).square().sum().item<double>(), 1e-6 * sq);
    ciuic::OptimizerStep st;
    st.lr = lrs[i].get<double>();
    st.weight_decay = fx["weight_decay"].get<double>();
    st.t = static_cast<int64_t>(i) + 1;
    lion->step(st, params);
  }
  ciuic::StateDict sd;
  lion->save_state(sd);
  const at::Tensor want_p = tensor(fx["master"]), want_m = tensor(fx["exp_avg"]);
  EXPECT_LT(((ciuic::state_get(sd, "master") - want_p).abs() / want_p.abs().clamp_min(1e-3)).max().item<double>(), 1e-6);
  // The momentum is a running mix that cancels: element-wise relative error is meaningless near
  // zero (ATen's lerp and the fixture's two products round differently), so compare against its scale.
  EXPECT_LT((ciuic::state_get(sd, "exp_avg") - want_m).abs().max().item<double>(),
            1e-6 * want_m.abs().max().item<double>());
  EXPECT_TRUE(at::equal(params, ciuic::state_get(sd, "master")));
}

// Lion trains in a real run, and --plan counts it from the plugin's own answer (one moment:
// 12 bytes per shard element with the gradient, against AdamW's 16).
TEST(SdkExamples, LionTrainsAndIsPlannedFromItsOwnAnswer) {
  ASSERT_TRUE(fs::exists(kLion + "/libciuic_optimizer_lion.so")) << "run sdk_install_test first";
  Shape s{.world = 2, .micro = 6, .steps = 40, .extra = "", .plugin_paths = {kLion}};
  // Lion moves every weight by lr per step: 3e-4 here (measured: the loss goes 4.17 -> 3.55 in
  // 40 steps, 1e-4 -> 3.94; AdamW at 1e-3 -> 2.75). A wrong sign or a lost update would not learn.
  const Result r = run("lion-train", s,
                       {"--set", "optimizer.plugin=lion", "--set", "optimizer.lr=3e-4",
                        "--set", "data.pattern=increment", "--set", "data.documents_per_row=1",
                        "--set", "log.every_steps=1"});
  EXPECT_RUN_OK(r);
  std::vector<double> losses;
  for (const auto& rec : metrics(r))
    if (rec.contains("loss")) losses.push_back(rec["loss"].get<double>());
  ASSERT_GE(losses.size(), 2u) << r.log();
  EXPECT_LT(losses.back(), 0.9 * losses.front()) << r.log();

  const std::string recipe = r.dir + "/recipe.toml";
  Child plan({std::string(CIUIC_BIN_DIR) + "/ciuic-run", recipe, "--plugin-path", kLion, "--plan",
              "--set", "optimizer.plugin=lion"},
             r.dir + "/plan");
  ASSERT_TRUE(plan.wait(std::chrono::seconds(60)));
  EXPECT_EQ(plan.exit_code(), 0) << plan.err();
  EXPECT_TRUE(std::regex_search(plan.out(), std::regex("master weights \\+ Lion momentum .*\\[optimizer lion\\]")))
      << plan.out();
  EXPECT_EQ(plan.out().find("not counted: optimizer"), std::string::npos) << plan.out();
}

}  // namespace
