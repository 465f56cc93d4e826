// LlamaModel against transformers (fixtures from tests/fixtures/gen_model.py): logits, loss,
// gradients, packed documents, greedy generation; activation checkpointing and storage swaps
// (what a sharding plugin does) leave results and gradient hooks unchanged.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cross_entropy_loss.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/ones_like.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/tensor.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/sharding.h>

#include "model/fused_ops.h"
#include "model/llama.h"
#include "model_test_util.h"
#include "registry/registry.h"

namespace ciuic::model {
namespace {

using testing::expect_error;
using testing::expected;
using testing::fixture;
using testing::max_rel_diff;

constexpr double kLogitTol = 1e-4;  // relative, fp32 (the bar)

// max_rel_diff, printed so that the margin to each tolerance shows in the test log.
double diff(const char* what, const at::Tensor& a, const at::Tensor& b) {
  const double d = max_rel_diff(a, b);
  std::printf("    %-48s max relative difference %.2e\n", what, d);
  return d;
}

std::unique_ptr<LlamaModel> tiny(at::ScalarType dtype = at::kFloat) {
  return LlamaModel::from_pretrained(fixture("tiny"), dtype, at::kCPU);
}

std::map<std::string, at::Tensor> grads_of(const LlamaModel& m) {
  std::map<std::string, at::Tensor> g;
  for (auto& [name, p] : m.named_parameters())
    g[name] = p.grad().defined() ? p.grad().clone() : at::Tensor();
  return g;
}

void zero_grads(const LlamaModel& m) {
  for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
}

std::map<std::string, at::Tensor> loss_grads(const LlamaModel& m, const at::Tensor& ids,
                                             const at::Tensor& labels, const at::Tensor& pos = {},
                                             bool packed = false) {
  zero_grads(m);
  m.loss_sum(ids, labels, pos, packed).backward();
  return grads_of(m);
}

TEST(Llama, LogitsMatchTransformers) {
  auto m = tiny();
  const at::Tensor logits = m->forward(expected().tensor("tiny.input_ids"), {}, false);
  EXPECT_EQ(logits.scalar_type(), at::kFloat);
  EXPECT_LE(diff("logits vs transformers (fp32)", logits, expected().tensor("tiny.logits")),
            kLogitTol);
}

TEST(Llama, LogitsMatchTransformersLinearRopeUntiedHeadDim) {
  auto m = LlamaModel::from_pretrained(fixture("tiny_linear"), at::kFloat, at::kCPU);
  EXPECT_EQ(m->named_parameters().back().first, "lm_head.weight");
  const at::Tensor logits = m->forward(expected().tensor("linear.input_ids"),
                                       expected().tensor("linear.position_ids"), false);
  EXPECT_LE(diff("logits vs transformers (linear rope, head_dim 24)", logits,
                 expected().tensor("linear.logits")),
            kLogitTol);
}

TEST(Llama, PackedRowEqualsDocumentsRunSeparately) {
  auto m = tiny();
  const at::Tensor ids = expected().tensor("packed.input_ids");
  const at::Tensor pos = expected().tensor("packed.position_ids");
  const at::Tensor want =
      expected().tensor("packed.logits");  // transformers, one document at a time
  EXPECT_LE(diff("packed logits vs transformers per document", m->forward(ids, pos, true), want),
            kLogitTol);
  // Without `packed` the second document would see the first: the reference must then differ.
  EXPECT_GT(max_rel_diff(m->forward(ids, pos, false), want), 1e-2);
  // A batch mixing a packed row and a single-document row.
  const at::Tensor ids2 = at::cat({ids, ids.flip({1})}, 0);
  const at::Tensor pos2 = at::cat({pos, at::arange(20, at::kLong).unsqueeze(0)}, 0);
  const at::Tensor both = m->forward(ids2, pos2, true);
  EXPECT_LE(max_rel_diff(both[0], want[0]), kLogitTol);
  EXPECT_LE(max_rel_diff(both[1], m->forward(ids.flip({1}), {}, false)[0]), kLogitTol);
}

TEST(Llama, LossMatchesTransformers) {
  auto m = tiny();
  const at::Tensor ids = expected().tensor("tiny.input_ids");
  const at::Tensor labels = expected().tensor("tiny.labels");
  const at::Tensor want = expected().tensor("tiny.loss_sum");
  at::Tensor loss = m->loss_sum(ids, labels, {}, false);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  EXPECT_EQ(loss.dim(), 0);
  EXPECT_LE(diff("loss_sum vs transformers", loss, want), 1e-5);
  // Vocabulary chunks of 128 (3 chunks for V = 300) give the same loss.
  m->set_loss_chunk_elements(1);
  EXPECT_LE(max_rel_diff(m->loss_sum(ids, labels, {}, false), want), 1e-5);
  // All labels ignored: zero.
  EXPECT_EQ(m->loss_sum(ids, at::full_like(labels, -100), {}, false).item<float>(), 0.0f);
}

TEST(Llama, GradientsMatchTransformers) {
  auto m = tiny();
  const at::Tensor ids = expected().tensor("tiny.input_ids");
  const at::Tensor labels = expected().tensor("tiny.labels");
  // Both loss gradients (in the forward, recomputed in the backward), each with one chunk and
  // with the smallest chunks (recompute: three vocabulary chunks; in_forward: one token a chunk).
  for (LossBackward mode : {LossBackward::kInForward, LossBackward::kRecompute}) {
    m->set_loss_backward(mode);
    for (int64_t chunk : {int64_t{1} << 26, int64_t{1}}) {
      m->set_loss_chunk_elements(chunk);
      const auto g = loss_grads(*m, ids, labels);
      ASSERT_EQ(g.size(), 20u);
      double worst = 0;
      for (const auto& [name, grad] : g) {
        ASSERT_TRUE(grad.defined()) << name;
        const double d = max_rel_diff(grad, expected().tensor("tiny.grad." + name));
        worst = std::max(worst, d);
        EXPECT_LE(d, 1e-4) << name << " chunk " << chunk << " mode " << static_cast<int>(mode);
      }
      std::printf("    %-48s max relative difference %.2e (%s, chunk %lld)\n",
                  "gradients vs transformers (worst parameter)", worst,
                  mode == LossBackward::kInForward ? "in_forward" : "recompute",
                  static_cast<long long>(chunk));
    }
  }
}

// linear_cross_entropy_sum in both modes against ATen's own linear + cross_entropy and autograd,
// with ignored labels, uneven chunks, no-grad calls and one input not requiring a gradient.
TEST(Llama, LinearCrossEntropyModesMatchAten) {
  at::manual_seed(3);
  const int64_t n = 37, h = 24, v = 53;
  const at::Tensor hidden = at::randn({n, h}, at::kDouble).to(at::kFloat);
  const at::Tensor weight = at::randn({v, h}, at::kDouble).to(at::kFloat) * 0.3;
  at::Tensor labels = at::randint(0, v, {n}, at::kLong);
  labels.index_fill_(0, at::arange(0, n, 5), -100);
  const at::Tensor g_out = at::full({}, 0.37f);
  // Reference: autograd through ATen's composition.
  at::Tensor rh = hidden.clone().requires_grad_(true), rw = weight.clone().requires_grad_(true);
  const at::Tensor ref =
      at::cross_entropy_loss(at::linear(rh, rw), labels, {}, at::Reduction::Sum, -100);
  ref.backward(g_out);
  for (LossBackward mode : {LossBackward::kInForward, LossBackward::kRecompute}) {
    for (int64_t chunk : {int64_t{1}, int64_t{5} * v, int64_t{1} << 26}) {
      SCOPED_TRACE("mode " + std::to_string(static_cast<int>(mode)) + " chunk " +
                   std::to_string(chunk));
      at::Tensor xh = hidden.clone().requires_grad_(true), xw = weight.clone().requires_grad_(true);
      const at::Tensor loss = linear_cross_entropy_sum(xh, xw, labels, chunk, mode);
      EXPECT_LE(max_rel_diff(loss, ref), 1e-6);
      loss.backward(g_out);
      EXPECT_LE(max_rel_diff(xh.grad(), rh.grad()), 1e-5);
      EXPECT_LE(max_rel_diff(xw.grad(), rw.grad()), 1e-5);
      {
        at::NoGradGuard no_grad;  // loss only
        EXPECT_LE(max_rel_diff(linear_cross_entropy_sum(xh, xw, labels, chunk, mode), ref), 1e-6);
      }
      // Only the hidden states need a gradient (a frozen head).
      at::Tensor yh = hidden.clone().requires_grad_(true);
      linear_cross_entropy_sum(yh, weight, labels, chunk, mode).backward(g_out);
      EXPECT_LE(max_rel_diff(yh.grad(), rh.grad()), 1e-5);
    }
  }
  // The in-forward gradients are scaled in place: a second backward is refused, not wrong.
  at::Tensor zh = hidden.clone().requires_grad_(true);
  const at::Tensor twice =
      linear_cross_entropy_sum(zh, weight, labels, 1 << 20, LossBackward::kInForward);
  twice.backward(g_out, /*retain_graph=*/true);
  expect_error([&] { twice.backward(g_out); }, {"second backward", "recompute"});
}

// Without CUDA the fused kernels are off whatever is asked, and calling them is a clear error.
TEST(Llama, FusedKernelsNeedCuda) {
  auto m = tiny();
  m->set_fused_kernels(true);
  EXPECT_FALSE(m->fused_kernels());
  EXPECT_FALSE(fused_kernels_supported(at::kFloat, at::kCPU));
  const at::Tensor x = at::zeros({1, 2, 1, 4});
  expect_error([&] { fused_rope(x, RopeTables{x, x}); }, {"fused_rope", "CUDA", "Float on cpu"});
  expect_error([&] { fused_glu(x, x); }, {"fused_glu", "CUDA"});
  expect_error([&] { fused_glu_down(x, x, x, Activation::kGeluTanh); }, {"fused_glu_down", "CUDA"});
  const at::Tensor w = at::zeros({4});
  expect_error([&] { fused_rms_norm(x, w, 1e-6, true); }, {"fused_rms_norm", "CUDA"});
  expect_error(
      [&] {
        fused_qk_norm_rope(x, w, RopeTables{x, x}, 1e-6, false);
      },
      {"fused_qk_norm_rope", "CUDA", "Float on cpu"});
}

// Counts a parameter's hook calls: the pre-accumulation tensor hook and the post-accumulate-grad
// hook (the one a sharding plugin uses to start reducing a gradient).
struct CountingPostHook : torch::autograd::PostAccumulateGradHook {
  explicit CountingPostHook(int* n) : n_(n) {}
  void operator()(const torch::autograd::Variable&) override { ++*n_; }
  int* n_;
};

TEST(Llama, ActivationCheckpointingKeepsGradientsAndHooks) {
  auto m = tiny();
  const at::Tensor ids = expected().tensor("tiny.input_ids");
  const at::Tensor labels = expected().tensor("tiny.labels");
  const auto params = m->named_parameters();
  std::vector<int> pre(params.size(), 0), post(params.size(), 0);
  for (size_t i = 0; i < params.size(); ++i) {
    int* counter = &pre[i];
    params[i].second.register_hook([counter](const at::Tensor&) { ++*counter; });
    torch::autograd::impl::set_post_acc_grad_hooks(params[i].second,
                                                   std::make_unique<CountingPostHook>(&post[i]));
  }
  const auto off = loss_grads(*m, ids, labels);
  const std::vector<int> pre_off = pre, post_off = post;
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(post_off[i], 1) << params[i].first;  // accumulated once per backward
    EXPECT_GE(pre_off[i], 1) << params[i].first;
  }
  m->set_activation_checkpointing(true);
  const auto on = loss_grads(*m, ids, labels);
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_EQ(post[i] - post_off[i], post_off[i]) << params[i].first;
    EXPECT_EQ(pre[i] - pre_off[i], pre_off[i]) << params[i].first;
  }
  for (const auto& [name, g] : off) {
    EXPECT_TRUE(at::equal(g, on.at(name)))
        << name << " differs by " << max_rel_diff(on.at(name), g);
    EXPECT_LE(max_rel_diff(on.at(name), expected().tensor("tiny.grad." + name)), 1e-4) << name;
  }
  // Packed rows under checkpointing match too.
  const at::Tensor pids = expected().tensor("packed.input_ids");
  const at::Tensor ppos = expected().tensor("packed.position_ids");
  EXPECT_LE(max_rel_diff(m->forward(pids, ppos, true), expected().tensor("packed.logits")),
            kLogitTol);
  at::Tensor plabels = pids.roll({-1}, {1}).clone();
  plabels[0][19] = -100;
  const auto p_on = loss_grads(*m, pids, plabels, ppos, true);
  m->set_activation_checkpointing(false);
  const auto p_off = loss_grads(*m, pids, plabels, ppos, true);
  for (const auto& [name, g] : p_off) EXPECT_TRUE(at::equal(g, p_on.at(name))) << name;
}

TEST(Llama, PackedDocsFromPositionIds) {
  // Row 0: documents of 3 and 2 tokens; row 1 continues a document (a row start always starts
  // one), then a document of 3.
  const at::Tensor pos =
      at::tensor(std::vector<int64_t>{0, 1, 2, 0, 1, 3, 4, 0, 1, 2}, at::kLong).view({2, 5});
  const PackedDocs d = PackedDocs::from_position_ids(pos, at::kCPU);
  EXPECT_EQ(d.cu_seqlens.scalar_type(), at::kInt);
  const std::vector<int32_t> cu(d.cu_seqlens.data_ptr<int32_t>(),
                                d.cu_seqlens.data_ptr<int32_t>() + d.cu_seqlens.numel());
  EXPECT_EQ(cu, (std::vector<int32_t>{0, 3, 5, 7, 10}));
  EXPECT_EQ(d.max_len, 3);
  EXPECT_EQ(d.rows, 2);
  EXPECT_EQ(d.row_len, 5);
  expect_error([&] { PackedDocs::from_position_ids(pos.to(at::kFloat), at::kCPU); },
               {"[B, T] integer tensor on the CPU"});
  // On the CPU (and in fp32) the model falls back to the mask: same logits as without docs.
  auto m = tiny();
  const at::Tensor ids = expected().tensor("packed.input_ids");
  const at::Tensor ppos = expected().tensor("packed.position_ids");
  const PackedDocs docs = PackedDocs::from_position_ids(ppos, at::kCPU);
  EXPECT_TRUE(at::equal(m->forward(ids, ppos, true, &docs), m->forward(ids, ppos, true)));
  expect_error([&] { m->forward(ids, ppos, false, &docs); }, {"not marked packed"});
  const PackedDocs other = PackedDocs::from_position_ids(pos, at::kCPU);
  expect_error([&] { m->forward(ids, ppos, true, &other); },
               {"built for [2, 5]", "the batch is [1, 20]"});
}

TEST(Llama, PackedGradientsEqualPerDocumentGradients) {
  auto m = tiny();
  const at::Tensor ids = expected().tensor("packed.input_ids");
  const at::Tensor pos = expected().tensor("packed.position_ids");
  at::Tensor labels = ids.roll({-1}, {1}).clone();
  labels[0][8] = -100;  // last token of document A predicts nothing across the boundary
  labels[0][19] = -100;
  const auto packed = loss_grads(*m, ids, labels, pos, true);
  const at::Tensor a = ids.narrow(1, 0, 9), b = ids.narrow(1, 9, 11);
  const auto ga = loss_grads(*m, a, labels.narrow(1, 0, 9));
  const auto gb = loss_grads(*m, b, labels.narrow(1, 9, 11));
  for (const auto& [name, g] : packed)
    EXPECT_LE(max_rel_diff(g, ga.at(name) + gb.at(name)), 1e-5) << name;
}

TEST(Llama, StorageSwapKeepsParameterIdentityAndResults) {
  auto m = tiny();
  m->set_activation_checkpointing(true);
  const at::Tensor ids = expected().tensor("tiny.input_ids");
  const at::Tensor labels = expected().tensor("tiny.labels");
  auto params = m->named_parameters();
  int64_t total = 0;
  for (auto& [_, p] : params) total += p.numel();
  // What a ZeRO plugin does: move every parameter into one flat buffer, keeping the tensor objects.
  at::Tensor flat = at::empty({total}, at::kFloat);
  int64_t off = 0;
  std::vector<c10::TensorImpl*> impls;
  for (auto& [_, p] : params) {
    at::Tensor view = flat.narrow(0, off, p.numel()).view(p.sizes());
    view.copy_(p.detach());
    p.set_data(view);
    off += p.numel();
    impls.push_back(p.unsafeGetTensorImpl());
  }
  auto again = m->named_parameters();
  for (size_t i = 0; i < again.size(); ++i)
    EXPECT_EQ(again[i].second.unsafeGetTensorImpl(), impls[i]);
  EXPECT_LE(max_rel_diff(m->forward(ids, {}, false), expected().tensor("tiny.logits")), kLogitTol);
  const auto g = loss_grads(*m, ids, labels);
  for (const auto& [name, grad] : g)
    EXPECT_LE(max_rel_diff(grad, expected().tensor("tiny.grad." + name)), 1e-4) << name;
  // The model reads the flat buffer: changing it changes the output.
  {
    at::NoGradGuard ng;
    flat.mul_(0.5);
  }
  EXPECT_GT(max_rel_diff(m->forward(ids, {}, false), expected().tensor("tiny.logits")), 1e-2);
}

TEST(Llama, Bfloat16LogitsCloseToTransformersBfloat16) {
  auto m = tiny(at::kBFloat16);
  const at::Tensor logits = m->forward(expected().tensor("tiny.input_ids"), {}, false);
  EXPECT_EQ(logits.scalar_type(), at::kBFloat16);
  // bf16 has 8 bits of mantissa: transformers' own bf16 logits differ from its fp32 ones
  // by 1.95e-2; it also rounds RMSNorm before the weight multiply, at::rms_norm after.
  EXPECT_LE(diff("bf16 logits vs transformers bf16", logits, expected().tensor("tiny.logits_bf16")),
            3e-2);
  EXPECT_LE(max_rel_diff(logits, expected().tensor("tiny.logits")), 3e-2);
  at::Tensor loss =
      m->loss_sum(expected().tensor("tiny.input_ids"), expected().tensor("tiny.labels"), {}, false);
  EXPECT_EQ(loss.scalar_type(), at::kFloat);
  EXPECT_LE(max_rel_diff(loss, expected().tensor("tiny.loss_sum")), 2e-2);
  loss.backward();
  EXPECT_EQ(m->embed_weight().grad().scalar_type(), at::kBFloat16);
}

TEST(Llama, GreedyGenerationMatchesTransformers) {
  auto m = tiny();
  const at::Tensor prompt = expected().tensor("generate.prompt");
  const at::Tensor want = expected().tensor("generate.new_tokens");
  std::vector<int32_t> p;
  for (int64_t i = 0; i < prompt.size(1); ++i)
    p.push_back(static_cast<int32_t>(prompt[0][i].item<int64_t>()));
  const auto got = m->generate_greedy(p, want.size(1), std::nullopt);
  ASSERT_EQ(static_cast<int64_t>(got.size()), want.size(1));
  for (int64_t i = 0; i < want.size(1); ++i)
    EXPECT_EQ(got[i], want[0][i].item<int64_t>()) << "token " << i;
  // Stops at (and includes) the stop token.
  const auto stopped = m->generate_greedy(p, 8, got[2]);
  EXPECT_EQ(stopped, std::vector<int32_t>(got.begin(), got.begin() + 3));
  expect_error([&] { m->generate_greedy({}, 3, std::nullopt); }, {"prompt is empty"});
  expect_error(
      [&] {
        m->generate_greedy({5, 300}, 3, std::nullopt);
      },
      {"300", "outside the vocabulary"});
}

TEST(Llama, InitRandomIsDeterministicPerSeed) {
  const LlamaConfig cfg = LlamaConfig::from_file(fixture("tiny/config.json"));
  LlamaModel a(cfg, at::kFloat, at::kCPU), b(cfg, at::kFloat, at::kCPU),
      c(cfg, at::kFloat, at::kCPU);
  a.init_random(5, 0.02);
  b.init_random(5, 0.02);
  c.init_random(6, 0.02);
  const auto pa = a.named_parameters(), pb = b.named_parameters(), pc = c.named_parameters();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(at::equal(pa[i].second, pb[i].second)) << pa[i].first;
    EXPECT_TRUE(pa[i].second.requires_grad() && pa[i].second.is_leaf());
    if (pa[i].second.dim() == 1) {
      EXPECT_TRUE(at::equal(pa[i].second, at::ones_like(pa[i].second))) << pa[i].first;
    } else {
      EXPECT_FALSE(at::equal(pa[i].second, pc[i].second)) << pa[i].first;
      EXPECT_NEAR(pa[i].second.std().item<double>(), 0.02, 0.002) << pa[i].first;
    }
  }
  // Distinct parameters of equal shape get distinct values.
  EXPECT_FALSE(at::equal(pa[1 + 4].second, pa[1 + 5].second));  // gate_proj vs up_proj
}

TEST(Llama, InputErrors) {
  auto m = tiny();
  const at::Tensor ids = expected().tensor("tiny.input_ids");
  expect_error([&] { m->forward(ids[0], {}, false); },
               {"input_ids must be a [B, T]", "got Long [12]"});
  expect_error([&] { m->forward(ids.to(at::kFloat), {}, false); },
               {"input_ids", "got Float [2, 12]"});
  expect_error(
      [&] {
        m->forward(ids, at::zeros({2, 11}, at::kLong), false);
      },
      {"position_ids", "shaped like input_ids"});
  expect_error([&] { m->loss_sum(ids, ids.narrow(1, 0, 5), {}, false); },
               {"labels", "got Long [2, 5]"});
  expect_error([&] { LlamaModel::from_pretrained(fixture("nonexistent"), at::kFloat, at::kCPU); },
               {"nonexistent", "no config.json"});
  expect_error([&] { LlamaModel(m->config(), at::kLong, at::kCPU); },
               {"float32, bfloat16 or float16"});
}

// ---- layer boundaries (ciuic/sharding.h, Sharding::before_group/after_group)
// ----------------------

// The boundaries a model of `layers` decoder layers must announce for one training micro-batch,
// written out from the contract: forward g = 0 .. G-1, then backward G-1 .. 0, with a recompute
// pair inside the backward of each checkpointed layer (the first `checkpointed`).
std::vector<std::string> expected_boundaries(int layers, int checkpointed) {
  const int head = layers + 1;
  auto name = [&](int g) {
    return g == 0      ? std::string("embed")
           : g == head ? std::string("head")
                       : "layers." + std::to_string(g - 1);
  };
  std::vector<std::string> out{"micro_batch 0"};
  for (int g = 0; g <= head; ++g)
    for (const char* edge : {"before", "after"})
      out.push_back(std::string("forward ") + edge + " " + std::to_string(g) + " " + name(g));
  for (int g = head; g >= 0; --g) {
    out.push_back("backward before " + std::to_string(g) + " " + name(g));
    if (g >= 1 && g <= checkpointed) {
      out.push_back("recompute before " + std::to_string(g) + " " + name(g));
      out.push_back("recompute after " + std::to_string(g) + " " + name(g));
    }
    out.push_back("backward after " + std::to_string(g) + " " + name(g));
  }
  return out;
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

// The test plugin sharding/test (tests/testplugins/good_sharding.cpp) records what the model
// announces; its lines name a group's parameters whose gradient was not yet accumulated when the
// group's backward ended ("missing=").
TEST(LlamaGroups, BoundariesReachTheShardingInForwardBackwardAndRecompute) {
  ciuic::Registry reg = ciuic::Registry::from_paths({ciuic_test_paths::test_plugins() + "/good"});
  // Llama (two layers) and the families with extra layer tensors (tests/fixtures/model/families):
  // qwen2's biases, gemma3_text's q/k norms and sandwich norms (three layers, windowed).
  std::vector<LlamaConfig> configs{tiny()->config()};
  for (const char* f : {"qwen2", "gemma3"})
    configs.push_back(
        LlamaConfig::from_file(fixture(std::string("families/") + f + "/config.json")));
  for (const LlamaConfig& base : configs)
    for (bool tied : {true, false})
      for (int checkpointed : {0, 1, 2}) {
        // The families once each (their own tying; none or one checkpointed layer): time.
        if (base.family != ModelFamily::kLlama &&
            (tied != base.tie_word_embeddings || checkpointed == 2))
          continue;
        SCOPED_TRACE(std::string(model_type_name(base.family)) + ", " + (tied ? "tied" : "untied") +
                     ", checkpointed layers " + std::to_string(checkpointed));
        LlamaConfig cfg = base;
        cfg.tie_word_embeddings = tied;
        LlamaModel m(cfg, at::kFloat, at::kCPU);
        m.init_random(3, 0.02);
        if (checkpointed > 0) m.set_activation_checkpointing(true, checkpointed);
        const int layers = static_cast<int>(cfg.num_hidden_layers);
        ASSERT_GE(layers, 2);

        // The groups: every parameter in its layer's group, the tied embedding in the head's too.
        const auto named = m.named_parameters();
        const auto groups = m.param_groups();
        ASSERT_EQ(groups.size(), static_cast<size_t>(layers + 2));
        auto names_of = [&](const ciuic::ParamGroup& g) {
          std::vector<std::string> n;
          for (int i : g.params) n.push_back(named.at(static_cast<size_t>(i)).first);
          return n;
        };
        EXPECT_EQ(groups[0].name, "embed");
        EXPECT_EQ(names_of(groups[0]), std::vector<std::string>{"model.embed_tokens.weight"});
        for (int l = 0; l < layers; ++l) {
          const auto& g = groups[static_cast<size_t>(l + 1)];
          EXPECT_EQ(g.name, "layers." + std::to_string(l));
          const auto n = names_of(g);
          ASSERT_EQ(n.size(), layer_slots(cfg).size());
          for (const auto& p : n)
            EXPECT_EQ(p.rfind("model.layers." + std::to_string(l) + ".", 0), 0u) << p;
        }
        EXPECT_EQ(groups.back().name, "head");
        EXPECT_EQ(names_of(groups.back()),
                  (std::vector<std::string>{
                      "model.norm.weight", tied ? "model.embed_tokens.weight" : "lm_head.weight"}));
        size_t listed = 0;
        for (const auto& g : groups) listed += g.params.size();
        EXPECT_EQ(listed, named.size() + (tied ? 1 : 0));

        const std::string dir = testing::temp_dir("groups");
        ciuic::RunContext ctx;
        ctx.output_dir = dir;
        ctx.store = ciuic::make_local_store(std::chrono::seconds(10));
        auto shard = reg.create<ciuic::Sharding>(ciuic::Slot::kSharding, "test",
                                                 ciuic::Config::from_toml("sharding", ""), ctx);
        ciuic::ShardingSetup s;
        for (auto& [n, t] : named) s.params.push_back({n, t, t.dim() >= 2});
        s.groups = groups;
        shard->setup(s);
        m.set_group_boundaries(shard.get());

        // Training: one micro-batch, forward and backward.
        const at::Tensor ids = expected().tensor("tiny.input_ids").remainder(cfg.vocab_size);
        const at::Tensor labels =
            at::where(expected().tensor("tiny.labels").ge(0),
                      expected().tensor("tiny.labels").remainder(cfg.vocab_size), -100);
        shard->begin_micro_batch(0, true);
        m.loss_sum(ids, labels, {}, false).backward();
        const std::string events = dir + "/sharding-test-events.txt";
        EXPECT_EQ(lines_of(events), expected_boundaries(layers, checkpointed));
        // Without autograd (evaluation): forward boundaries only.
        {
          at::NoGradGuard ng;
          shard->begin_micro_batch(0, true);
          m.loss_sum(ids, labels, {}, false);
        }
        std::vector<std::string> eval = expected_boundaries(layers, 0);
        eval.resize(1 + 2 * (layers + 2));
        const auto all = lines_of(events);
        ASSERT_GE(all.size(), eval.size());
        EXPECT_EQ(std::vector<std::string>(all.end() - static_cast<long>(eval.size()), all.end()),
                  eval);
        m.set_group_boundaries(nullptr);
      }
}

}  // namespace
}  // namespace ciuic::model
