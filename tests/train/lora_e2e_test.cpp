// LoRA through build/bin/ciuic-run on CPU workers (gloo): the adapter trained by ddp at world 1
// is the adapter trained by ddp, zero2 and zero3 at world 2-3 (only the adapters reach the
// plugins; the base stays frozen), exported as a PEFT folder; checkpoints hold only the adapter
// and resume; bad [adapter] keys refused at start with exit code 2 naming the key; a second run
// continues from the first one's exported PEFT folder ([adapter] init_from), a folder for another
// base refused naming the tensor; cpu_adam trains the adapter as adamw does; bf16 LoRA follows
// fp32; dropout with activation checkpointing trains as without.
#include <ATen/Context.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

#include "e2e_support.h"

namespace {

using namespace ciuic::e2e;

const char* const kLora =
    "[adapter]\ntype = \"lora\"\nr = 4\nalpha = 8.0\ntarget_modules = [\"all-linear\"]\n";

Shape lora(int world, int micro, const std::string& sharding, int accum = 1) {
  return Shape{.world = world,
               .micro = micro,
               .accum = accum,
               .steps = 5,
               .sharding = sharding,
               .extra = kLora};
}

Weights adapter(const Result& r) {
  Weights w;
  auto f = ciuic::model::SafetensorsFile::open(r.dir + "/out/hf/adapter_model.safetensors");
  for (const auto& e : f->entries()) w[e.name] = f->tensor(e.name).to(at::kDouble);
  return w;
}

TEST(LoraE2E, AdapterTrainedAlikeByDdpZero2Zero3AtWorldSizes1To3) {
  const Result ref = run("lora-ref", lora(1, 12, "ddp"), {"--set", "log.progress=\"on\""});
  EXPECT_RUN_OK(ref);
  const Weights w_ref = adapter(ref);
  ASSERT_EQ(w_ref.size(), 2u * 7u * 2u);  // A and B of 7 linears in 2 layers
  EXPECT_TRUE(w_ref.count("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
  EXPECT_TRUE(std::filesystem::exists(ref.dir + "/out/hf/adapter_config.json"));
  EXPECT_FALSE(std::filesystem::exists(ref.dir + "/out/hf/model.safetensors"));
  // The start line counts what trains: the adapter's elements (as exported), not the base's.
  int64_t adapter_elements = 0;
  for (const auto& [name, t] : w_ref) adapter_elements += t.numel();
  EXPECT_NE(
      ref.log().find("training " + std::to_string(adapter_elements) + " adapter parameters of a "),
      std::string::npos)
      << ref.log();
  // B starts at zero and moved: the adapter was trained.
  EXPECT_GT(w_ref.at("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight")
                .abs()
                .max()
                .item<double>(),
            0);
  struct V {
    std::string name;
    Shape s;
  };
  const std::vector<V> variants = {{"zero2-acc", lora(2, 3, "zero2", 2)},
                                   {"zero2-3", lora(3, 4, "zero2")},
                                   {"zero3-2", lora(2, 6, "zero3")},
                                   {"zero3-3", lora(3, 4, "zero3")}};
  for (const auto& v : variants) {
    const Result r = run("lora-" + v.name, v.s);
    EXPECT_RUN_OK(r);
    EXPECT_LT(max_rel(adapter(r), w_ref), 1e-6) << v.name;
  }
  // Activation checkpointing recomputes the adapted layers: same adapter.
  const Result ck =
      run("lora-ckpt", lora(2, 6, "zero2"), {"--set", "model.activation_checkpointing=true"});
  EXPECT_RUN_OK(ck);
  EXPECT_LT(max_rel(adapter(ck), w_ref), 1e-6);
}

// [adapter] dropout with activation checkpointing (refused before): the recomputed layers draw the
// forward's masks, so the run trains the adapter the run without checkpointing trains.
TEST(LoraE2E, DropoutWithCheckpointingTrainsAsWithout) {
  const std::vector<std::string> drop = {"--set", "adapter.dropout=0.1"};
  const Result plain = run("lora-drop", lora(1, 12, "ddp"), drop);
  EXPECT_RUN_OK(plain);
  const Result ck = run("lora-drop-ckpt", lora(1, 12, "ddp"),
                        with(drop, {"--set", "model.activation_checkpointing=true"}));
  EXPECT_RUN_OK(ck);
  EXPECT_LT(max_rel(adapter(ck), adapter(plain)), 1e-6);
  const Result none = run("lora-nodrop", lora(1, 12, "ddp"));
  EXPECT_RUN_OK(none);
  EXPECT_GT(max_rel(adapter(none), adapter(plain)), 1e-4);  // the dropout was in use
}

// Dropout's masks come from the rank's default generators, which a checkpoint saves (rng.cpu, and
// rng.device on a GPU) and a resume at the same world size restores: 3 steps + resume to 5 train
// the adapter the uninterrupted 5 steps train. On a CUDA host the same on the GPU (nccl, 1 rank).
TEST(LoraE2E, DropoutResumesExactlyAtTheSameWorldSize) {
  std::vector<std::pair<std::string, std::vector<std::string>>> devices = {{"cpu", {}}};
  if (at::globalContext().hasCUDA())
    devices.push_back(
        {"cuda", {"--set", "cluster.device=\"cuda\"", "--set", "comm.plugin=\"nccl\""}});
  else
    std::cout << "[  SKIPPED ] the CUDA case: no CUDA device\n";
  for (const auto& [dev, args] : devices) {
    SCOPED_TRACE(dev);
    const std::vector<std::string> drop = with(args, {"--set", "adapter.dropout=0.1"});
    const int world = dev == "cpu" ? 2 : 1;
    const Result full = run("lora-drop-full-" + dev, lora(world, 6, "ddp"), drop);
    EXPECT_RUN_OK(full);
    Shape first = lora(world, 6, "ddp");
    first.steps = 3;
    const Result a = run("lora-drop-part-" + dev, first, drop);
    EXPECT_RUN_OK(a);
    const Result b = run("lora-drop-resume-" + dev, lora(world, 6, "ddp"),
                         with(drop, {"--resume", newest_checkpoint(a.dir + "/out/checkpoints")}));
    EXPECT_RUN_OK(b);
    EXPECT_LT(max_rel(adapter(b), adapter(full)), 1e-6);
  }
}

TEST(LoraE2E, CheckpointHoldsOnlyTheAdapterAndResumesOnAnotherWorldSize) {
  const Result full = run("lora-full", lora(2, 6, "zero2"));
  EXPECT_RUN_OK(full);
  Shape first = lora(2, 6, "zero2");
  first.steps = 3;
  const Result a = run("lora-part", first);
  EXPECT_RUN_OK(a);
  const std::string ckpt = newest_checkpoint(a.dir + "/out/checkpoints");
  {  // --export-hf of a LoRA checkpoint counts the adapter's parameters: the tensors it writes
    const std::string peft = a.dir + "/peft";
    Child c({std::string(CIUIC_BIN_DIR) + "/ciuic-run", "--export-hf", ckpt, peft},
            a.dir + "/export", {"OMP_NUM_THREADS=1"});
    ASSERT_TRUE(c.wait(std::chrono::seconds(120)));
    EXPECT_EQ(c.exit_code(), 0) << c.out() << c.err();
    int64_t n = 0;
    const auto file = ciuic::model::SafetensorsFile::open(peft + "/adapter_model.safetensors");
    for (const auto& e : file->entries()) {
      int64_t k = 1;
      for (int64_t d : e.shape) k *= d;
      n += k;
    }
    EXPECT_NE(c.out().find("(" + std::to_string(n) + " adapter parameters of a "),
              std::string::npos)
        << c.out();
  }
  auto f = ciuic::model::SafetensorsFile::open(ckpt + "/rank_00000.safetensors");
  for (const auto& e : f->entries())
    EXPECT_EQ(e.name.find("embed_tokens"), std::string::npos) << e.name;
  const Result b = run("lora-resume", lora(3, 4, "zero2"), {"--resume", ckpt});
  EXPECT_RUN_OK(b);
  EXPECT_LT(max_rel(adapter(b), adapter(full)), 1e-6);
}

// [adapter] init_from: the second run starts from the first run's export. With lr 0 its one
// step changes nothing (decoupled weight decay is scaled by lr too), so its export is the first
// run's adapter exactly: the second run's first step saw the first run's last weights.
TEST(LoraE2E, ContinuesFromAnExportedPeftFolder) {
  const Result a = run("lora-first", lora(1, 12, "ddp"));
  EXPECT_RUN_OK(a);
  Shape second = lora(1, 12, "ddp");
  second.steps = 1;
  second.extra += "init_from = \"" + a.dir + "/out/hf\"\n";
  const Result b = run("lora-second", second, {"--set", "optimizer.lr=0.0"});
  EXPECT_RUN_OK(b);
  EXPECT_EQ(max_rel(adapter(b), adapter(a)), 0.0);
  // With the schedule's lr it trains on from there: the adapter moves.
  const Result c = run("lora-third", second);
  EXPECT_RUN_OK(c);
  EXPECT_GT(max_rel(adapter(c), adapter(a)), 0.0);
  // A recipe key that disagrees with the folder's adapter_config.json: refused naming both.
  const Result r8 = run("lora-second-r8", second, {"--set", "adapter.r=8"}, 60);
  EXPECT_EQ(r8.code, 2) << r8.log();
  EXPECT_NE(r8.err.find("[adapter] r = 8"), std::string::npos) << r8.log();
  EXPECT_NE(r8.err.find("r = 4"), std::string::npos) << r8.log();
  // A PEFT folder made for another base (PEFT's own, tests/fixtures/gen_lora.py: llama_pad, hidden
  // 64): refused at start with exit code 2, naming the tensor.
  Shape other = lora(1, 12, "ddp");
  other.extra += "init_from = \"" + std::string(CIUIC_FIXTURES_DIR) + "/model/lora/llama\"\n";
  const Result o = run("lora-other-base", other, {}, 60);
  EXPECT_EQ(o.code, 2) << o.log();
  EXPECT_NE(o.err.find("[adapter] init_from"), std::string::npos) << o.log();
  EXPECT_NE(o.err.find("base_model.model.model.layers.0.mlp.gate_proj.lora_B.weight"),
            std::string::npos)
      << o.log();
  EXPECT_NE(o.err.find("[48, 4] in the file, [64, 4] expected"), std::string::npos) << o.log();
}

// cpu_adam (host memory, SIMD) trains the adapter as adamw does; bf16 parameters train as fp32.
TEST(LoraE2E, CpuAdamMatchesAdamwAndBf16Trains) {
  const Result ref = run("lora-adamw", lora(1, 12, "ddp"));
  EXPECT_RUN_OK(ref);
  const Result ca =
      run("lora-cpu-adam", lora(2, 6, "zero2"), {"--set", "optimizer.plugin=\"cpu_adam\""});
  EXPECT_RUN_OK(ca);
  const double d = max_rel(adapter(ca), adapter(ref));
  EXPECT_LT(d, 1e-5);
  std::cout << "cpu_adam vs adamw, adapter max relative difference " << d << "\n";
  // bf16: the synthetic tokens are uniform (nothing to learn beyond log V), so the check is the
  // fp32 run's: step by step the same losses to bf16's precision, the adapter trained (B moved
  // from zero) and close to fp32's.
  Shape bf = lora(1, 12, "ddp");
  bf.steps = 12;
  const Result f32 = run("lora-fp32-12", bf, {"--set", "optimizer.lr=1e-2"});
  EXPECT_RUN_OK(f32);
  bf.precision = "bf16";
  const Result b = run("lora-bf16", bf, {"--set", "optimizer.lr=1e-2"});
  EXPECT_RUN_OK(b);
  auto losses = [](const Result& r) {
    std::vector<double> out;
    for (const auto& rec : metrics(r))
      if (!rec.contains("event") && rec.contains("loss")) out.push_back(rec["loss"].get<double>());
    return out;
  };
  const std::vector<double> lb = losses(b), lf = losses(f32);
  ASSERT_EQ(lb.size(), 12u) << b.log();
  ASSERT_EQ(lf.size(), 12u) << f32.log();
  double worst_loss = 0;
  for (size_t i = 0; i < lb.size(); ++i)
    worst_loss = std::max(worst_loss, std::abs(lb[i] - lf[i]) / lf[i]);
  EXPECT_LT(worst_loss, 1e-2);
  const Weights wb = adapter(b);
  EXPECT_GT(wb.at("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight")
                .abs()
                .max()
                .item<double>(),
            0);
  const double dw = max_rel(wb, adapter(f32));
  EXPECT_LT(dw,
            0.15);  // measured 0.048: B is small after 12 steps, bf16 rounding is relative to it
  std::cout << "bf16 vs fp32 LoRA: losses max relative difference " << worst_loss << ", adapter "
            << dw << "\n";
}

// --plan with the in-forward loss: a frozen lm_head gets no gradient (autograd_fns.cpp: need_w is
// false), so "loss gradient" is d hidden alone, N x H x 4 bytes; with lm_head in modules_to_save
// it adds d lm_head, V x H x 4. Hand computation: N = 12 x 32 tokens, H = 32, V = 32768, fp32.
TEST(LoraE2E, PlanCountsNoHeadGradientForAFrozenHead) {
  auto loss_gradient_mib = [](const std::string& name, const std::string& extra) {
    Shape s = lora(1, 12, "ddp");
    s.vocab = 32768;
    s.model = "loss_backward = \"in_forward\"\n";
    s.extra += extra;
    const Result r = run(name, s, {"--plan"});
    const std::string text = r.out + r.err;
    std::smatch m;
    EXPECT_TRUE(std::regex_search(text, m, std::regex("loss gradient +([0-9.]+) MiB"))) << r.log();
    return m.empty() ? NAN : std::stod(m[1]);
  };
  const double N = 12 * 32, H = 32, V = 32768, MiB = 1 << 20;
  EXPECT_NEAR(loss_gradient_mib("plan-frozen-head", ""), N * H * 4 / MiB, 0.05);
  EXPECT_NEAR(loss_gradient_mib("plan-trained-head", "modules_to_save = [\"lm_head\"]\n"),
              (V * H + N * H) * 4 / MiB, 0.05);
}

TEST(LoraE2E, BadAdapterKeysAreRefusedAtStartNamingTheKey) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> cases = {
      {"adapter.r=0", {"r"}},
      {"adapter.alpha=0.0", {"alpha"}},
      {"adapter.type=\"dora\"", {"type", "dora"}},
      {"adapter.init=\"xavier\"", {"init", "xavier"}},
      {"adapter.target_modules=[\"qkv_proj\"]",
       {"[adapter] target_modules", "qkv_proj",
        "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"}},
      {"adapter.base_quantization=\"int8\"", {"base_quantization", "int8"}},
  };
  int i = 0;
  for (const auto& [set, parts] : cases) {
    const std::vector<std::string> args = {"--set", set};
    const Result r = run("lora-bad" + std::to_string(i++), lora(1, 12, "ddp"), args, 60);
    EXPECT_EQ(r.code, 2) << set << "\n" << r.log();
    for (const auto& p : parts)
      EXPECT_NE(r.err.find(p), std::string::npos) << set << " missing " << p << "\n" << r.log();
  }
}

}  // namespace
