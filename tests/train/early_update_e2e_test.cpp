// cpu_adam's early update (issue 14) through build/bin/ciuic-run on CPU workers (gloo), ZeRO-2:
// with the update of each gradient region running while backward goes on (overlap_update =
// "auto") a run must end bit for bit where the update after backward (overlap_update = "off")
// ends — parameters, master weights, both moments, the step counter, every logged loss and
// gradient norm — on 1 and 2 ranks, with 1 and 3 micro-batches per step. And the early path must
// be taken exactly when it is exact: not with gradient clipping, not with [train] nonfinite =
// "skip" (metrics: optim_update_early; the plugin's log line); a non-finite gradient on the early
// path stops the run without saving the partly updated state.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <nlohmann/json.hpp>

#include "e2e_support.h"

namespace fs = std::filesystem;

namespace {

using namespace ciuic::e2e;

// The newest checkpoint folder of a run (every run saves one at its end).
std::string last_checkpoint(const Result& r) {
  std::string best;
  for (const auto& e : fs::directory_iterator(r.dir + "/out/checkpoints"))
    if (e.path().filename().string().rfind("step_", 0) == 0 && e.path().string() > best)
      best = e.path().string();
  return best;
}

// Every tensor of every rank file (master, exp_avg, exp_avg_sq; not the RNG state) and
// trainer.json's counters of two runs' final checkpoints, compared bit for bit.
void expect_same_checkpoint(const Result& a, const Result& b, int world, const std::string& what) {
  const std::string ca = last_checkpoint(a), cb = last_checkpoint(b);
  ASSERT_FALSE(ca.empty()) << a.log();
  ASSERT_EQ(fs::path(ca).filename(), fs::path(cb).filename()) << what;
  for (int rank = 0; rank < world; ++rank) {
    char file[32];
    std::snprintf(file, sizeof file, "/rank_%05d.safetensors", rank);
    auto fa = ciuic::model::SafetensorsFile::open(ca + file);
    auto fb = ciuic::model::SafetensorsFile::open(cb + file);
    int states = 0;
    for (const auto& e : fa->entries()) {
      // The default CPU generator's state differs between two runs of one recipe (nothing seeds
      // it with [run] seed, and nothing in these runs draws from it).
      if (e.name.rfind("rng.", 0) == 0) continue;
      const at::Tensor ta = fa->tensor(e.name), tb = fb->tensor(e.name);
      EXPECT_TRUE(at::equal(ta, tb)) << what << ": rank " << rank << " " << e.name;
      states += e.name == "master" || e.name == "exp_avg" || e.name == "exp_avg_sq";
    }
    EXPECT_EQ(states, 3) << what << ": rank " << rank;
  }
  auto counters = [](const std::string& dir) {
    nlohmann::json j = nlohmann::json::parse(std::ifstream(dir + "/trainer.json"));
    return std::vector<double>{j.at("step").get<double>(), j.at("updates").get<double>(),
                               j.at("skipped").get<double>(), j.at("tokens").get<double>()};
  };
  EXPECT_EQ(counters(ca), counters(cb)) << what;
}

// Per step: loss and gradient norm, exactly.
std::vector<std::pair<double, double>> curve(const Result& r) {
  std::vector<std::pair<double, double>> out;
  for (const auto& rec : metrics(r))
    if (!rec.contains("event") && rec.contains("loss"))
      out.emplace_back(rec["loss"].get<double>(), rec["grad_norm"].get<double>());
  return out;
}

// optim_update_early of every step record (1: the regions were updated during backward).
std::vector<double> early_flags(const Result& r) {
  std::vector<double> out;
  for (const auto& rec : metrics(r))
    if (!rec.contains("event") && rec.contains("step"))
      out.push_back(rec.value("optim_update_early", -1.0));
  return out;
}

const std::vector<std::string> kCpuAdam = {"--set", "optimizer.plugin=cpu_adam", "--set",
                                           "train.gradient_clipping=0.0"};
std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(EarlyUpdateE2E, BitIdenticalToTheUpdateAfterBackward) {
  constexpr int kSteps = 6;
  for (int world : {1, 2})
    for (int accum : {1, 3}) {
      const std::string name = "w" + std::to_string(world) + "a" + std::to_string(accum);
      SCOPED_TRACE(name);
      // bf16 (the headline set-up): fp32 master, bf16 parameters rounded by the kernel, fp32
      // reduced chunks. Small buckets: several regions per rank, updated one by one.
      const Shape s{
          .world = world, .micro = 4 / world, .accum = accum, .steps = kSteps, .precision = "bf16"};
      const Result early =
          run("early-" + name, s, with(kCpuAdam, {"--set", "optimizer.overlap_update=auto"}));
      const Result late =
          run("late-" + name, s, with(kCpuAdam, {"--set", "optimizer.overlap_update=off"}));
      EXPECT_RUN_OK(early);
      EXPECT_RUN_OK(late);
      EXPECT_EQ(early_flags(early), std::vector<double>(kSteps, 1.0)) << early.log();
      EXPECT_EQ(early_flags(late), std::vector<double>(kSteps, 0.0)) << late.log();
      EXPECT_NE(early.err.find("updating each gradient region as soon as its last chunk is folded"),
                std::string::npos)
          << early.log();
      const auto ce = curve(early), cl = curve(late);
      EXPECT_EQ(ce.size(), static_cast<size_t>(kSteps));
      EXPECT_EQ(ce, cl) << "losses or gradient norms differ";
      EXPECT_TRUE(identical(exported(early), exported(late)));
      expect_same_checkpoint(early, late, world, name);
      // And it trained: the parameters moved (runs that updated nothing would also agree).
      if (world == 2 && accum == 3) {
        const Result none = run("none-" + name, s, with(kCpuAdam, {"--set", "optimizer.lr=0"}));
        EXPECT_RUN_OK(none);
        EXPECT_GT(max_rel(exported(early), exported(none)), 1e-4);
      }
    }
}

TEST(EarlyUpdateE2E, NotTakenWhenItWouldNotBeExact) {
  const Shape s{.world = 2, .micro = 2, .accum = 2, .steps = 3, .precision = "bf16"};
  // Gradient clipping: the update needs the global norm.
  const Result clip = run(
      "clip", s, {"--set", "optimizer.plugin=cpu_adam", "--set", "train.gradient_clipping=1.0"});
  EXPECT_RUN_OK(clip);
  EXPECT_EQ(early_flags(clip), std::vector<double>(3, 0.0)) << clip.log();
  EXPECT_NE(clip.err.find("updating after backward: the core offered no early update"),
            std::string::npos)
      << clip.log();
  // nonfinite = "skip": a non-finite gradient must leave the state untouched.
  const Result skip = run("skip", s, with(kCpuAdam, {"--set", "train.nonfinite=\"skip\""}));
  EXPECT_RUN_OK(skip);
  EXPECT_EQ(early_flags(skip), std::vector<double>(3, 0.0)) << skip.log();
  // fp16: the dynamic loss scale may skip the step.
  const Result fp16 =
      run("fp16", Shape{.world = 1, .micro = 4, .steps = 3, .precision = "fp16"}, kCpuAdam);
  EXPECT_RUN_OK(fp16);
  EXPECT_EQ(early_flags(fp16), std::vector<double>(3, 0.0)) << fp16.log();
}

// A non-finite gradient on the early path stops the run as on the other (naming the last good
// checkpoint), and that checkpoint holds the state from before the bad step.
TEST(EarlyUpdateE2E, NonFiniteGradientStopsAndKeepsTheLastGoodCheckpoint) {
  const Shape s{.world = 1, .micro = 4, .steps = 10};
  const Result r =
      run("nan", s,
          with(kCpuAdam, {"--set", "optimizer.lr=1e30", "--set", "checkpoint.every_steps=1"}));
  EXPECT_EQ(r.code, 1) << r.log();
  EXPECT_NE(r.err.find("non-finite gradient norm"), std::string::npos) << r.log();
  EXPECT_NE(r.err.find("last good checkpoint: "), std::string::npos) << r.log();
  // The same steps with the update after backward save the same last checkpoint.
  const Result late =
      run("nan-late", s,
          with(kCpuAdam, {"--set", "optimizer.lr=1e30", "--set", "checkpoint.every_steps=1",
                          "--set", "optimizer.overlap_update=off"}));
  EXPECT_EQ(late.code, 1) << late.log();
  expect_same_checkpoint(r, late, 1, "last good checkpoint");
}

}  // namespace
