// LoRA through build/bin/ciuic-run on CPU workers (gloo): the adapter trained by ddp at world 1
// is the adapter trained by ddp, zero2 and zero3 at world 2-3 (only the adapters reach the
// plugins; the base stays frozen), exported as a PEFT folder; checkpoints hold only the adapter
// and resume; bad [adapter] keys refused at start with exit code 2 naming the key.
#include <gtest/gtest.h>

#include <filesystem>
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
  const Result ref = run("lora-ref", lora(1, 12, "ddp"));
  EXPECT_RUN_OK(ref);
  const Weights w_ref = adapter(ref);
  ASSERT_EQ(w_ref.size(), 2u * 7u * 2u);  // A and B of 7 linears in 2 layers
  EXPECT_TRUE(w_ref.count("base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
  EXPECT_TRUE(std::filesystem::exists(ref.dir + "/out/hf/adapter_config.json"));
  EXPECT_FALSE(std::filesystem::exists(ref.dir + "/out/hf/model.safetensors"));
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

TEST(LoraE2E, CheckpointHoldsOnlyTheAdapterAndResumesOnAnotherWorldSize) {
  const Result full = run("lora-full", lora(2, 6, "zero2"));
  EXPECT_RUN_OK(full);
  Shape first = lora(2, 6, "zero2");
  first.steps = 3;
  const Result a = run("lora-part", first);
  EXPECT_RUN_OK(a);
  const std::string ckpt = newest_checkpoint(a.dir + "/out/checkpoints");
  auto f = ciuic::model::SafetensorsFile::open(ckpt + "/rank_00000.safetensors");
  for (const auto& e : f->entries())
    EXPECT_EQ(e.name.find("embed_tokens"), std::string::npos) << e.name;
  const Result b = run("lora-resume", lora(3, 4, "zero2"), {"--resume", ckpt});
  EXPECT_RUN_OK(b);
  EXPECT_LT(max_rel(adapter(b), adapter(full)), 1e-6);
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
      {"adapter.dropout=0.1", {"dropout", "activation_checkpointing"}},
  };
  int i = 0;
  for (const auto& [set, parts] : cases) {
    std::vector<std::string> args = {"--set", set};
    if (set.starts_with("adapter.dropout"))
      args = with(args, {"--set", "model.activation_checkpointing=true"});
    const Result r = run("lora-bad" + std::to_string(i++), lora(1, 12, "ddp"), args, 60);
    EXPECT_EQ(r.code, 2) << set << "\n" << r.log();
    for (const auto& p : parts)
      EXPECT_NE(r.err.find(p), std::string::npos) << set << " missing " << p << "\n" << r.log();
  }
}

}  // namespace
