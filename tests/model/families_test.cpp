// The model families (mistral, qwen2, qwen3, gemma3_text) and Llama's negative pad_token_id
// against transformers: tiny random models written by transformers' save_pretrained
// (tests/fixtures/gen_model_families.py), each exercising its family's switches. Logits and loss
// to 1e-5, every parameter's gradient to 1e-4 (relative, fp32), with and without activation
// checkpointing; packed rows with a window shorter than the documents; greedy decoding with a
// KV cache past the window; parameter names, order and counts (also of released models' configs);
// the export written back for transformers (check_family_exports.py loads it).
#include <filesystem>
#include <fstream>
#include <map>

#include <ATen/ops/count_nonzero.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/hf_export.h"
#include "model/llama.h"
#include "model_test_util.h"

namespace ciuic::model {
namespace {

using nlohmann::json;
using testing::expect_error;
using testing::max_rel_diff;

std::string family_dir(const std::string& c) { return testing::fixture("families/" + c); }

const SafetensorsReader& want() {
  static const SafetensorsReader r =
      SafetensorsReader::open(testing::fixture("families/expected.safetensors"));
  return r;
}

const json& meta() {
  static const json j = [] {
    std::ifstream in(testing::fixture("families/families.json"));
    return json::parse(in);
  }();
  return j;
}

std::unique_ptr<LlamaModel> load(const std::string& c) {
  return LlamaModel::from_pretrained(family_dir(c), at::kFloat, at::kCPU);
}

TEST(Families, ConfigsNamesAndCountsMatchTransformers) {
  const std::map<std::string, ModelFamily> family{{"mistral", ModelFamily::kMistral},
                                                  {"qwen2", ModelFamily::kQwen2},
                                                  {"qwen3", ModelFamily::kQwen3},
                                                  {"gemma3", ModelFamily::kGemma3Text},
                                                  {"llama_pad", ModelFamily::kLlama}};
  for (const char* c : testing::kFamilyCases) {
    SCOPED_TRACE(c);
    const LlamaConfig cfg = LlamaConfig::from_file(family_dir(c) + "/config.json");
    EXPECT_EQ(cfg.family, family.at(c));
    EXPECT_EQ(model_type_name(cfg.family), meta()[c]["model_type"].get<std::string>());
    EXPECT_EQ(cfg.num_parameters(), meta()[c]["num_parameters"].get<int64_t>());
    std::vector<std::string> names;
    for (const auto& s : llama_parameter_specs(cfg)) names.push_back(s.name);
    EXPECT_EQ(names, meta()[c]["parameters"].get<std::vector<std::string>>());
    EXPECT_EQ(LlamaConfig::from_json(cfg.to_json(), "to_json"),
              cfg);  // the export's config reads back
  }
  // The switches as read.
  const LlamaConfig mistral = LlamaConfig::from_file(family_dir("mistral") + "/config.json");
  EXPECT_EQ(mistral.sliding_window, 4);
  EXPECT_EQ(mistral.sliding_layers, (std::vector<uint8_t>{1, 1}));
  const LlamaConfig qwen2 = LlamaConfig::from_file(family_dir("qwen2") + "/config.json");
  EXPECT_TRUE(qwen2.qkv_bias && qwen2.tie_word_embeddings && !qwen2.qk_norm);
  EXPECT_EQ(qwen2.sliding_layers, (std::vector<uint8_t>{0, 1}));
  const LlamaConfig qwen3 = LlamaConfig::from_file(family_dir("qwen3") + "/config.json");
  EXPECT_TRUE(qwen3.qk_norm && !qwen3.qkv_bias);
  EXPECT_EQ(qwen3.head_dim, 12);
  const LlamaConfig gemma = LlamaConfig::from_file(family_dir("gemma3") + "/config.json");
  EXPECT_TRUE(gemma.gemma_norm && gemma.sandwich_norms && gemma.scale_embeddings && gemma.qk_norm &&
              gemma.local_rope);
  EXPECT_EQ(gemma.hidden_act, Activation::kGeluTanh);
  EXPECT_EQ(gemma.sliding_layers, (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(gemma.sliding_window_pattern, 2);
  EXPECT_DOUBLE_EQ(gemma.query_pre_attn_scalar, 20.0);
  EXPECT_DOUBLE_EQ(gemma.rope_local_theta, 100.0);
  EXPECT_DOUBLE_EQ(gemma.rope_theta, 5000.0);
  EXPECT_EQ(gemma.rope_type, RopeType::kLinear);
  const LlamaConfig pad = LlamaConfig::from_file(family_dir("llama_pad") + "/config.json");
  EXPECT_EQ(pad.pad_token_id, -1);
  EXPECT_EQ(pad.padding_idx(), pad.vocab_size - 1);
}

// Released models' config.json: transformers' num_parameters() and windowed layers.
TEST(Families, PublishedConfigsCountLikeTransformers) {
  ASSERT_GE(meta()["published"].size(), 9u);
  for (const auto& [name, p] : meta()["published"].items()) {
    SCOPED_TRACE(name);
    const LlamaConfig c = LlamaConfig::from_json(json::parse(p["config"].get<std::string>()), name);
    EXPECT_EQ(c.num_parameters(),
              p["num_parameters"].get<int64_t>());  // specs vs count: config_test
    const bool any_window = !p["sliding_window"].is_null() && p["sliding_layers"].is_array();
    for (int64_t l = 0; l < c.num_hidden_layers; ++l) {
      const bool slides =
          p["sliding_layers"].is_array()
              ? p["sliding_layers"][static_cast<size_t>(l)].get<bool>() && any_window
              : !p["sliding_window"].is_null();
      EXPECT_EQ(c.layer_slides(l), slides) << "layer " << l;
    }
    if (c.sliding_window > 0) {
      EXPECT_EQ(c.sliding_window, p["sliding_window"].get<int64_t>());
    }
  }
}

TEST(Families, LogitsLossAndGradientsMatchTransformers) {
  for (const char* c : testing::kFamilyCases) {
    SCOPED_TRACE(c);
    const std::string k = c;
    auto m = load(c);
    const at::Tensor ids = want().tensor(k + ".input_ids");
    const at::Tensor labels = want().tensor(k + ".labels");
    const double dl = max_rel_diff(m->forward(ids, {}, false), want().tensor(k + ".logits"));
    const double dloss =
        max_rel_diff(m->loss_sum(ids, labels, {}, false), want().tensor(k + ".loss_sum"));
    std::printf("    %-10s logits %.2e  loss %.2e\n", c, dl, dloss);
    EXPECT_LE(dl, 1e-5);
    EXPECT_LE(dloss, 1e-5);
    for (bool ckpt : {false, true}) {
      m->set_activation_checkpointing(ckpt);
      for (auto& p : m->parameters()) p.mutable_grad() = at::Tensor();
      m->loss_sum(ids, labels, {}, false).backward();
      double worst = 0;
      for (const auto& [name, p] : m->named_parameters()) {
        ASSERT_TRUE(p.grad().defined()) << name;
        const double d = max_rel_diff(p.grad(), want().tensor(k + ".grad." + name));
        worst = std::max(worst, d);
        EXPECT_LE(d, 1e-4) << name << (ckpt ? " (checkpointed)" : "");
      }
      std::printf("    %-10s gradients, worst parameter %.2e%s\n", c, worst,
                  ckpt ? " (checkpointed)" : "");
    }
  }
}

// torch.nn.Embedding(padding_idx = pad): the padding row's lookups give it no gradient (pad -1 is
// the last row); a tied lm_head still gives it its part.
TEST(Families, PaddingRowGetsNoGradientFromTheLookup) {
  auto m = load("llama_pad");
  const at::Tensor ids = want().tensor("llama_pad.input_ids");
  const int64_t last = m->config().vocab_size - 1;
  ASSERT_GT(ids.eq(last).sum().item<int64_t>(), 0);
  m->loss_sum(ids, want().tensor("llama_pad.labels"), {}, false).backward();
  EXPECT_EQ(at::count_nonzero(m->embed_weight().grad()[last]).item<int64_t>(), 0);
  EXPECT_GT(at::count_nonzero(m->embed_weight().grad()[ids[0][0].item<int64_t>()]).item<int64_t>(),
            0);
  LlamaModel fresh(m->config(), at::kFloat, at::kCPU);
  fresh.init_random(1, 0.02);
  EXPECT_EQ(at::count_nonzero(fresh.embed_weight()[last]).item<int64_t>(),
            0);  // zeroed like transformers
  // Gemma (pad 0, tied): the row gets lm_head's gradient only, as in transformers (compared above).
  auto g = load("gemma3");
  g->loss_sum(want().tensor("gemma3.input_ids"), want().tensor("gemma3.labels"), {}, false)
      .backward();
  EXPECT_GT(at::count_nonzero(g->embed_weight().grad()[0]).item<int64_t>(), 0);
  LlamaModel gf(g->config(), at::kFloat, at::kCPU);
  gf.init_random(1, 0.02);
  for (const auto& [name, p] : gf.named_parameters())
    if (p.dim() == 1) {
      EXPECT_EQ(at::count_nonzero(p).item<int64_t>(), 0) << name << ": (1 + w) norms start at 0";
    }
}

TEST(Families, PackedRowsWithAWindowEqualDocumentsRunSeparately) {
  for (const char* c : {"mistral", "gemma3"}) {
    SCOPED_TRACE(c);
    const std::string k = c;
    auto m = load(c);
    const at::Tensor ids = want().tensor(k + ".packed.input_ids");
    const at::Tensor pos = want().tensor(k + ".packed.position_ids");
    for (bool ckpt : {false, true}) {
      m->set_activation_checkpointing(ckpt);
      EXPECT_LE(max_rel_diff(m->forward(ids, pos, true), want().tensor(k + ".packed.logits")),
                1e-5);
    }
  }
}

TEST(Families, GreedyGenerationPastTheWindowMatchesFullForwards) {
  for (const char* c : testing::kFamilyCases) {
    SCOPED_TRACE(c);
    const std::string k = c;
    auto m = load(c);
    const at::Tensor prompt = want().tensor(k + ".generate.prompt");
    const at::Tensor expect = want().tensor(k + ".generate.new_tokens");
    std::vector<int32_t> p;
    for (int64_t i = 0; i < prompt.size(1); ++i)
      p.push_back(static_cast<int32_t>(prompt[0][i].item<int64_t>()));
    const auto got = m->generate_greedy(p, expect.size(1), std::nullopt);
    ASSERT_EQ(static_cast<int64_t>(got.size()), expect.size(1));
    for (int64_t i = 0; i < expect.size(1); ++i)
      EXPECT_EQ(got[i], expect[0][i].item<int64_t>()) << "token " << i;
  }
}

// Exports every case; check_family_exports.py (ctest families_export_loads_in_transformers) loads
// them in transformers and compares weights and logits. Our own reload is identical too.
TEST(Families, ExportReloadsIdentically) {
  const std::string root = std::string(CIUIC_TEST_TMP) + "/model/families-export";
  for (const char* c : testing::kFamilyCases) {
    SCOPED_TRACE(c);
    auto m = load(c);
    const std::string out = root + "/" + c;
    HfExportOptions o;
    o.dtype = at::kFloat;
    write_hf_folder(out, m->config(), m->named_parameters(), o);
    auto back = LlamaModel::from_pretrained(out, at::kFloat, at::kCPU);
    LlamaConfig written = m->config();
    written.torch_dtype = "float32";  // the export's dtype
    EXPECT_EQ(back->config(), written);
    const auto a = m->named_parameters(), b = back->named_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].first, b[i].first);
      EXPECT_TRUE(at::equal(a[i].second, b[i].second)) << a[i].first;
    }
  }
}

}  // namespace
}  // namespace ciuic::model
