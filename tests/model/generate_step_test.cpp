// The static-shape decode step (LlamaModel::decode_step, GenerateOptions::DecodeStep::kStatic)
// against the dynamic one (LlamaModel::decode), both through generate(): the same tokens and
// every step's logits within 1e-5 (fp32) for every family, with left-padded batches of very
// different prompt lengths, sliding windows shorter than the generation, an EOS mid-batch, stop
// strings, sampling and the repetition penalty. On CUDA (skipped without a device): the step
// replayed as a CUDA graph against the same step without one, for a family with global layers
// only and two with sliding windows.
#include <ATen/Context.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/full.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/tensor.h>
#include <gtest/gtest.h>

#include "model/generate.h"
#include "model/llama.h"
#include "model_test_util.h"

namespace ciuic::model {
namespace {

using testing::expect_error;
using testing::max_rel_diff;
using Step = GenerateOptions::DecodeStep;

std::unique_ptr<LlamaModel> load(const std::string& c, c10::Device dev = c10::Device(c10::kCPU)) {
  return LlamaModel::from_pretrained(testing::fixture("families/" + c), at::kFloat, dev);
}

// A prompt of n tokens (deterministic, inside the vocabulary).
std::vector<int32_t> row(int64_t n, int64_t salt, int64_t vocab) {
  std::vector<int32_t> p;
  for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>((i * 7 + salt) % vocab));
  return p;
}

struct Outcome {
  GenerateResult result;
  std::vector<at::Tensor> logits;  // per step, [B, V] on the CPU
};

Outcome generated(const LlamaModel& m, const std::vector<std::vector<int32_t>>& prompts,
                  GenerateOptions o, Step step, bool graph = false) {
  Outcome r;
  o.decode_step = step;
  o.cuda_graph = graph;
  o.on_logits = [&](const at::Tensor& l) { r.logits.push_back(l.clone().to(at::kCPU)); };
  r.result = generate(m, prompts, o);
  return r;
}

// Same tokens, EOS and stop flags; every step's logits within `tol`.
void expect_same(const Outcome& a, const Outcome& b, double tol) {
  EXPECT_EQ(a.result.tokens, b.result.tokens);
  EXPECT_EQ(a.result.hit_eos, b.result.hit_eos);
  EXPECT_EQ(a.result.hit_stop, b.result.hit_stop);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  for (size_t s = 0; s < a.logits.size(); ++s)
    EXPECT_LT(max_rel_diff(a.logits[s], b.logits[s]), tol) << "step " << s;
}

// The batches every family runs: a 1-token prompt beside a 70-token one (69 slots of left
// padding, far past the windows of 4), three of different lengths, three of one length (no
// padding).
std::vector<std::vector<std::vector<int32_t>>> batches(int64_t vocab) {
  return {{row(1, 3, vocab), row(70, 5, vocab)},
          {row(9, 1, vocab), row(3, 2, vocab), row(17, 4, vocab)},
          {row(5, 1, vocab), row(5, 2, vocab), row(5, 9, vocab)}};
}

TEST(GenerateStep, StaticStepEqualsDynamicForEveryFamily) {
  for (const char* c : testing::kFamilyCases) {
    SCOPED_TRACE(c);
    auto model = load(c);
    const int64_t vocab = model->config().vocab_size;
    for (const auto& prompts : batches(vocab)) {
      SCOPED_TRACE(std::to_string(prompts.size()) + " rows, the first of " +
                   std::to_string(prompts[0].size()));
      GenerateOptions o;
      o.max_new_tokens = 20;  // past every window of 4
      o.pad_id = 0;
      const Outcome dyn = generated(*model, prompts, o, Step::kDynamic);
      const Outcome sta = generated(*model, prompts, o, Step::kStatic);
      EXPECT_EQ(dyn.result.decode_step, "dynamic");
      EXPECT_EQ(sta.result.decode_step, "static");
      expect_same(dyn, sta, 1e-5);
      EXPECT_EQ(sta.result.tokens[0].size(), 20u);
    }
  }
}

TEST(GenerateStep, EosMidBatchStopStringsAndPenaltyAsDynamic) {
  for (const char* c : testing::kFamilyCases) {
    SCOPED_TRACE(c);
    auto model = load(c);
    const int64_t vocab = model->config().vocab_size;
    const auto prompts = batches(vocab)[1];
    GenerateOptions o;
    o.max_new_tokens = 24;
    o.pad_id = 0;
    const Outcome plain = generated(*model, prompts, o, Step::kDynamic);
    // An EOS id that row 1 produces at its 4th token (the other rows go on, or stop at it too).
    GenerateOptions e = o;
    e.eos_ids = {plain.result.tokens[1][3]};
    const Outcome de = generated(*model, prompts, e, Step::kDynamic),
                  se = generated(*model, prompts, e, Step::kStatic);
    EXPECT_TRUE(se.result.hit_eos[1]);
    expect_same(de, se, 1e-5);
    // A stop string: the text of row 2's 6th token, each token's text "<id>|".
    auto texts = std::make_shared<StopStrings::TokenTexts>();
    for (int64_t i = 0; i < vocab; ++i) texts->push_back("<" + std::to_string(i) + ">|");
    GenerateOptions st = o;
    st.stop_strings = {std::make_shared<StopStrings>(
        std::vector<std::string>{(*texts)[static_cast<size_t>(plain.result.tokens[2][5])].value()},
        texts)};
    const Outcome ds = generated(*model, prompts, st, Step::kDynamic),
                  ss = generated(*model, prompts, st, Step::kStatic);
    EXPECT_TRUE(ss.result.hit_stop[2]);
    expect_same(ds, ss, 1e-5);
    // Greedy with a repetition penalty: the processors run after the static step.
    GenerateOptions rp = o;
    rp.sampling.repetition_penalty = 1.3;
    expect_same(generated(*model, prompts, rp, Step::kDynamic),
                generated(*model, prompts, rp, Step::kStatic), 1e-5);
  }
}

TEST(GenerateStep, SeededSamplingDrawsAsDynamic) {
  for (const char* c : testing::kFamilyCases) {
    SCOPED_TRACE(c);
    auto model = load(c);
    const auto prompts = batches(model->config().vocab_size)[0];
    GenerateOptions o;
    o.max_new_tokens = 16;
    o.pad_id = 0;
    o.sampling.do_sample = true;
    o.sampling.seed = 11;
    o.sampling.temperature = 0.8;
    o.sampling.top_k = 20;
    o.sampling.top_p = 0.9;
    o.sampling.repetition_penalty = 1.1;
    expect_same(generated(*model, prompts, o, Step::kDynamic),
                generated(*model, prompts, o, Step::kStatic), 1e-5);
  }
}

TEST(GenerateStep, DecodeStepChecksItsInputs) {
  auto model = load("mistral");
  const at::Tensor ids = at::tensor(std::vector<int64_t>{3, 4, 5}, at::kLong).unsqueeze(0);
  const at::Tensor pos = at::arange(3, at::kLong).unsqueeze(0);
  auto cache = model->new_decode_cache(1, 16);
  const at::Tensor one = ids.narrow(1, 0, 1), slot = at::full({1}, 3, at::kLong);
  expect_error([&] { model->decode_step(one, pos.narrow(1, 0, 1), slot, cache); },
               {"cache is empty"});
  model->decode(ids, pos, at::ones({1, 3}, at::kBool), cache);
  expect_error([&] { model->decode_step(ids, pos, slot, cache); }, {"one token per row"});
  expect_error([&] { model->decode_step(one, pos.narrow(1, 0, 1), slot.to(at::kInt), cache); },
               {"slot must be an int64 [1] tensor"});
  // A valid step: the logits of the 4th token equal the dynamic step's.
  auto dyn = model->new_decode_cache(1, 16);
  model->decode(ids, pos, at::ones({1, 3}, at::kBool), dyn);
  const at::Tensor next = at::full({1, 1}, 7, at::kLong), at3 = at::full({1, 1}, 3, at::kLong);
  EXPECT_LT(max_rel_diff(model->decode_step(next, at3, slot, cache),
                         model->decode(next, at3, at::ones({1, 1}, at::kBool), dyn)),
            1e-5);
}

TEST(GenerateStep, CudaGraphReplayEqualsNoGraph) {
  // The step captured once and replayed: the same tokens and logits as the same static step run
  // without a graph, and as the dynamic step, on the GPU (fp32); greedy (the argmax, pad fill and
  // EOS check inside the graph) and sampling (the graph gives the logits).
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device";
  const c10::Device dev(c10::kCUDA, 0);
  for (const char* c : {"qwen3", "mistral", "gemma3"}) {
    SCOPED_TRACE(c);
    auto model = load(c, dev);
    const int64_t vocab = model->config().vocab_size;
    for (const auto& prompts : batches(vocab)) {
      GenerateOptions o;
      o.max_new_tokens = 20;
      o.pad_id = 0;
      const Outcome dyn = generated(*model, prompts, o, Step::kDynamic);
      o.eos_ids = {dyn.result.tokens.back()[3]};  // one row stops mid-way
      const Outcome graph = generated(*model, prompts, o, Step::kStatic, /*graph=*/true),
                    eager = generated(*model, prompts, o, Step::kStatic, /*graph=*/false),
                    dyn_eos = generated(*model, prompts, o, Step::kDynamic);
      EXPECT_EQ(graph.result.decode_step, "cuda_graph");
      EXPECT_EQ(eager.result.decode_step, "static");
      expect_same(graph, eager, 1e-5);
      expect_same(graph, dyn_eos, 1e-4);
      GenerateOptions s = o;
      s.sampling.do_sample = true;
      s.sampling.seed = 3;
      s.sampling.top_k = 0;
      const Outcome sg = generated(*model, prompts, s, Step::kStatic, true),
                    se = generated(*model, prompts, s, Step::kStatic, false);
      EXPECT_EQ(sg.result.decode_step, "cuda_graph");
      expect_same(sg, se, 1e-5);
    }
  }
  // bf16, the dtype the GPU generates in (other attention kernels): the replay gives what the
  // same step gives without the graph.
  for (const char* c : {"llama_pad", "gemma3"}) {
    SCOPED_TRACE(std::string(c) + " bf16");
    auto model = LlamaModel::from_pretrained(testing::fixture(std::string("families/") + c),
                                             at::kBFloat16, dev);
    const auto prompts = batches(model->config().vocab_size)[0];
    GenerateOptions o;
    o.max_new_tokens = 20;
    o.pad_id = 0;
    const Outcome graph = generated(*model, prompts, o, Step::kStatic, true),
                  eager = generated(*model, prompts, o, Step::kStatic, false);
    EXPECT_EQ(graph.result.decode_step, "cuda_graph");
    expect_same(graph, eager, 1e-3);
  }
}

}  // namespace
}  // namespace ciuic::model
