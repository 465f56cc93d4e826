// LlamaModel on a CUDA device against the same transformers fixtures as the CPU tests: logits,
// loss, gradients (activation checkpointing on and off, hooks firing on autograd's device
// thread), packed rows, bf16, greedy generation. Skipped when no CUDA device is present.
#include <atomic>
#include <cstdio>

#include <ATen/Context.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include "model/llama.h"
#include "model_test_util.h"

namespace ciuic::model {
namespace {

using testing::expected;
using testing::fixture;
using testing::max_rel_diff;

c10::Device cuda() { return c10::Device(c10::kCUDA, 0); }

#define SKIP_WITHOUT_CUDA() \
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device: the model's GPU tests need one (label gpu)"

at::Tensor dev(const std::string& name) { return expected().tensor(name).to(cuda()); }

struct CountingPostHook : torch::autograd::PostAccumulateGradHook {
  explicit CountingPostHook(std::atomic<int>* n) : n_(n) {}
  void operator()(const torch::autograd::Variable&) override { ++*n_; }
  std::atomic<int>* n_;
};

TEST(LlamaGpu, MatchesTransformersFp32) {
  SKIP_WITHOUT_CUDA();
  auto m = LlamaModel::from_pretrained(fixture("tiny"), at::kFloat, cuda());
  EXPECT_LE(
      max_rel_diff(m->forward(dev("tiny.input_ids"), {}, false), expected().tensor("tiny.logits")),
      1e-4);
  EXPECT_LE(max_rel_diff(m->forward(dev("packed.input_ids"), dev("packed.position_ids"), true),
                         expected().tensor("packed.logits")),
            1e-4);
  auto lin = LlamaModel::from_pretrained(fixture("tiny_linear"), at::kFloat, cuda());
  EXPECT_LE(max_rel_diff(lin->forward(dev("linear.input_ids"), dev("linear.position_ids"), false),
                         expected().tensor("linear.logits")),
            1e-4);
}

TEST(LlamaGpu, LossAndGradientsWithAndWithoutCheckpointing) {
  SKIP_WITHOUT_CUDA();
  auto m = LlamaModel::from_pretrained(fixture("tiny"), at::kFloat, cuda());
  const auto params = m->named_parameters();
  std::vector<std::atomic<int>> post(params.size());
  for (size_t i = 0; i < params.size(); ++i)
    torch::autograd::impl::set_post_acc_grad_hooks(params[i].second,
                                                   std::make_unique<CountingPostHook>(&post[i]));
  std::vector<std::vector<at::Tensor>> grads;
  for (bool ckpt : {false, true}) {
    m->set_activation_checkpointing(ckpt);
    m->set_loss_chunk_elements(ckpt ? 1
                                    : int64_t{1} << 26);  // three vocabulary chunks the second time
    for (auto& [_, p] : params) p.mutable_grad() = at::Tensor();
    at::Tensor loss = m->loss_sum(dev("tiny.input_ids"), dev("tiny.labels"), {}, false);
    EXPECT_LE(max_rel_diff(loss, expected().tensor("tiny.loss_sum")), 1e-5);
    loss.backward();
    grads.emplace_back();
    for (auto& [name, p] : params) {
      EXPECT_LE(max_rel_diff(p.grad(), expected().tensor("tiny.grad." + name)), 1e-4)
          << name << " ckpt " << ckpt;
      grads.back().push_back(p.grad().clone());
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(post[i].load(), 2) << params[i].first;
    EXPECT_LE(max_rel_diff(grads[1][i], grads[0][i]), 1e-6) << params[i].first;
  }
}

TEST(LlamaGpu, Bfloat16AndGeneration) {
  SKIP_WITHOUT_CUDA();
  auto m = LlamaModel::from_pretrained(fixture("tiny"), at::kBFloat16, cuda());
  EXPECT_LE(max_rel_diff(m->forward(dev("tiny.input_ids"), {}, false),
                         expected().tensor("tiny.logits_bf16")),
            3e-2);
  m->set_activation_checkpointing(true);
  at::Tensor loss = m->loss_sum(dev("tiny.input_ids"), dev("tiny.labels"), {}, false);
  EXPECT_LE(max_rel_diff(loss, expected().tensor("tiny.loss_sum")), 2e-2);
  loss.backward();
  EXPECT_LE(max_rel_diff(m->embed_weight().grad(),
                         expected().tensor("tiny.grad.model.embed_tokens.weight")),
            5e-2);
  auto f = LlamaModel::from_pretrained(fixture("tiny"), at::kFloat, cuda());
  const at::Tensor prompt = expected().tensor("generate.prompt");
  const at::Tensor want = expected().tensor("generate.new_tokens");
  std::vector<int32_t> p;
  for (int64_t i = 0; i < prompt.size(1); ++i)
    p.push_back(static_cast<int32_t>(prompt[0][i].item<int64_t>()));
  const auto got = f->generate_greedy(p, want.size(1), std::nullopt);
  for (int64_t i = 0; i < want.size(1); ++i)
    EXPECT_EQ(got[i], want[0][i].item<int64_t>()) << "token " << i;
}

// Packed rows through varlen flash attention (bf16 on CUDA) against the dense mask path and
// transformers' per-document logits; with checkpointing too.
TEST(LlamaGpu, PackedVarlenAttentionMatchesMask) {
  SKIP_WITHOUT_CUDA();
  auto m = LlamaModel::from_pretrained(fixture("tiny"), at::kBFloat16, cuda());
  ASSERT_TRUE(varlen_attention_supported(at::kBFloat16, m->device(), m->config().head_dim));
  const at::Tensor ids = dev("packed.input_ids"), pos = dev("packed.position_ids");
  const PackedDocs docs =
      PackedDocs::from_position_ids(expected().tensor("packed.position_ids"), m->device());
  const at::Tensor varlen = m->forward(ids, pos, true, &docs), masked = m->forward(ids, pos, true);
  std::printf("    varlen vs mask (bf16) %.2e, varlen vs transformers fp32 %.2e\n",
              max_rel_diff(varlen, masked),
              max_rel_diff(varlen, expected().tensor("packed.logits")));
  EXPECT_LE(max_rel_diff(varlen, masked), 2e-2);
  EXPECT_LE(max_rel_diff(varlen, expected().tensor("packed.logits")), 3e-2);
  at::Tensor labels = ids.roll({-1}, {1}).clone();
  labels.select(1, 19).fill_(-100);
  auto grads = [&](bool ckpt, const PackedDocs* d) {
    m->set_activation_checkpointing(ckpt);
    for (auto& p : m->parameters()) p.mutable_grad() = at::Tensor();
    m->loss_sum(ids, labels, pos, true, d).backward();
    std::vector<at::Tensor> g;
    for (auto& p : m->parameters()) g.push_back(p.grad().to(at::kFloat));
    return g;
  };
  const auto g_mask = grads(false, nullptr), g_var = grads(false, &docs),
             g_var_ckpt = grads(true, &docs);
  const auto names = m->named_parameters();
  for (size_t i = 0; i < g_mask.size(); ++i) {
    EXPECT_LE(max_rel_diff(g_var[i], g_mask[i]), 5e-2) << names[i].first;
    EXPECT_LE(max_rel_diff(g_var_ckpt[i], g_var[i]), 1e-2) << names[i].first;
  }
  // fp32 has no flash kernel: the mask path serves it, exactly as without docs.
  auto f = LlamaModel::from_pretrained(fixture("tiny"), at::kFloat, cuda());
  EXPECT_LE(max_rel_diff(f->forward(ids, pos, true, &docs), expected().tensor("packed.logits")),
            1e-4);
}

// Every family (tests/fixtures/gen_model_families.py) on CUDA: fp32 against transformers (SDPA
// with the window mask), bf16 through flash varlen with the layer windows (rows as documents;
// packed rows with PackedDocs) against transformers' fp32 logits within bf16 rounding, and the
// fused kernels on (rope and the gated MLP activation, SwiGLU or GeGLU, for every family).
TEST(FamiliesGpu, MatchTransformersFp32AndWindowedFlashInBf16) {
  SKIP_WITHOUT_CUDA();
  static const SafetensorsReader want =
      SafetensorsReader::open(fixture("families/expected.safetensors"));
  for (const char* c : {"mistral", "qwen2", "qwen3", "gemma3", "llama_pad"}) {
    SCOPED_TRACE(c);
    const std::string k = c;
    const at::Tensor ids = want.tensor(k + ".input_ids").to(cuda());
    const at::Tensor logits = want.tensor(k + ".logits");
    auto m = LlamaModel::from_pretrained(fixture("families/" + k), at::kFloat, cuda());
    EXPECT_LE(max_rel_diff(m->forward(ids, {}, false), logits), 1e-4);
    auto b = LlamaModel::from_pretrained(fixture("families/" + k), at::kBFloat16, cuda());
    for (bool fused : {false, true}) {
      b->set_fused_kernels(fused);
      const double d = max_rel_diff(b->forward(ids, {}, false), logits);
      std::printf("    %-10s bf16 logits vs transformers fp32 %.2e (fused %d)\n", c, d, fused);
      EXPECT_LE(d, 4e-2);
      at::Tensor loss = b->loss_sum(ids, want.tensor(k + ".labels").to(cuda()), {}, false);
      loss.backward();
      EXPECT_LE(max_rel_diff(loss, want.tensor(k + ".loss_sum")), 3e-2);
    }
    if (k == "mistral" || k == "gemma3") {
      const at::Tensor pos = want.tensor(k + ".packed.position_ids");
      const PackedDocs docs = PackedDocs::from_position_ids(pos, cuda());
      const at::Tensor pids = want.tensor(k + ".packed.input_ids").to(cuda());
      EXPECT_LE(
          max_rel_diff(m->forward(pids, pos.to(cuda()), true), want.tensor(k + ".packed.logits")),
          1e-4);
      EXPECT_LE(max_rel_diff(b->forward(pids, pos.to(cuda()), true, &docs),
                             want.tensor(k + ".packed.logits")),
                4e-2);
    }
  }
}

}  // namespace
}  // namespace ciuic::model
