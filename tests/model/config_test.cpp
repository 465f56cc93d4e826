// LlamaConfig: both rope forms, DeepSeek's published configs, errors, to_json round trip,
// rotary frequencies against transformers (tests/fixtures/model/rope.json).
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ciuic/files.h>

#include "../support/deep_json.h"
#include "model/config.h"
#include "model/llama.h"
#include "model/llama_ops.h"
#include "model_test_util.h"

namespace ciuic::model {
namespace {

using nlohmann::json;
using testing::expect_error;
using testing::fixture;

// deepseek-ai/deepseek-coder-6.7b-base config.json (older form: rope_theta + linear rope_scaling).
const char* kDeepSeekCoder = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 32013, "eos_token_id": 32014,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008,
  "max_position_embeddings": 16384, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 32, "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
  "rope_scaling": {"factor": 4.0, "type": "linear"}, "rope_theta": 100000,
  "tie_word_embeddings": false, "torch_dtype": "bfloat16", "transformers_version": "4.33.1",
  "use_cache": true, "vocab_size": 32256})";

// deepseek-ai/deepseek-llm-7b-base config.json.
const char* kDeepSeekLlm7b = R"({
  "architectures": ["LlamaForCausalLM"], "bos_token_id": 100000, "eos_token_id": 100001,
  "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 11008,
  "max_position_embeddings": 4096, "model_type": "llama", "num_attention_heads": 32,
  "num_hidden_layers": 30, "num_key_value_heads": 32, "pretraining_tp": 1, "rms_norm_eps": 1e-06,
  "rope_scaling": null, "rope_theta": 10000.0, "tie_word_embeddings": false,
  "torch_dtype": "bfloat16", "transformers_version": "4.33.1", "use_cache": true, "vocab_size": 102400})";

LlamaConfig parse(const std::string& text) {
  return LlamaConfig::from_json(json::parse(text), "cfg.json");
}

TEST(LlamaConfig, ParsesTransformers5Form) {
  const LlamaConfig c = LlamaConfig::from_file(fixture("tiny/config.json"));
  EXPECT_EQ(c.vocab_size, 300);
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 128);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.num_key_value_heads, 2);
  EXPECT_EQ(c.head_dim, 16);
  EXPECT_EQ(c.rope_type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rope_scaling_factor, 1.0);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_FALSE(c.pad_token_id.has_value());
}

TEST(LlamaConfig, ParsesOlderFormWithLinearScalingAndHeadDim) {
  const LlamaConfig c = LlamaConfig::from_file(fixture("tiny_linear/config.json"));
  EXPECT_EQ(c.rope_type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_scaling_factor, 2.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500.0);
  EXPECT_EQ(c.head_dim, 24);  // given explicitly, not hidden / heads
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(c.torch_dtype, "bfloat16");
}

TEST(LlamaConfig, DeepSeekConfigsAndPublishedParameterCounts) {
  const LlamaConfig coder = parse(kDeepSeekCoder);
  EXPECT_EQ(coder.rope_type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(coder.rope_scaling_factor, 4.0);
  EXPECT_DOUBLE_EQ(coder.rope_theta, 100000.0);
  EXPECT_EQ(coder.head_dim, 128);
  EXPECT_EQ(coder.eos_token_id, 32014);
  EXPECT_EQ(coder.num_parameters(), 6740512768);  // "6.74B" on the model card
  const LlamaConfig llm = parse(kDeepSeekLlm7b);
  EXPECT_EQ(llm.rope_type, RopeType::kDefault);
  EXPECT_EQ(llm.num_parameters(), 6910365696);  // "7B": 6.91e9 parameters
  EXPECT_EQ(llm.num_parameters(false), 6910365696 - 2 * 102400 * 4096);
  // PaLM appendix B: 6 N (all matmul weights: everything but the input embedding) + 12 L H T.
  EXPECT_DOUBLE_EQ(llm.flops_per_token(4096),
                   6.0 * (6910365696.0 - 102400.0 * 4096.0) + 12.0 * 30 * 4096 * 4096);
}

TEST(LlamaConfig, RopeParametersFormAndDefaults) {
  const LlamaConfig c =
      parse(R"({"model_type": "llama", "hidden_size": 256, "num_attention_heads": 8,
      "intermediate_size": 512, "num_hidden_layers": 2, "vocab_size": 1000,
      "rope_parameters": {"rope_type": "linear", "factor": 8.0, "rope_theta": 250000.0},
      "eos_token_id": [5, 7], "tie_word_embeddings": true})");
  EXPECT_EQ(c.rope_type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_scaling_factor, 8.0);
  EXPECT_DOUBLE_EQ(c.rope_theta, 250000.0);
  EXPECT_EQ(c.num_key_value_heads, 8);  // defaults to num_attention_heads
  EXPECT_EQ(c.head_dim, 32);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{5, 7}));
  EXPECT_EQ(c.eos_token_id, 5);
  EXPECT_EQ(c.max_position_embeddings, 2048);  // transformers' default
}

TEST(LlamaConfig, ToJsonRoundTripsAndMatchesTransformersKeys) {
  for (const std::string& path :
       {fixture("tiny/config.json"), fixture("tiny_linear/config.json")}) {
    const LlamaConfig c = LlamaConfig::from_file(path);
    const json ours = c.to_json();
    EXPECT_EQ(LlamaConfig::from_json(ours, "to_json"), c) << path;
    EXPECT_EQ(ours["model_type"], "llama");
    std::ifstream in(path);
    const json theirs = json::parse(in);
    for (const char* k :
         {"vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
          "num_attention_heads", "num_key_value_heads", "head_dim", "max_position_embeddings",
          "rms_norm_eps", "tie_word_embeddings", "bos_token_id", "eos_token_id", "hidden_act"})
      EXPECT_EQ(ours[k], theirs[k]) << path << " key " << k;
  }
  const LlamaConfig coder = parse(kDeepSeekCoder);
  const json j = coder.to_json();
  EXPECT_EQ(j["rope_scaling"]["type"], "linear");
  EXPECT_EQ(j["rope_parameters"]["rope_type"], "linear");
  EXPECT_EQ(j["rope_parameters"]["rope_theta"], 100000.0);
  EXPECT_EQ(LlamaConfig::from_json(j, "to_json"), coder);
}

TEST(LlamaConfig, WithOverrides) {
  const LlamaConfig base = parse(kDeepSeekLlm7b);
  LlamaConfig c = base.with_overrides(
      json{{"rope_scaling_type", "linear"}, {"rope_scaling_factor", 4.0}, {"num_hidden_layers", 2}},
      "recipe.toml [model.config]");
  EXPECT_EQ(c.rope_type, RopeType::kLinear);
  EXPECT_DOUBLE_EQ(c.rope_scaling_factor, 4.0);
  EXPECT_EQ(c.num_hidden_layers, 2);
  EXPECT_EQ(c.vocab_size, 102400);
  c = base.with_overrides(json{{"hidden_size", 256}, {"num_attention_heads", 4}}, "r");
  EXPECT_EQ(c.head_dim, 64);  // follows the new sizes
  EXPECT_EQ(c.num_key_value_heads, 4);
  c = c.with_overrides(json{{"rope_scaling_type", "none"}, {"rope_theta", 500000.0}}, "r");
  EXPECT_EQ(c.rope_type, RopeType::kDefault);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  expect_error(
      [&] {
        base.with_overrides(json{{"rope_scaling_type", "yarn"}}, "recipe.toml");
      },
      {"recipe.toml", "rope_scaling_type", "\"none\" or \"linear\""});
  expect_error(
      [&] {
        base.with_overrides(json{{"num_key_value_heads", 5}}, "recipe.toml");
      },
      {"recipe.toml", "num_key_value_heads", "multiple"});
}

TEST(LlamaConfig, Errors) {
  expect_error(
      [] {
        parse(R"({"model_type": "llama", "rope_scaling": {"type": "dynamic", "factor": 2.0}})");
      },
      {"cfg.json", "`rope_scaling.type`", "\"dynamic\" is not supported"});
  expect_error(
      [] {
        parse(R"({"rope_parameters": {"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e4}})");
      },
      {"cfg.json", "`rope_parameters.rope_type`", "\"yarn\""});
  expect_error([] { parse(R"({"rope_scaling": {"rope_type": "linear"}})"); },
               {"cfg.json", "`rope_scaling.factor`", "missing"});
  expect_error(
      [] { parse(R"({"rope_parameters": {"full_attention": {"rope_type": "default"}}})"); },
      {"`rope_parameters.full_attention`", "per-layer"});
  expect_error(
      [] {
        parse(R"({"rope_scaling": {"type": "linear", "factor": 2, "partial_rotary_factor": 0.5}})");
      },
      {"partial_rotary_factor"});
  expect_error([] { parse(R"({"model_type": "falcon"})"); },
               {"cfg.json", "`model_type`", "\"falcon\" is not supported",
                "supported: \"llama\", \"mistral\", \"qwen2\", \"qwen3\", \"gemma3_text\""});
  expect_error([] { parse(R"({"hidden_act": "gelu"})"); }, {"`hidden_act`", "\"gelu\""});
  expect_error([] { parse(R"({"attention_bias": true})"); }, {"`attention_bias`", "biases"});
  expect_error([] { parse(R"({"hidden_size": "4096"})"); },
               {"`hidden_size`", "expected an integer", "\"4096\""});
  expect_error([] { parse(R"({"rope_theta": "big"})"); }, {"`rope_theta`", "expected a number"});
  expect_error([] { parse(R"({"tie_word_embeddings": 1})"); },
               {"`tie_word_embeddings`", "true or false"});
  expect_error([] { parse(R"({"num_attention_heads": 32, "num_key_value_heads": 6})"); },
               {"`num_key_value_heads`", "multiple"});
  expect_error([] { parse(R"({"hidden_size": 60, "num_attention_heads": 4, "head_dim": 15})"); },
               {"`head_dim`", "even"});
  expect_error([] { parse(R"({"vocab_size": 100, "eos_token_id": 100})"); },
               {"`eos_token_id`", "outside"});
  expect_error([] { parse(R"({"vocab_size": 0})"); }, {"`vocab_size`", "positive"});
  // Shapes no tensor can have: a message, not std::bad_alloc or a storage-size overflow inside
  // LibTorch (issue 16 item 6).
  expect_error([] { parse(R"({"vocab_size": 4611686018427387904})"); },
               {"`vocab_size`", "larger than 2^31 - 1"});
  expect_error([] { parse(R"({"num_hidden_layers": 1000000000})"); },
               {"`num_hidden_layers`", "billion parameters"});
  EXPECT_NO_THROW(parse(kDeepSeekLlm7b));  // 7B is far inside the bound
  expect_error([] { parse("[1, 2]"); }, {"cfg.json", "JSON object"});
  expect_error([] { LlamaConfig::from_file("/nonexistent/config.json"); },
               {"/nonexistent/config.json", "cannot open"});
  const std::string bad = testing::temp_dir("cfg") + "/config.json";
  std::ofstream(bad) << "{\"hidden_size\": 64,";
  expect_error([&] { LlamaConfig::from_file(bad); }, {bad, "malformed JSON"});
  // Nested 100,000 deep: refused before a value is built (issue 27; ciuic/json.h).
  std::ofstream(bad) << "{\"hidden_size\": 64, \"x\": "
                     << ciuic_test::nested_objects(ciuic_test::kDeep) << "}";
  expect_error(
      [&] { LlamaConfig::from_file(bad); },
      {bad + ": JSON nested deeper than 128 levels (arrays and objects) at line 1, column ",
       "at most 128"});
  // Special files are refused at once (issue 16 item 3): /dev/zero would grow memory forever, a
  // FIFO without a writer would block forever; a file over the bound is refused before reading.
  expect_error([] { LlamaConfig::from_file("/dev/zero"); },
               {"cannot read model config (an HF config.json) /dev/zero: not a regular file (a "
                "character device)"});
  const std::string fifo = testing::temp_dir("cfg-fifo") + "/config.json";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << fifo;
  expect_error([&] { LlamaConfig::from_file(fifo); },
               {fifo, "not a regular file (a FIFO (named pipe))"});
  const std::string huge = testing::temp_dir("cfg-huge") + "/config.json";
  std::ofstream(huge).close();
  std::filesystem::resize_file(huge, kMaxJsonInputBytes + 1);  // sparse: nothing is written
  expect_error([&] { LlamaConfig::from_file(huge); }, {huge, "over the limit of 268435456 bytes"});
}

// What a family does not implement is refused by name, with the expected values (issue 30 item 6).
TEST(LlamaConfig, FamilyOptionsOutsideTheImplementationAreRefused) {
  expect_error([] { parse(R"({"model_type": "gemma3"})"); },
               {"`model_type`", "\"gemma3\"", "gemma3_text"});
  expect_error([] { parse(R"({"model_type": "gemma3_text", "final_logit_softcapping": 30.0})"); },
               {"`final_logit_softcapping`", "not supported", "expected null, found 30.0"});
  expect_error([] { parse(R"({"model_type": "gemma3_text", "attn_logit_softcapping": 50.0})"); },
               {"`attn_logit_softcapping`", "expected null"});
  expect_error(
      [] { parse(R"({"model_type": "gemma3_text", "use_bidirectional_attention": true})"); },
      {"`use_bidirectional_attention`", "expected false"});
  expect_error([] { parse(R"({"model_type": "gemma3_text", "hidden_activation": "gelu"})"); },
               {"`hidden_activation`", "\"gelu\"", "expected \"gelu_pytorch_tanh\""});
  expect_error([] { parse(R"({"model_type": "qwen2", "hidden_act": "gelu"})"); },
               {"`hidden_act`", "model type \"qwen2\"", "expected \"silu\""});
  expect_error([] { parse(R"({"model_type": "qwen3", "attention_bias": true})"); },
               {"`attention_bias`", "qwen3", "expected false"});
  expect_error(
      [] { parse(R"({"model_type": "qwen2", "rope_scaling": {"type": "yarn", "factor": 4.0}})"); },
      {"`rope_scaling.type`", "\"yarn\" is not supported", "\"default\", \"linear\", \"llama3\""});
  expect_error(
      [] {
        parse(
            R"({"model_type": "qwen2", "num_hidden_layers": 2, "layer_types": ["full_attention"]})");
      },
      {"`layer_types`", "1 entries, num_hidden_layers is 2"});
  expect_error(
      [] {
        parse(
            R"({"model_type": "qwen2", "num_hidden_layers": 2, "layer_types": ["full_attention", "chunked_attention"]})");
      },
      {"`layer_types[1]`", "\"full_attention\" or \"sliding_attention\"", "\"chunked_attention\""});
  expect_error([] { parse(R"({"model_type": "mistral", "sliding_window": 0})"); },
               {"`sliding_window`", "positive integer or null"});
  expect_error(
      [] {
        parse(
            R"({"model_type": "gemma3_text", "rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0}}})");
      },
      {"`rope_parameters.sliding_attention.rope_type`", "\"linear\"", "expected \"default\""});
  expect_error(
      [] {
        parse(R"({"model_type": "gemma3_text", "rope_parameters": {"rope_type": "default"}})");
      },
      {"`rope_parameters.rope_type`", "one rope dict per layer type"});
  expect_error(
      [] {
        parse(
            R"({"model_type": "llama", "rope_parameters": {"full_attention": {"rope_type": "default"}}})");
      },
      {"`rope_parameters.full_attention`", "per-layer"});
  expect_error(
      [] { parse(R"({"vocab_size": 100, "pad_token_id": -101})"); },
      {"`pad_token_id`", "-101 is outside the vocabulary [-100, 100)", "counts from the end"});
  // Accepted as transformers does: a negative pad counts from the end; Mistral ignores layer_types.
  EXPECT_EQ(parse(R"({"vocab_size": 100, "pad_token_id": -1})").padding_idx(), 99);
  EXPECT_EQ(parse(R"({"vocab_size": 100, "pad_token_id": 7})").padding_idx(), 7);
  EXPECT_EQ(parse(R"({"vocab_size": 100})").padding_idx(), -1);
  const LlamaConfig m =
      parse(R"({"model_type": "mistral", "num_hidden_layers": 2, "sliding_window": 8,
      "layer_types": ["full_attention", "full_attention"]})");
  EXPECT_TRUE(m.layer_slides(0) && m.layer_slides(1));
}

// Family defaults for absent keys are transformers' <Family>Config defaults; a recipe's
// [model.config] may switch the family and change the layer count (layer types re-derived).
TEST(LlamaConfig, FamilyDefaultsAndOverrides) {
  const LlamaConfig q =
      parse(R"({"model_type": "qwen3", "hidden_size": 64, "num_attention_heads": 32})");
  EXPECT_EQ(q.head_dim, 128);  // Qwen3Config's fixed default, not hidden / heads
  EXPECT_EQ(q.num_key_value_heads, 32);
  EXPECT_EQ(q.vocab_size, 151936);
  EXPECT_FALSE(q.eos_token_id.has_value());
  const LlamaConfig g = parse(R"({"model_type": "gemma3_text", "num_hidden_layers": 7})");
  EXPECT_EQ(g.sliding_layers, (std::vector<uint8_t>{1, 1, 1, 1, 1, 0, 1}));  // pattern 6
  EXPECT_EQ(g.padding_idx(), 0);
  EXPECT_TRUE(g.tie_word_embeddings);
  EXPECT_DOUBLE_EQ(g.rope_theta, 1e6);
  EXPECT_DOUBLE_EQ(g.rope_local_theta, 1e4);
  const LlamaConfig g2 = g.with_overrides(
      json{{"num_hidden_layers", 4}, {"rope_theta", 2e5}, {"rope_local_base_freq", 50.0}}, "r");
  EXPECT_EQ(g2.sliding_layers, (std::vector<uint8_t>{1, 1, 1, 1}));
  EXPECT_DOUBLE_EQ(g2.rope_theta, 2e5);
  EXPECT_DOUBLE_EQ(g2.rope_local_theta, 50.0);
  const LlamaConfig qw = LlamaConfig{}.with_overrides(json{{"model_type", "qwen2"},
                                                           {"hidden_size", 64},
                                                           {"num_attention_heads", 4},
                                                           {"num_key_value_heads", 2},
                                                           {"num_hidden_layers", 3},
                                                           {"use_sliding_window", true},
                                                           {"sliding_window", 16},
                                                           {"max_window_layers", 1}},
                                                      "recipe.toml [model.config]");
  EXPECT_EQ(qw.family, ModelFamily::kQwen2);
  EXPECT_TRUE(qw.qkv_bias);
  EXPECT_EQ(qw.vocab_size, 151936);  // Qwen2's default, not Llama's
  EXPECT_EQ(qw.sliding_layers, (std::vector<uint8_t>{0, 1, 1}));
  EXPECT_EQ(LlamaConfig::from_json(qw.to_json(), "to_json"), qw);
  expect_error(
      [] {
        LlamaConfig{}.with_overrides(json{{"model_type", "bert"}}, "recipe.toml");
      },
      {"recipe.toml", "\"bert\" is not supported"});
}

TEST(LlamaConfig, ParameterSpecsAgreeWithCount) {
  std::vector<LlamaConfig> configs{parse(kDeepSeekCoder), parse(kDeepSeekLlm7b)};
  for (const char* f :
       {"mistral", "qwen2", "qwen3", "gemma3", "llama_pad"})  // every family's tensors
    configs.push_back(
        LlamaConfig::from_file(fixture(std::string("families/") + f + "/config.json")));
  for (const LlamaConfig& c : configs) {
    int64_t n = 0;
    for (const auto& s : llama_parameter_specs(c)) {
      int64_t k = 1;
      for (int64_t d : s.shape) k *= d;
      n += k;
    }
    EXPECT_EQ(n, c.num_parameters());
  }
}

// Inverse rotary frequencies against transformers' rope initialisers (default, linear, llama3).
TEST(Rope, InverseFrequenciesMatchTransformers) {
  std::ifstream in(fixture("rope.json"));
  const json cases = json::parse(in);
  ASSERT_GE(cases.size(), 4u);
  for (const auto& c : cases) {
    const LlamaConfig cfg =
        LlamaConfig::from_json(json::parse(c["config"].get<std::string>()), "rope.json");
    EXPECT_EQ(rope_type_name(cfg.rope_type), c["rope_type"].get<std::string>());
    const at::Tensor ours = rope_inv_freq(cfg);
    const auto want = c["inv_freq"].get<std::vector<double>>();
    ASSERT_EQ(ours.numel(), static_cast<int64_t>(want.size()));
    const at::Tensor expect = at::tensor(want, at::kDouble);
    EXPECT_LE(testing::max_rel_diff(ours, expect), 1e-6) << c["config"];
    // element-wise relative check too: low frequencies are tiny
    const at::Tensor rel = ours.to(at::kDouble).sub(expect).abs().div(expect.abs());
    EXPECT_LE(rel.max().item<double>(), 1e-6) << c["config"];
  }
}

}  // namespace
}  // namespace ciuic::model
