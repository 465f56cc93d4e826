// Generation (model/generate.h) against transformers (tests/fixtures/gen_generate.py): greedy
// generate() of a left-padded batch of 3 prompts of different lengths, token for token, for
// every family (sliding windows, local/global layers), with per-row EOS stops; the KV-cache
// logits of each step equal to full-recompute logits of the unpadded row; transformers' logits
// processors on fixed scores to 1e-6 after each of them, in transformers' order; bad settings.
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include <ATen/Context.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/isinf.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros_like.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <ciuic/files.h>

#include "model/cpu_skinny_gemm.h"
#include "model/generate.h"
#include "model/llama.h"
#include "model_test_util.h"

namespace ciuic::model {
namespace {

using nlohmann::json;
using testing::expect_error;
using testing::max_rel_diff;

std::string gen_fixture(const std::string& rel) {
  return std::string(CIUIC_FIXTURES_DIR) + "/generate/" + rel;
}

const SafetensorsReader& want() {
  static const SafetensorsReader r = SafetensorsReader::open(gen_fixture("expected.safetensors"));
  return r;
}

const json& meta() {
  static const json j = [] {
    std::ifstream in(gen_fixture("cases.json"));
    return json::parse(in);
  }();
  return j;
}

std::vector<int32_t> ids_of(const at::Tensor& t) {
  const at::Tensor x = t.to(at::kLong).contiguous().view({-1});
  return std::vector<int32_t>(x.data_ptr<int64_t>(), x.data_ptr<int64_t>() + x.numel());
}

std::unique_ptr<LlamaModel> load(const std::string& c) {
  return LlamaModel::from_pretrained(testing::fixture("families/" + c), at::kFloat,
                                     c10::Device(c10::kCPU));
}

std::vector<std::vector<int32_t>> prompts_of(const std::string& c) {
  std::vector<std::vector<int32_t>> p;
  for (int i = 0; i < 3; ++i)
    p.push_back(ids_of(want().tensor(c + ".greedy.prompt." + std::to_string(i))));
  return p;
}

GenerateOptions greedy_options(const std::string& c) {
  GenerateOptions o;
  o.max_new_tokens = meta()["max_new_tokens"].get<int64_t>();
  o.eos_ids = meta()["cases"][c]["eos_ids"].get<std::vector<int32_t>>();
  o.pad_id = meta()["cases"][c]["pad_id"].get<int32_t>();
  return o;
}

TEST(Generate, GreedyBatchEqualsTransformersForEveryFamily) {
  for (const char* c : testing::kFamilyCases) {
    SCOPED_TRACE(c);
    auto model = load(c);
    GenerateOptions o = greedy_options(c);
    std::vector<std::vector<int32_t>> streamed(3);
    o.on_token = [&](size_t row, int32_t tok) { streamed[row].push_back(tok); };
    const GenerateResult r = generate(*model, prompts_of(c), o);
    ASSERT_EQ(r.tokens.size(), 3u);
    bool some_stopped = false;
    for (int i = 0; i < 3; ++i) {
      const auto hf = ids_of(want().tensor(std::string(c) + ".greedy.new." + std::to_string(i)));
      EXPECT_EQ(r.tokens[static_cast<size_t>(i)], hf) << "row " << i;
      EXPECT_EQ(streamed[static_cast<size_t>(i)], hf) << "row " << i << " (streamed)";
      some_stopped = some_stopped || r.hit_eos[static_cast<size_t>(i)];
    }
    EXPECT_TRUE(some_stopped) << "the fixture makes one row stop at an EOS id";
  }
}

TEST(Generate, GreedyBatchOnCudaEqualsTransformers) {
  // The device path: tokens, finished rows and positions on the GPU, the host reading each
  // step's tokens from a pinned copy one step late (skipped without CUDA).
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  for (const char* c : testing::kFamilyCases) {
    SCOPED_TRACE(c);
    auto model = LlamaModel::from_pretrained(testing::fixture(std::string("families/") + c),
                                             at::kFloat, c10::Device(c10::kCUDA, 0));
    const GenerateResult r = generate(*model, prompts_of(c), greedy_options(c));
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(r.tokens[static_cast<size_t>(i)],
                ids_of(want().tensor(std::string(c) + ".greedy.new." + std::to_string(i))))
          << "row " << i;
  }
}

TEST(Generate, OnePromptAloneGivesTheSameTokensAsInTheBatch) {
  // Padding must not change a row's result: each prompt alone, no padding.
  auto model = load("gemma3");
  for (int i = 0; i < 3; ++i) {
    GenerateOptions o = greedy_options("gemma3");
    const auto r = generate(*model, {prompts_of("gemma3")[static_cast<size_t>(i)]}, o);
    EXPECT_EQ(r.tokens[0], ids_of(want().tensor("gemma3.greedy.new." + std::to_string(i))))
        << "row " << i;
  }
}

TEST(Generate, KvCacheLogitsEqualFullRecompute) {
  // Each step's cached logits (batched, padded) against transformers' full forward of the
  // unpadded row, at the positions that chose each new token.
  for (const char* c : testing::kFamilyCases) {
    SCOPED_TRACE(c);
    auto model = load(c);
    GenerateOptions o = greedy_options(c);
    std::vector<at::Tensor> steps;
    o.on_logits = [&](const at::Tensor& l) { steps.push_back(l.clone()); };
    const auto r = generate(*model, prompts_of(c), o);
    for (int i = 0; i < 3; ++i) {
      const at::Tensor hf = want().tensor(std::string(c) + ".greedy.logits." + std::to_string(i));
      for (int64_t s = 0; s < hf.size(0); ++s)
        EXPECT_LT(max_rel_diff(steps[static_cast<size_t>(s)][i], hf[s]), 1e-5)
            << "row " << i << " step " << s;
    }
    // And against ciuic's own full forward of the whole padded-free row (no cache).
    const auto prompts = prompts_of(c);
    std::vector<int64_t> row(prompts[0].begin(), prompts[0].end());
    row.insert(row.end(), r.tokens[0].begin(), r.tokens[0].end());
    const at::Tensor full =
        model->forward(at::tensor(row, at::kLong).unsqueeze(0), {}, false).to(at::kFloat)[0];
    const int64_t l = static_cast<int64_t>(prompts[0].size());
    for (size_t s = 0; s < r.tokens[0].size(); ++s)
      EXPECT_LT(max_rel_diff(steps[s][0], full[l - 1 + static_cast<int64_t>(s)]), 1e-5)
          << "step " << s;
  }
}

TEST(Generate, VeryDifferentPromptLengthsEqualFullRecompute) {
  // A 1-token prompt beside a 70-token one (69 positions of left padding, far past the sliding
  // windows of 4), and a batch of equal lengths (no padding: attention without masks): each
  // step's cached logits against the model's own full forward of the unpadded row (no cache, no
  // padding mask), for every family.
  for (const char* c : testing::kFamilyCases) {
    SCOPED_TRACE(c);
    auto model = load(c);
    const int64_t vocab = model->config().vocab_size;
    auto row = [&](int64_t n, int64_t salt) {
      std::vector<int32_t> p;
      for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 7 + salt) % vocab));
      return p;
    };
    for (const auto& prompts :
         {std::vector<std::vector<int32_t>>{row(1, 3), row(70, 5)},
          std::vector<std::vector<int32_t>>{row(5, 1), row(5, 2), row(5, 9)}}) {
      GenerateOptions o;
      o.max_new_tokens = 10;
      o.pad_id = 0;
      std::vector<at::Tensor> steps;
      o.on_logits = [&](const at::Tensor& l) { steps.push_back(l.clone()); };
      const auto r = generate(*model, prompts, o);
      for (size_t i = 0; i < prompts.size(); ++i) {
        SCOPED_TRACE("row " + std::to_string(i) + " of " + std::to_string(prompts.size()));
        ASSERT_EQ(r.tokens[i].size(), 10u);
        std::vector<int64_t> ids(prompts[i].begin(), prompts[i].end());
        ids.insert(ids.end(), r.tokens[i].begin(), r.tokens[i].end());
        const at::Tensor full =
            model->forward(at::tensor(ids, at::kLong).unsqueeze(0), {}, false).to(at::kFloat)[0];
        const int64_t l = static_cast<int64_t>(prompts[i].size());
        for (size_t s = 0; s < r.tokens[i].size(); ++s) {
          EXPECT_LT(max_rel_diff(steps[s][static_cast<int64_t>(i)],
                                 full[l - 1 + static_cast<int64_t>(s)]),
                    1e-5)
              << "step " << s;
          EXPECT_EQ(r.tokens[i][s], full[l - 1 + static_cast<int64_t>(s)].argmax().item<int64_t>())
              << "step " << s;
        }
      }
    }
  }
}

TEST(Generate, CancelAndEosKeepEveryTokenTakenBeforeThem) {
  // The host reads each step's tokens one step late: cancelling before step 4 still reports the
  // first 4 tokens of every row (streamed too), and a row that stops at EOS gets nothing after it.
  auto model = load("qwen2");
  GenerateOptions o = greedy_options("qwen2");
  int calls = 0;
  o.cancelled = [&] { return ++calls > 4; };
  std::vector<std::vector<int32_t>> streamed(3);
  o.on_token = [&](size_t row, int32_t tok) { streamed[row].push_back(tok); };
  const auto r = generate(*model, prompts_of("qwen2"), o);
  for (int i = 0; i < 3; ++i) {
    auto hf = ids_of(want().tensor("qwen2.greedy.new." + std::to_string(i)));
    if (hf.size() > 4) hf.resize(4);
    EXPECT_EQ(r.tokens[static_cast<size_t>(i)], hf) << "row " << i;
    EXPECT_EQ(streamed[static_cast<size_t>(i)], hf) << "row " << i;
  }
  EXPECT_EQ(r.steps, 4);
}

// On the CPU in fp32 a batch's last-position logits go through the lm_head weight reordered for
// oneDNN (DecodeCache::head_reordered) once the head product reaches kSerialProductFlops (the
// fixtures' heads are tiny: a batch of ~1000 rows); one row, or a smaller head, through
// at::linear. The two products agree to rounding.
TEST(Generate, CpuBatchHeadThroughOneDnnEqualsAtLinear) {
  auto model = load(testing::kFamilyCases[0]);
  if (const char* e = std::getenv("CIUIC_ONEDNN_HEAD"); e && std::string(e) == "0")
    GTEST_SKIP() << "CIUIC_ONEDNN_HEAD=0";
  const LlamaConfig& cfg = model->config();
  const auto b_flops = static_cast<int64_t>(
      std::ceil(kSerialProductFlops / (2.0 * cfg.hidden_size * cfg.vocab_size)));
  ASSERT_GE(b_flops, 2);
  EXPECT_FALSE(model->new_decode_cache(1, 8).head_reordered.defined());
  EXPECT_FALSE(model->new_decode_cache(b_flops - 1, 8).head_reordered.defined());
  // Heads of up to kSkinnyMaxRows rows go through the skinny GEMM instead (model/cpu_skinny_gemm.h;
  // with CIUIC_SKINNY_GEMM=0 through oneDNN from b_flops rows on).
  const bool skinny = skinny_gemm_enabled();
  if (skinny && b_flops <= kSkinnyMaxRows)
    EXPECT_FALSE(model->new_decode_cache(kSkinnyMaxRows, 8).head_reordered.defined());
  const int64_t b = skinny ? std::max(b_flops, kSkinnyMaxRows + 1) : b_flops;
  const int64_t n = 5;
  const at::Tensor ids = at::arange(b * n, at::kLong).remainder(cfg.vocab_size).view({b, n});
  const at::Tensor pos = at::arange(n, at::kLong).unsqueeze(0).expand({b, n}).contiguous();
  const at::Tensor valid = at::ones({b, n}, at::kBool);
  auto with = model->new_decode_cache(b, n, /*no_padding=*/true);
  ASSERT_TRUE(with.head_reordered.defined());
  auto without = model->new_decode_cache(b, n, /*no_padding=*/true);
  without.head_reordered = at::Tensor();
  const at::Tensor a = model->decode(ids, pos, valid, with);
  const at::Tensor c = model->decode(ids, pos, valid, without);
  ASSERT_EQ(a.sizes(), c.sizes());
  EXPECT_LT(max_rel_diff(a, c), 1e-5);
  EXPECT_TRUE(at::equal(a.argmax(-1), c.argmax(-1)));
}

TEST(Generate, DecodeInChunksEqualsOnePrefill) {
  // The cache API directly: a prompt run as one prefill and as 1 + 1 + rest give the same logits.
  auto model = load("mistral");
  const auto p = prompts_of("mistral")[1];
  const int64_t n = static_cast<int64_t>(p.size());
  const at::Tensor ids =
      at::tensor(std::vector<int64_t>(p.begin(), p.end()), at::kLong).unsqueeze(0);
  const at::Tensor pos = at::arange(n, at::kLong).unsqueeze(0);
  const at::Tensor valid = at::ones({1, n}, at::kBool);
  auto a = model->new_decode_cache(1, n);
  const at::Tensor one = model->decode(ids, pos, valid, a, /*last_only=*/false)[0];
  auto b = model->new_decode_cache(1, n);
  std::vector<at::Tensor> parts;
  for (int64_t s = 0; s < n; s += (s < 2 ? 1 : n)) {
    const int64_t len = s < 2 ? 1 : n - s;
    parts.push_back(model->decode(ids.narrow(1, s, len), pos.narrow(1, s, len),
                                  valid.narrow(1, s, len), b, false)[0]);
  }
  EXPECT_LT(max_rel_diff(at::cat(parts, 0), one), 1e-5);
  expect_error(
      [&] { model->decode(ids.narrow(1, 0, 1), pos.narrow(1, 0, 1), valid.narrow(1, 0, 1), b); },
      {"cache holds", std::to_string(n) + " positions"});
}

TEST(Generate, ProcessorsEqualTransformersAfterEachStep) {
  const at::Tensor scores = want().tensor("proc.scores"), seen = want().tensor("proc.seen");
  int k = 0;
  for (const auto& c : meta()["processors"]) {
    SCOPED_TRACE(c["setting"].dump());
    const json& st = c["setting"];
    SamplingParams p;
    p.do_sample = st.value("do_sample", false);
    p.temperature = st.value("temperature", 1.0);
    p.top_k = st.value("top_k", int64_t{50});
    p.top_p = st.value("top_p", 1.0);
    p.min_p = st.value("min_p", 0.0);
    p.repetition_penalty = st.value("repetition_penalty", 1.0);
    std::vector<std::pair<std::string, at::Tensor>> steps;
    const at::Tensor out = process_logits(scores.clone(), seen, p, &steps);
    const auto order = c["order"].get<std::vector<std::string>>();
    ASSERT_EQ(steps.size(), order.size());
    for (size_t j = 0; j < order.size(); ++j) {
      EXPECT_EQ(steps[j].first, order[j]);
      const at::Tensor hf =
          want().tensor("proc." + std::to_string(k) + ".after." + std::to_string(j));
      // -inf where transformers removed a token, the same value to 1e-6 elsewhere.
      EXPECT_TRUE(at::isinf(steps[j].second).equal(at::isinf(hf))) << order[j];
      const at::Tensor zero = at::zeros_like(hf);
      const at::Tensor a = at::where(at::isinf(hf), zero, steps[j].second),
                       b = at::where(at::isinf(hf), zero, hf);
      EXPECT_LT(a.sub(b).abs().max().item<double>(), 1e-6) << order[j];
    }
    ++k;
  }
}

TEST(Generate, TopKOneAndSeededSamplingAreReproducible) {
  auto model = load("qwen2");
  GenerateOptions o = greedy_options("qwen2");
  o.sampling.do_sample = true;
  o.sampling.top_k = 1;  // seed-independent: greedy's tokens
  o.sampling.seed = 123;
  const auto r = generate(*model, prompts_of("qwen2"), o);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(r.tokens[static_cast<size_t>(i)],
              ids_of(want().tensor("qwen2.greedy.new." + std::to_string(i))));
  GenerateOptions s;
  s.max_new_tokens = 12;
  s.sampling.do_sample = true;
  s.sampling.temperature = 1.5;
  s.sampling.top_k = 0;
  s.sampling.seed = 5;
  const auto a = generate(*model, prompts_of("qwen2"), s),
             b = generate(*model, prompts_of("qwen2"), s);
  EXPECT_EQ(a.tokens, b.tokens);
  s.sampling.seed = 6;
  EXPECT_NE(generate(*model, prompts_of("qwen2"), s).tokens, a.tokens);
}

TEST(Generate, SeededSamplingDrawsAsTorchDoes) {
  // transformers' do_sample run after torch.manual_seed(seed): the same warpers and
  // torch.multinomial on the same CPU generator state draw the same tokens (ciuic links the
  // LibTorch of the venv's torch; another build of torch may draw otherwise).
  for (const char* c : testing::kFamilyCases) {
    SCOPED_TRACE(c);
    auto model = load(c);
    const json& m = meta()["cases"][c];
    GenerateOptions o;
    o.max_new_tokens = meta()["max_new_tokens"].get<int64_t>();
    o.pad_id = m["pad_id"].get<int32_t>();
    o.sampling.do_sample = true;
    o.sampling.seed = m["sample"]["seed"].get<uint64_t>();
    o.sampling.temperature = m["sample"]["temperature"].get<double>();
    o.sampling.top_k = m["sample"]["top_k"].get<int64_t>();
    o.sampling.top_p = m["sample"]["top_p"].get<double>();
    const auto r = generate(*model, {prompts_of(c)[0]}, o);
    EXPECT_EQ(r.tokens[0], ids_of(want().tensor(std::string(c) + ".sample.new")));
  }
}

TEST(Generate, BadInputIsAClearError) {
  auto model = load("llama_pad");
  GenerateOptions o;
  auto bad = [&](auto set, std::initializer_list<std::string> parts) {
    GenerateOptions x = o;
    set(x.sampling);
    expect_error([&] { generate(*model, {{1, 2}}, x); }, parts);
  };
  bad([](SamplingParams& s) { s.temperature = 0; }, {"temperature", "positive"});
  bad([](SamplingParams& s) { s.top_k = -1; }, {"top_k", ">= 0"});
  bad([](SamplingParams& s) { s.top_p = 1.5; }, {"top_p", "(0, 1]"});
  bad([](SamplingParams& s) { s.min_p = -0.1; }, {"min_p", "[0, 1]"});
  bad([](SamplingParams& s) { s.repetition_penalty = 0; }, {"repetition_penalty"});
  expect_error([&] { generate(*model, {{1, 2}, {}}, o); }, {"prompt 1", "empty"});
  expect_error([&] { generate(*model, {{1, 500}}, o); }, {"token 500", "vocabulary"});
  expect_error([&] { generate(*model, {std::vector<int32_t>(129, 3)}, o); },
               {"129 tokens", "context (128"});
  // At the context's end generation stops (no error): 120 + 12 > 128.
  o.max_new_tokens = 12;
  EXPECT_EQ(generate(*model, {std::vector<int32_t>(120, 3)}, o).tokens[0].size(), 8u);
}

TEST(Generate, EosIdsAndSamplingDefaultsFromTheFolder) {
  const std::string dir = testing::temp_dir("folder");
  std::ofstream(dir + "/config.json") << R"({"eos_token_id": 7})";
  EXPECT_EQ(eos_ids_of_folder(dir), (std::vector<int32_t>{7}));
  std::ofstream(dir + "/generation_config.json")
      << R"({"eos_token_id": [1, 106], "do_sample": true, "temperature": 0.6, "top_k": 20, "top_p": 0.95})";
  EXPECT_EQ(eos_ids_of_folder(dir), (std::vector<int32_t>{1, 106}));
  const SamplingParams s = sampling_of_folder(dir);
  EXPECT_TRUE(s.do_sample);
  EXPECT_DOUBLE_EQ(s.temperature, 0.6);
  EXPECT_EQ(s.top_k, 20);
  EXPECT_DOUBLE_EQ(s.top_p, 0.95);
  std::ofstream(dir + "/generation_config.json") << R"({"top_p": 3})";
  expect_error([&] { sampling_of_folder(dir); }, {"generation_config.json", "top_p"});
  // Read as every JSON input (ciuic/files.h): a file over kMaxJsonInputBytes is refused by its size
  // before it is read, and so is one that is not a regular file.
  std::filesystem::resize_file(dir + "/generation_config.json", kMaxJsonInputBytes + 1);  // sparse
  expect_error([&] { sampling_of_folder(dir); },
               {"generation_config.json", "over the limit of 268435456 bytes"});
  expect_error([&] { eos_ids_of_folder(dir); },
               {"generation_config.json", "over the limit of 268435456 bytes"});
  std::filesystem::remove(dir + "/generation_config.json");
  std::filesystem::create_directory(dir + "/generation_config.json");
  expect_error([&] { sampling_of_folder(dir); }, {"generation_config.json", "not a regular file"});
}

}  // namespace
}  // namespace ciuic::model
