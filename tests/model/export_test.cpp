// Loading HF folders into LlamaModel (errors name file and tensor) and exporting them back with
// write_hf_folder (atomic, reloadable, identical logits).
#include <filesystem>
#include <fstream>
#include <functional>

#include <ATen/ops/equal.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/hf_export.h"
#include "model/llama.h"
#include "model_test_util.h"

namespace ciuic::model {
namespace {

namespace fs = std::filesystem;
using testing::expect_error;
using testing::expected;
using testing::fixture;

// A copy of the tiny fixture's weights with `edit` applied, written to a fresh folder.
std::string edited_weights(const std::string& name,
                           const std::function<void(NamedTensors&)>& edit) {
  const std::string dir = testing::temp_dir(name);
  auto r = SafetensorsReader::open(fixture("tiny"));
  NamedTensors t;
  for (const auto& n : r.names()) t.emplace_back(n, r.tensor(n));
  edit(t);
  write_safetensors(dir + "/model.safetensors", t);
  fs::copy_file(fixture("tiny/config.json"), dir + "/config.json");
  return dir;
}

TEST(LoadHf, ErrorsNameFileAndTensor) {
  const LlamaConfig cfg = LlamaConfig::from_file(fixture("tiny/config.json"));
  LlamaModel m(cfg, at::kFloat, at::kCPU);
  const std::string missing = edited_weights("missing", [](NamedTensors& t) {
    std::erase_if(t, [](auto& p) { return p.first == "model.layers.1.mlp.up_proj.weight"; });
  });
  expect_error([&] { m.load_hf(missing); },
               {missing, "missing tensor `model.layers.1.mlp.up_proj.weight`"});
  const std::string extra = edited_weights("extra", [](NamedTensors& t) {
    t.emplace_back("model.layers.2.mlp.up_proj.weight", at::randn({4}));
  });
  expect_error([&] { m.load_hf(extra); },
               {"model.safetensors", "unexpected tensor `model.layers.2.mlp.up_proj.weight`"});
  const std::string shape = edited_weights("shape", [](NamedTensors& t) {
    for (auto& [n, v] : t)
      if (n == "model.norm.weight") v = at::randn({32});
  });
  expect_error([&] { m.load_hf(shape); }, {"model.safetensors", "tensor `model.norm.weight`",
                                           "shape [32] in the file, [64] expected"});
  const std::string dtype = edited_weights("dtype", [](NamedTensors& t) {
    for (auto& [n, v] : t)
      if (n == "model.norm.weight") v = at::zeros({64}, at::kInt);
  });
  expect_error([&] { m.load_hf(dtype); }, {"tensor `model.norm.weight`", "dtype I32 in the file"});
  // Nothing was half-loaded by the failures above: a good load still gives transformers' logits.
  // Harmless extras are accepted: rotary buffers of old checkpoints, lm_head of a tied model.
  const std::string ok = edited_weights("ok", [](NamedTensors& t) {
    t.emplace_back("model.layers.0.self_attn.rotary_emb.inv_freq", at::randn({8}));
    t.emplace_back("lm_head.weight", at::randn({300, 64}));
  });
  m.load_hf(ok);
  EXPECT_LE(testing::max_rel_diff(m.forward(expected().tensor("tiny.input_ids"), {}, false),
                                  expected().tensor("tiny.logits")),
            1e-4);
}

TEST(LoadHf, RejectsPartialLoad) {
  // A shape error in the last tensor must leave the model untouched.
  const LlamaConfig cfg = LlamaConfig::from_file(fixture("tiny/config.json"));
  LlamaModel m(cfg, at::kFloat, at::kCPU);
  m.init_random(1, 0.02);
  const at::Tensor before = m.embed_weight().detach().clone();
  const std::string bad = edited_weights("late", [](NamedTensors& t) {
    for (auto& [n, v] : t)
      if (n == "model.norm.weight") v = at::randn({65});
  });
  EXPECT_THROW(m.load_hf(bad), Error);
  EXPECT_TRUE(at::equal(m.embed_weight(), before));
}

TEST(ExportHf, RoundTripAndAtomicReplace) {
  auto m = LlamaModel::from_pretrained(fixture("tiny_linear"), at::kFloat, at::kCPU);
  const std::string parent = testing::temp_dir("export");
  const std::string out = parent + "/hf";
  std::ofstream(parent + "/tokenizer.json") << "{\"fake\": true}";
  HfExportOptions o;
  o.dtype = at::kFloat;
  o.extra_files = {parent + "/tokenizer.json"};
  o.max_shard_bytes = 100000;  // several shards + index
  write_hf_folder(out, m->config(), m->named_parameters(), o);
  EXPECT_TRUE(fs::exists(out + "/model.safetensors.index.json"));
  EXPECT_TRUE(fs::exists(out + "/tokenizer.json"));
  EXPECT_TRUE(fs::exists(out + "/generation_config.json"));
  auto back = LlamaModel::from_pretrained(out, at::kFloat, at::kCPU);
  EXPECT_EQ(back->config(), [&] {
    auto c = m->config();
    c.torch_dtype = "float32";
    return c;
  }());
  const at::Tensor ids = expected().tensor("linear.input_ids"),
                   pos = expected().tensor("linear.position_ids");
  EXPECT_TRUE(at::equal(back->forward(ids, pos, false), m->forward(ids, pos, false)));

  // Replacing an existing folder: bf16, one shard; the old files are gone, no temporaries remain.
  o.dtype = at::kBFloat16;
  o.max_shard_bytes = 5'000'000'000ull;
  o.extra_files.clear();
  write_hf_folder(out, m->config(), m->named_parameters(), o);
  EXPECT_FALSE(fs::exists(out + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(out + "/tokenizer.json"));
  EXPECT_EQ(SafetensorsReader::open(out).entry("lm_head.weight").dtype, at::kBFloat16);
  std::ifstream cfg(out + "/config.json");
  EXPECT_EQ(nlohmann::json::parse(cfg)["torch_dtype"], "bfloat16");
  int entries = 0;
  for (const auto& e : fs::directory_iterator(parent)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 2);  // hf/ and tokenizer.json
  // The fixture weights are bf16-exact, so the bf16 export reproduces the model exactly.
  auto bf = LlamaModel::from_pretrained(out, at::kFloat, at::kCPU);
  EXPECT_TRUE(at::equal(bf->forward(ids, pos, false), m->forward(ids, pos, false)));
}

TEST(ExportHf, ErrorsLeaveTheTargetUntouched) {
  auto m = LlamaModel::from_pretrained(fixture("tiny"), at::kFloat, at::kCPU);
  const std::string parent = testing::temp_dir("export_err");
  const std::string out = parent + "/hf";
  write_hf_folder(out, m->config(), m->named_parameters());
  const auto before = fs::last_write_time(out + "/model.safetensors");
  auto params = m->named_parameters();
  params.emplace_back("lm_head.weight", at::randn({300, 64}));
  expect_error([&] { write_hf_folder(out, m->config(), params); }, {out, "lm_head.weight", "tied"});
  params.pop_back();
  params.pop_back();  // model.norm.weight
  expect_error([&] { write_hf_folder(out, m->config(), params); },
               {out, "`model.norm.weight` is missing"});
  params = m->named_parameters();
  params[1].second = at::randn({3, 3});
  expect_error([&] { write_hf_folder(out, m->config(), params); },
               {out, "model.layers.0.self_attn.q_proj.weight", "shape [3, 3]"});
  HfExportOptions o;
  o.extra_files = {parent + "/no_tokenizer.json"};
  expect_error([&] { write_hf_folder(out, m->config(), m->named_parameters(), o); },
               {"no_tokenizer.json", "no such file"});
  EXPECT_EQ(fs::last_write_time(out + "/model.safetensors"), before);
  int entries = 0;
  for (const auto& e : fs::directory_iterator(parent)) {
    (void)e;
    ++entries;
  }
  EXPECT_EQ(entries, 1);
}

}  // namespace
}  // namespace ciuic::model
