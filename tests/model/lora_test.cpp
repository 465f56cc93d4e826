// LoRA against PEFT 0.21.2 (tests/fixtures/gen_lora.py): a llama (all-linear) and a qwen2
// (q_proj + v_proj, rslora, tied, biases, a sliding layer) adapter loaded from PEFT's own
// save_pretrained files: logits and loss to 1e-5, adapter gradients to 1e-4 (relative, fp32),
// with and without activation checkpointing; the base frozen (no gradient); PEFT's init; bad
// target names and adapters for another base refused naming the key or tensor.
#include <cmath>
#include <filesystem>
#include <fstream>

#include <ATen/core/grad_mode.h>
#include <ATen/ops/ones.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ciuic/files.h>

#include "model/llama.h"
#include "model/lora.h"
#include "model_test_util.h"

namespace ciuic::model {
namespace {

using testing::expect_error;
using testing::max_rel_diff;

const SafetensorsReader& want() {
  static const SafetensorsReader r =
      SafetensorsReader::open(testing::fixture("lora/expected.safetensors"));
  return r;
}

LoraSpec spec_of(const std::string& c) {
  std::ifstream in(testing::fixture("lora/cases.json"));
  const auto j = nlohmann::json::parse(in)[c];
  LoraSpec s;
  s.r = j["r"].get<int64_t>();
  s.alpha = j["alpha"].get<double>();
  s.rslora = j["rslora"].get<bool>();
  if (j["targets"].is_string())
    s.target_names = {j["targets"].get<std::string>()};
  else
    s.target_names = j["targets"].get<std::vector<std::string>>();
  s.targets = lora_target_slots(s.target_names, "target_modules");
  return s;
}

std::unique_ptr<LlamaModel> load(const std::string& c) {
  std::ifstream in(testing::fixture("lora/cases.json"));
  const std::string base = nlohmann::json::parse(in)[c]["base"].get<std::string>();
  auto m = LlamaModel::from_pretrained(testing::fixture("families/" + base), at::kFloat, at::kCPU);
  m->enable_lora(spec_of(c));
  m->load_lora(
      SafetensorsReader::open(testing::fixture("lora/" + c + "/adapter_model.safetensors")));
  return m;
}

class LoraVsPeft : public ::testing::TestWithParam<std::string> {};

TEST_P(LoraVsPeft, LogitsLossAndAdapterGradients) {
  const std::string c = GetParam();
  for (bool ckpt : {false, true}) {
    SCOPED_TRACE(ckpt ? "checkpointed" : "plain");
    auto m = load(c);
    m->set_activation_checkpointing(ckpt);
    const at::Tensor ids = want().tensor(c + ".input_ids"), labels = want().tensor(c + ".labels");
    {
      at::NoGradGuard ng;
      EXPECT_LT(max_rel_diff(m->forward(ids, at::Tensor(), false), want().tensor(c + ".logits")),
                1e-5);
    }
    at::Tensor loss = m->loss_sum(ids, labels, at::Tensor(), false);
    EXPECT_LT(max_rel_diff(loss, want().tensor(c + ".loss_sum")), 1e-5);
    loss.backward();
    const auto trainable = m->trainable_parameters();
    EXPECT_EQ(trainable.size(), m->lora_parameters().size());
    for (const auto& [name, t] : trainable) {
      SCOPED_TRACE(name);
      ASSERT_TRUE(t.grad().defined());
      EXPECT_LT(max_rel_diff(t.grad(), want().tensor(c + ".grad.base_model.model." + name)), 1e-4);
    }
    for (const auto& [name, t] : m->named_parameters()) {
      EXPECT_FALSE(t.requires_grad()) << name;
      EXPECT_FALSE(t.grad().defined()) << name;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cases, LoraVsPeft, ::testing::Values("llama", "qwen2"));

// merge_lora() with PEFT's adapter after its 3 AdamW steps equals PEFT's merge_and_unload().
TEST(Lora, MergeEqualsPeftMergeAndUnload) {
  for (const std::string c : {"llama", "qwen2"}) {
    SCOPED_TRACE(c);
    auto m = load(c);
    {
      at::NoGradGuard ng;
      for (const auto& [name, t] : m->lora_parameters())
        t.copy_(want().tensor(c + ".adamw3.base_model.model." + name));
    }
    m->merge_lora();
    for (auto& w : m->lora_parameters()) {
      at::NoGradGuard ng;
      w.second.zero_();  // the merged base alone
    }
    at::NoGradGuard ng;
    EXPECT_LT(max_rel_diff(m->forward(want().tensor(c + ".input_ids"), at::Tensor(), false),
                           want().tensor(c + ".adamw3.merged.logits")),
              1e-5);
  }
}

// The PEFT folder ciuic writes (write_peft_folder): check_peft_export.py loads it with
// peft.PeftModel.from_pretrained on the same base and compares with ciuic's logits, saved beside.
TEST(Lora, ExportedPeftFolder) {
  for (const std::string c : {"llama", "qwen2"}) {
    auto m = load(c);
    {
      at::NoGradGuard ng;
      for (const auto& [name, t] : m->lora_parameters()) t.mul_(-1.5);  // not the fixture's adapter
    }
    const std::string dir = testing::temp_dir(c);
    std::ifstream in(testing::fixture("lora/cases.json"));
    const std::string base = nlohmann::json::parse(in)[c]["base"].get<std::string>();
    write_peft_folder(dir + "/adapter",
                      peft_adapter_config(*m->lora(), testing::fixture("families/" + base)),
                      m->trainable_parameters(), at::kFloat);
    at::NoGradGuard ng;
    write_safetensors(
        dir + "/ciuic.safetensors",
        {{"input_ids", want().tensor(c + ".input_ids")},
         {"logits", m->forward(want().tensor(c + ".input_ids"), at::Tensor(), false)}});
    // And it reads back (continue training from a PEFT folder).
    auto again =
        LlamaModel::from_pretrained(testing::fixture("families/" + base), at::kFloat, at::kCPU);
    const std::string cfg = dir + "/adapter/adapter_config.json";
    again->enable_lora(lora_spec_from_peft(read_peft_adapter_config(cfg), cfg));
    again->load_lora(SafetensorsReader::open(dir + "/adapter/adapter_model.safetensors"));
    EXPECT_EQ(max_rel_diff(again->forward(want().tensor(c + ".input_ids"), at::Tensor(), false),
                           m->forward(want().tensor(c + ".input_ids"), at::Tensor(), false)),
              0.0);
  }
}

TEST(Lora, PeftInitialisation) {
  auto m =
      LlamaModel::from_pretrained(testing::fixture("families/llama_pad"), at::kFloat, at::kCPU);
  LoraSpec s;
  s.r = 4;
  s.targets = lora_target_slots({"all-linear"}, "k");
  m->enable_lora(s);
  m->init_lora(7);
  for (const auto& [name, t] : m->lora_parameters()) {
    SCOPED_TRACE(name);
    if (name.ends_with("lora_B.weight")) {
      EXPECT_EQ(t.abs().max().item<double>(), 0.0);
    } else {  // kaiming_uniform_(a = sqrt(5)) = U(-1/sqrt(in), 1/sqrt(in))
      const double bound = 1.0 / std::sqrt(static_cast<double>(t.size(1)));
      EXPECT_LE(t.abs().max().item<double>(), bound);
      EXPECT_GT(t.abs().max().item<double>(), 0.8 * bound);
    }
  }
  // The model with B = 0 computes the base model's logits.
  auto base =
      LlamaModel::from_pretrained(testing::fixture("families/llama_pad"), at::kFloat, at::kCPU);
  const at::Tensor ids = want().tensor("llama.input_ids");
  at::NoGradGuard ng;
  EXPECT_EQ(
      max_rel_diff(m->forward(ids, at::Tensor(), false), base->forward(ids, at::Tensor(), false)),
      0.0);
}

TEST(Lora, TargetsThatMatchNothingListTheLinearModules) {
  expect_error(
      [] {
        lora_target_slots({"q_proj", "qkv_proj"}, "[adapter] target_modules");
      },
      {"[adapter] target_modules", "qkv_proj",
       "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj"});
  expect_error([] { lora_target_slots({}, "[adapter] target_modules"); },
               {"[adapter] target_modules", "empty"});
}

TEST(Lora, AnAdapterForAnotherRankOrBaseIsRefusedNamingTheTensor) {
  auto m =
      LlamaModel::from_pretrained(testing::fixture("families/llama_pad"), at::kFloat, at::kCPU);
  LoraSpec s = spec_of("llama");
  s.r = 8;
  m->enable_lora(s);
  expect_error(
      [&] {
        m->load_lora(
            SafetensorsReader::open(testing::fixture("lora/llama/adapter_model.safetensors")));
      },
      {"adapter_model.safetensors",
       "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"});
  auto q = LlamaModel::from_pretrained(testing::fixture("families/qwen2"), at::kFloat, at::kCPU);
  q->enable_lora(spec_of("qwen2"));
  expect_error(
      [&] {
        q->load_lora(
            SafetensorsReader::open(testing::fixture("lora/llama/adapter_model.safetensors")));
      },
      {"adapter_model.safetensors", "base_model.model.model.layers.0"});
}

// adapter_config.json is read as every JSON input (ciuic/files.h, ciuic/json.h): a regular file of
// at most kMaxJsonInputBytes, nested at most 128 deep, and a value of the wrong type is a clear
// UsageError (exit 2) naming the file and key, never a JSON library exception.
TEST(Lora, AdapterConfigFileIsBoundedAndTyped) {
  const std::string dir = testing::temp_dir("cfg"), path = dir + "/adapter_config.json";
  auto usage = [&](const std::string& text, std::initializer_list<std::string> parts) {
    std::ofstream(path, std::ios::trunc) << text;
    try {
      lora_spec_from_peft(read_peft_adapter_config(path), path);
      ADD_FAILURE() << "accepted " << text;
    } catch (const UsageError& e) {
      for (const auto& p : parts)
        EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << e.what();
    }
  };
  EXPECT_EQ(lora_spec_from_peft(
                read_peft_adapter_config(testing::fixture("lora/llama/adapter_config.json")), "x")
                .r,
            4);
  // Each was nlohmann's type_error, uncaught (the fuzz target's first finds).
  usage("{\"peft_type\": 1}", {path, "peft_type must be a string, got 1"});
  usage("{\"peft_type\": \"LORA\", \"bias\": false, \"r\": 2}", {path, "bias must be a string"});
  usage(
      "{\"peft_type\": \"LORA\", \"r\": 1e300, \"lora_alpha\": 1, \"target_modules\": \"q_proj\"}",
      {path, "r must be an integer, got 1e+300"});
  usage(
      "{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 1, \"lora_dropout\": \"x\", "
      "\"target_modules\": \"q_proj\"}",
      {path, "lora_dropout must be a number"});
  usage("{\"peft_type\": \"LORA\", \"r\": 2, \"lora_alpha\": 1, \"target_modules\": [3]}",
        {path, "malformed adapter config"});
  usage("{oops", {path, "malformed JSON"});
  usage(std::string(200, '[') + std::string(200, ']'), {path, "nested deeper than 128"});
  std::ofstream(path, std::ios::trunc).close();
  std::filesystem::resize_file(path, kMaxJsonInputBytes + 1);  // sparse: nothing is written
  try {
    read_peft_adapter_config(path);
    ADD_FAILURE() << "read a file over the bound";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("over the limit of 268435456 bytes"), std::string::npos)
        << e.what();
  }
  try {
    read_peft_adapter_config("/dev/zero");
    ADD_FAILURE() << "read /dev/zero";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("not a regular file"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ciuic::model
