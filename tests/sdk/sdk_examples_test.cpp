// The out-of-tree example plugins that sdk_install_test built against the installed SDK and the
// optim kit (<build>/sdk-examples; a ctest fixture), each against an independent reference:
//   * ZeRO-1 (examples/zero1_plugin) trains exactly like DDP and like one process, world 1-4;
//   * Lion (examples/lion_plugin) matches the published update computed independently in NumPy
//     (tests/fixtures/gen_lion.py -> tests/fixtures/optim/lion.json);
//   * the memory planner plans both from their own answers;
//   * `lines` (examples/lines_plugin, a data plugin on the data kit) trains exactly like the
//     in-tree cached_ssd on the same text.
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
const std::string kLines = kExamples + "/lines/plugins";

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

// fp32, rounds to nearest even (the base class's defaults).
using Fp32 = ciuic::Precision;

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
      recipe.plugin_config(ciuic::Slot::kOptimizer, *reg.get(ciuic::Slot::kOptimizer, "lion").info),
      ctx);
  EXPECT_EQ(lion->state_names(), (std::vector<std::string>{"master", "exp_avg"}));

  const Fp32 fp32{};
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
  EXPECT_LT(((ciuic::state_get(sd, "master") - want_p).abs() / want_p.abs().clamp_min(1e-3))
                .max()
                .item<double>(),
            1e-6);
  // The momentum is a running mix that cancels: element-wise relative error is meaningless near
  // zero (ATen's lerp and the fixture's two products round differently), so compare against its
  // scale.
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
                       {"--set", "optimizer.plugin=lion", "--set", "optimizer.lr=3e-4", "--set",
                        "data.pattern=increment", "--set", "data.documents_per_row=1", "--set",
                        "log.every_steps=1"});
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
  EXPECT_TRUE(std::regex_search(
      plan.out(), std::regex("master weights \\+ Lion momentum .*\\[optimizer lion\\]")))
      << plan.out();
  EXPECT_EQ(plan.out().find("not counted: optimizer"), std::string::npos) << plan.out();
}

// `lines` reads one document per line and hands the documents to the data kit's PackedStream;
// cached_ssd makes the same documents from {"text": line} and runs on the same kit. Two ranks
// training from either (eval split included) end with the same weights, bit for bit, and the
// same losses: an out-of-tree plugin gets the in-tree shuffling, packing, dealing and cursors.
TEST(SdkExamples, LinesOnTheDataKitTrainsExactlyLikeCachedSsd) {
  ASSERT_TRUE(fs::exists(kLines + "/libciuic_data_lines.so")) << "run sdk_install_test first";
  const std::string dir = ciuic::testing::fresh_dir("sdk-lines-data");
  std::string txt, jsonl, eval_txt, eval_jsonl;
  for (int i = 0; i < 60; ++i) {
    const std::string line = "what is " + std::to_string(i) + " + " + std::to_string(i % 7) + "? " +
                             std::to_string(i + i % 7) +
                             (i % 4 == 0 ? " (a longer line, to be packed with others)" : "");
    (i % 10 == 9 ? eval_txt : txt) += line + "\n\n";  // blank lines are no documents
    (i % 10 == 9 ? eval_jsonl : jsonl) += nlohmann::json{{"text", line}}.dump() + "\n";
  }
  std::ofstream(dir + "/train.txt") << txt;
  std::ofstream(dir + "/eval.txt") << eval_txt;
  std::ofstream(dir + "/train.jsonl") << jsonl;
  std::ofstream(dir + "/eval.jsonl") << eval_jsonl;
  Shape s{.world = 2, .micro = 3, .steps = 8, .plugin_paths = {kLines}};
  s.model = "tokenizer = \"" + CIUIC_SOURCE_DIR + "/examples/demo/tokenizer.json\"\n";
  s.vocab = 384;
  s.data = "plugin = \"lines\"\npath = \"" + dir + "/train.txt\"\neval_path = \"" + dir +
           "/eval.txt\"\n";
  const std::vector<std::string> eval = {"--set", "train.eval_every_steps=4"};
  const Result lines = run("sdk-lines", s, eval);
  EXPECT_RUN_OK(lines);
  s.data = "plugin = \"cached_ssd\"\nsources = [\"" + dir + "/train.jsonl\"]\neval_sources = [\"" +
           dir + "/eval.jsonl\"]\n";
  const Result cached = run("sdk-lines-cached", s, eval);
  EXPECT_RUN_OK(cached);
  EXPECT_TRUE(identical(exported(lines), exported(cached)));
  std::vector<double> la, lb, ea, eb;
  for (const auto& m : metrics(lines)) {
    if (m.contains("loss")) la.push_back(m["loss"].get<double>());
    if (m.contains("eval_loss")) ea.push_back(m["eval_loss"].get<double>());
  }
  for (const auto& m : metrics(cached)) {
    if (m.contains("loss")) lb.push_back(m["loss"].get<double>());
    if (m.contains("eval_loss")) eb.push_back(m["eval_loss"].get<double>());
  }
  EXPECT_EQ(la.size(), 8u);
  EXPECT_EQ(la, lb);
  EXPECT_FALSE(ea.empty()) << "the eval split ran";
  EXPECT_EQ(ea, eb);
  // Its own errors name it: a file without a document.
  std::ofstream(dir + "/empty.txt") << "\n\n";
  s.data = "plugin = \"lines\"\npath = \"" + dir + "/empty.txt\"\n";
  const Result empty = run("sdk-lines-empty", s);
  EXPECT_EQ(empty.code, 2) << empty.log();
  EXPECT_NE(empty.err.find("has no non-empty line"), std::string::npos) << empty.log();
}

}  // namespace
