// QLoRA against PEFT 0.21.2 on a bitsandbytes 0.50.2 4-bit base (tests/fixtures/gen_qlora.py):
// transformers' load_in_4bit (nf4, double quantization, fp32 compute) of a tiny llama with
// an all-linear rank-4 adapter. LlamaModel::quantize_base stores every decoder linear weight as
// NF4: the packed nibbles equal bitsandbytes' byte for byte, the dequantized weights its
// dequantize_4bit up to the double-quantized scales: bitsandbytes' CPU kernel picks a neighbour
// 8-bit code for about 1% of the absmax values (quant/nf4.h; ours is the nearest), here in 2 of the
// 14 weights, 0.42% of the largest weight at most. So: 12 weights dequantize exactly (1e-6), all to
// 5e-3; logits to 2e-3, loss to 1e-3, adapter gradients to 5e-3 (relative, fp32; measured 4.5e-4,
// 1e-4 and 2.3e-3), with and without activation checkpointing; the base holds NF4 bytes only (no
// dense linear weight, no gradient); the values path (a model built without memory, filled from the
// safetensors reader) gives the same bits; merge_lora gives PEFT's dequantize(W) + delta; the same
// on a CUDA device (skipped without one).
#include <fstream>

#include <ATen/Context.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/equal.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "model/llama.h"
#include "model/lora.h"
#include "model_test_util.h"
#include "quant/nf4_size.h"

namespace ciuic::model {
namespace {

using testing::max_rel_diff;

const SafetensorsReader& want() {
  static const SafetensorsReader r =
      SafetensorsReader::open(testing::fixture("qlora/expected.safetensors"));
  return r;
}

LoraSpec peft_spec() {
  std::ifstream in(testing::fixture("qlora/llama/adapter_config.json"));
  LoraSpec s = lora_spec_from_peft(nlohmann::json::parse(in), "adapter_config.json");
  s.base_quantization = "nf4";
  return s;
}

void attach_adapter(LlamaModel& m) {
  m.enable_lora(peft_spec());
  m.load_lora(SafetensorsReader::open(testing::fixture("qlora/llama/adapter_model.safetensors")));
}

// The fp32 base loaded, then quantized (the current weights' path).
std::unique_ptr<LlamaModel> load(c10::Device device = at::kCPU) {
  auto m = LlamaModel::from_pretrained(testing::fixture("qlora/base"), at::kFloat, device);
  m->quantize_base();
  attach_adapter(*m);
  return m;
}

void expect_matches_peft(LlamaModel& m) {
  const auto dev = m.device();
  const at::Tensor ids = want().tensor("input_ids").to(dev),
                   labels = want().tensor("labels").to(dev);
  {
    at::NoGradGuard ng;
    EXPECT_LT(max_rel_diff(m.forward(ids, at::Tensor(), false).cpu(), want().tensor("logits")),
              2e-3);
  }
  at::Tensor loss = m.loss_sum(ids, labels, at::Tensor(), false);
  EXPECT_LT(max_rel_diff(loss.cpu(), want().tensor("loss_sum")), 1e-3);
  loss.backward();
  const auto trainable = m.trainable_parameters();
  EXPECT_EQ(trainable.size(), 28u);  // A and B of 7 linears x 2 layers
  for (const auto& [name, t] : trainable) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(t.grad().defined());
    EXPECT_LT(max_rel_diff(t.grad().cpu(), want().tensor("grad.base_model.model." + name)), 5e-3);
  }
  for (const auto& [name, t] : m.named_parameters()) {  // embedding, norms, lm_head: frozen
    EXPECT_FALSE(t.requires_grad()) << name;
    EXPECT_FALSE(t.grad().defined()) << name;
  }
}

TEST(QLoraVsPeft, LogitsLossAndAdapterGradients) {
  for (bool ckpt : {false, true}) {
    SCOPED_TRACE(ckpt ? "checkpointed" : "plain");
    auto m = load();
    m->set_activation_checkpointing(ckpt);
    expect_matches_peft(*m);
  }
}

// What the model holds: the 14 linear weights as NF4 (bitsandbytes' bytes), no dense copy.
TEST(QLora, BaseIsStoredNf4) {
  auto m = load();
  EXPECT_TRUE(m->base_quantized());
  const auto nf4 = m->nf4_weights();
  ASSERT_EQ(nf4.size(), 14u);
  int64_t bytes = 0;
  int exact = 0;
  for (const auto& [name, q] : nf4) {
    SCOPED_TRACE(name);
    EXPECT_TRUE(q->double_quant());
    EXPECT_EQ(q->blocksize, 64);
    EXPECT_EQ(q->packed.scalar_type(), at::kByte);
    EXPECT_EQ(q->absmax.scalar_type(), at::kByte);  // double-quantized scales
    EXPECT_FALSE(q->packed.requires_grad());
    EXPECT_TRUE(at::equal(q->packed, want().tensor("packed." + name)));
    const double d =
        max_rel_diff(quant::dequantize_nf4(*q, at::kFloat), want().tensor("dequant." + name));
    EXPECT_LT(d, 5e-3);
    exact += d < 1e-6;
    EXPECT_EQ(q->packed.numel(), (q->numel() + 1) / 2);  // 4 bits a weight
    EXPECT_EQ(q->bytes(), quant::nf4_bytes(q->numel()));
    bytes += q->bytes();
  }
  EXPECT_GE(exact, 12);
  EXPECT_EQ(m->nf4_bytes(), bytes);
  for (const auto& [name, t] : m->named_parameters())
    EXPECT_EQ(name.find("_proj"), std::string::npos) << name << " is still a dense parameter";
  EXPECT_EQ(m->named_parameters().size(), 1u + 2u * 2u + 2u);  // embed, 2 norms x 2, norm, lm_head
}

// A model built without memory, filled and quantized from the reader (the trainer's path): the same
// bits as quantizing the loaded weights.
TEST(QLora, QuantizedFromValuesEqualsQuantizedAfterLoading) {
  auto ref = load();
  const auto cfg = ref->config();
  LlamaModel m(cfg, at::kFloat, at::kCPU, /*allocate=*/false);
  const auto reader = SafetensorsReader::open(testing::fixture("qlora/base"));
  m.check_hf(reader);
  const auto names = m.named_parameters();
  m.quantize_base([&](int i, int64_t offset, const at::Tensor& out) {
    reader.load_slice_into(names[static_cast<size_t>(i)].first, offset, out);
  });
  attach_adapter(m);
  const auto a = m.nf4_weights(), b = ref->nf4_weights();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_TRUE(at::equal(a[i].second->packed, b[i].second->packed)) << a[i].first;
    EXPECT_TRUE(at::equal(a[i].second->absmax, b[i].second->absmax)) << a[i].first;
  }
  expect_matches_peft(m);
}

// merge_lora on the NF4 base: PEFT's Linear4bit.merge sum, dequantize_4bit(W) + delta, dense again.
TEST(QLora, MergeIsDequantizedBasePlusDelta) {
  auto m = load();
  m->merge_lora();
  EXPECT_FALSE(m->base_quantized());
  int merged = 0;
  for (const auto& [name, t] : m->named_parameters())
    if (want().contains("merged." + name)) {
      EXPECT_LT(max_rel_diff(t, want().tensor("merged." + name)), 5e-3) << name;
      ++merged;
    }
  EXPECT_EQ(merged, 14);
}

TEST(QLora, QuantizeTwiceRefused) {
  auto m = load();
  testing::expect_error([&] { m->quantize_base(); }, {"already quantized"});
  LlamaModel empty(m->config(), at::kFloat, at::kCPU, /*allocate=*/false);
  testing::expect_error([&] { empty.quantize_base(); }, {"holds no memory"});
}

// On a CUDA device: the dequantize kernel (quant/cuda) under nf4_linear; fp32 as the fixture.
TEST(QLoraCuda, MatchesPeft) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device (QLoRA's CUDA case)";
  for (bool ckpt : {false, true}) {
    SCOPED_TRACE(ckpt ? "checkpointed" : "plain");
    auto m = load(c10::Device(at::kCUDA, 0));
    m->set_activation_checkpointing(ckpt);
    for (const auto& [name, q] : m->nf4_weights()) EXPECT_TRUE(q->packed.is_cuda()) << name;
    expect_matches_peft(*m);
  }
}

}  // namespace
}  // namespace ciuic::model
