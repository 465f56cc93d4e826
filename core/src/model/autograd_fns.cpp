// Custom autograd functions of the model: activation checkpointing of a decoder layer, and the
// vocabulary-chunked linear + cross-entropy loss. Kept in their own translation unit: the custom
// function header pulls in much of the autograd engine.
#include <algorithm>
#include <mutex>
#include <optional>
#include <string>

#include <ATen/Context.h>
#include <ATen/TensorOperators.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/logaddexp.h>
#include <ATen/ops/logsumexp.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/where.h>
#include <ATen/ops/zeros.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/engine.h>

#include "model/llama_ops.h"

#include <ciuic/error.h>
#include <ciuic/sharding.h>

namespace ciuic::model {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr int64_t kIgnoreIndex = -100;

// ---- activation checkpointing ---------------------------------------------------------------
//
// apply(shape, x, cos, sin_signed, mask, cu_seqlens, docs_meta, weights..., announce, slots) —
// argument slots (for backward's result): 0 shape (not a tensor), 1 x, 2 cos, 3 sin_signed,
// 4 mask (optional), 5 cu_seqlens (optional: varlen attention over PackedDocs), 6 docs_meta (not
// a tensor), 7.. the layer's defined weights in slot order (`slots`: a bit per LayerWeights slot).
constexpr int kFirstWeightSlot = 7;

struct DocsMeta {
  int64_t max_len = 0, rows = 0, row_len = 0;
};

PackedDocs docs_of(const at::Tensor& cu, const DocsMeta& m) {
  PackedDocs d;
  d.cu_seqlens = cu;
  d.max_len = m.max_len;
  d.rows = m.rows;
  d.row_len = m.row_len;
  return d;
}

// The sharding a checkpointed layer announces its recomputation to, as an IValue; and the layer's
// NF4 weights (LayerWeights::nf4, owned by the model: not autograd inputs, they get no gradient).
struct Announce {
  ciuic::Sharding* boundaries = nullptr;
  int group = -1;
  const quant::Nf4Tensor* const* nf4 = nullptr;  // LayerWeights::kNumLinear entries, or null
};

// A LayerShape in the context's saved_data, and back.
void save_shape(AutogradContext* ctx, const LayerShape& s) {
  ctx->saved_data["hidden"] = s.hidden;
  ctx->saved_data["n_heads"] = s.n_heads;
  ctx->saved_data["n_kv_heads"] = s.n_kv_heads;
  ctx->saved_data["head_dim"] = s.head_dim;
  ctx->saved_data["eps"] = s.eps;
  ctx->saved_data["fused"] = s.fused;
  ctx->saved_data["act"] = static_cast<int64_t>(s.act);
  ctx->saved_data["qk_norm"] = s.qk_norm;
  ctx->saved_data["gemma_norm"] = s.gemma_norm;
  ctx->saved_data["sandwich"] = s.sandwich;
  ctx->saved_data["scale"] = s.scale;
  ctx->saved_data["window"] = s.window;
  ctx->saved_data["lora_scale"] = s.lora_scale;
  ctx->saved_data["lora_dropout"] = s.lora_dropout;
}
LayerShape load_shape(AutogradContext* ctx) {
  LayerShape s;
  s.hidden = ctx->saved_data["hidden"].toInt();
  s.n_heads = ctx->saved_data["n_heads"].toInt();
  s.n_kv_heads = ctx->saved_data["n_kv_heads"].toInt();
  s.head_dim = ctx->saved_data["head_dim"].toInt();
  s.eps = ctx->saved_data["eps"].toDouble();
  s.fused = ctx->saved_data["fused"].toBool();
  s.act = static_cast<Activation>(ctx->saved_data["act"].toInt());
  s.qk_norm = ctx->saved_data["qk_norm"].toBool();
  s.gemma_norm = ctx->saved_data["gemma_norm"].toBool();
  s.sandwich = ctx->saved_data["sandwich"].toBool();
  s.scale = ctx->saved_data["scale"].toDouble();
  s.window = ctx->saved_data["window"].toInt();
  s.lora_scale = ctx->saved_data["lora_scale"].toDouble();
  s.lora_dropout = ctx->saved_data["lora_dropout"].toDouble();
  return s;
}

// `weights` are the layer's defined slots in slot order; `slots` has bit i set for slot i; `nf4`
// the saved LayerWeights::nf4 pointers (nf4_<i>, absent when null).
LayerWeights weights_of(at::TensorList weights, int64_t slots, AutogradContext* ctx) {
  LayerWeights w;
  size_t k = 0;
  for (int i = 0; i < LayerWeights::kCount; ++i)
    if (slots & (int64_t{1} << i)) w.t[i] = weights[k++];
  for (int i = 0; i < LayerWeights::kNumLinear; ++i)
    if (const auto key = "nf4_" + std::to_string(i); ctx->saved_data.count(key))
      w.nf4[i] = reinterpret_cast<const quant::Nf4Tensor*>(
          static_cast<intptr_t>(ctx->saved_data[key].toInt()));
  return w;
}

// The default generator of `device` set to `state` for a scope (a checkpointed layer's
// recomputation), and put back to the state it had before on leaving it.
class GeneratorStateScope {
 public:
  GeneratorStateScope(c10::Device device, const at::Tensor& state)
      : gen_(at::globalContext().defaultGenerator(device)) {
    const std::scoped_lock lock(gen_.mutex());
    before_ = gen_.get_state();
    gen_.set_state(state);
  }
  ~GeneratorStateScope() {
    const std::scoped_lock lock(gen_.mutex());
    gen_.set_state(before_);
  }
  GeneratorStateScope(const GeneratorStateScope&) = delete;
  GeneratorStateScope& operator=(const GeneratorStateScope&) = delete;

 private:
  at::Generator gen_;
  at::Tensor before_;
};

at::Tensor generator_state(c10::Device device) {
  at::Generator gen = at::globalContext().defaultGenerator(device);
  const std::scoped_lock lock(gen.mutex());
  return gen.get_state();
}

struct CheckpointedLayer : public torch::autograd::Function<CheckpointedLayer> {
  static at::Tensor forward(AutogradContext* ctx, const LayerShape& s, const at::Tensor& x,
                            const at::Tensor& cos, const at::Tensor& sin_signed,
                            const std::optional<at::Tensor>& mask,
                            const std::optional<at::Tensor>& cu_seqlens, const DocsMeta& meta,
                            at::TensorList weights, const Announce& announce, int64_t slots) {
    ctx->saved_data["boundaries"] =
        static_cast<int64_t>(reinterpret_cast<intptr_t>(announce.boundaries));
    ctx->saved_data["group"] = static_cast<int64_t>(announce.group);
    for (int i = 0; announce.nf4 && i < LayerWeights::kNumLinear; ++i)
      if (announce.nf4[i])
        ctx->saved_data["nf4_" + std::to_string(i)] =
            static_cast<int64_t>(reinterpret_cast<intptr_t>(announce.nf4[i]));
    save_shape(ctx, s);
    ctx->saved_data["slots"] = slots;
    ctx->saved_data["has_mask"] = mask.has_value();
    ctx->saved_data["has_docs"] = cu_seqlens.has_value();
    ctx->saved_data["max_len"] = meta.max_len;
    ctx->saved_data["rows"] = meta.rows;
    ctx->saved_data["row_len"] = meta.row_len;
    variable_list to_save{x, cos, sin_signed, mask.value_or(at::Tensor()),
                          cu_seqlens.value_or(at::Tensor())};
    to_save.insert(to_save.end(), weights.begin(), weights.end());
    ctx->save_for_backward(to_save);  // the layer input and references to inputs: nothing new
    // LoRA dropout: the recomputation draws its masks from the state the forward drew them from.
    if (s.lora_dropout > 0) ctx->saved_data["rng"] = generator_state(x.device());
    const LayerWeights w = weights_of(weights, slots, ctx);
    const PackedDocs docs = cu_seqlens ? docs_of(*cu_seqlens, meta) : PackedDocs{};
    return decoder_layer(w, s, x, {cos, sin_signed}, mask, nullptr, cu_seqlens ? &docs : nullptr);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const LayerShape s = load_shape(ctx);
    const int64_t slots = ctx->saved_data["slots"].toInt();
    const bool has_mask = ctx->saved_data["has_mask"].toBool();
    const bool has_docs = ctx->saved_data["has_docs"].toBool();
    DocsMeta meta;
    meta.max_len = ctx->saved_data["max_len"].toInt();
    meta.rows = ctx->saved_data["rows"].toInt();
    meta.row_len = ctx->saved_data["row_len"].toInt();
    // needs_input_grad counts only tensor inputs: x, cos, sin, [mask], [cu_seqlens], weights.
    const size_t first_weight_edge = 3 + (has_mask ? 1 : 0) + (has_docs ? 1 : 0);
    const size_t n_weights = saved.size() - 5;

    // Recompute on detached aliases of the inputs (same storage, fresh leaves): autograd::grad
    // then returns the gradients without touching the real parameters' .grad, and the engine
    // delivers them to the parameters' AccumulateGrad nodes like any other function's output.
    variable_list targets;
    std::vector<size_t> target_slot;  // result slot of each target
    at::Tensor x = saved[0].detach();
    if (ctx->needs_input_grad(0)) {
      x.requires_grad_(true);
      targets.push_back(x);
      target_slot.push_back(1);
    }
    std::vector<at::Tensor> weights(n_weights);
    for (size_t i = 0; i < n_weights; ++i) {
      weights[i] = saved[5 + i].detach();
      if (ctx->needs_input_grad(first_weight_edge + i)) {
        weights[i].requires_grad_(true);
        targets.push_back(weights[i]);
        target_slot.push_back(kFirstWeightSlot + i);
      }
    }
    const LayerWeights w = weights_of(weights, slots, ctx);
    variable_list result(kFirstWeightSlot + n_weights + 2);  // + the Announce and slots arguments
    if (targets.empty()) return result;
    std::optional<at::Tensor> mask;
    if (has_mask) mask = saved[3];
    const PackedDocs docs = has_docs ? docs_of(saved[4], meta) : PackedDocs{};
    auto* boundaries = reinterpret_cast<ciuic::Sharding*>(
        static_cast<intptr_t>(ctx->saved_data["boundaries"].toInt()));
    const int group = static_cast<int>(ctx->saved_data["group"].toInt());
    at::Tensor y;
    {
      at::AutoGradMode enable(true);
      std::optional<GeneratorStateScope> rng;
      if (ctx->saved_data.count("rng")) rng.emplace(x.device(), ctx->saved_data["rng"].toTensor());
      if (boundaries) boundaries->before_group(group, ciuic::GroupPass::kRecompute);
      y = decoder_layer(w, s, x, {saved[1], saved[2]}, mask, nullptr, has_docs ? &docs : nullptr);
      if (boundaries) boundaries->after_group(group, ciuic::GroupPass::kRecompute);
    }
    variable_list grads = torch::autograd::grad({y}, targets, {grad_out[0]}, /*retain_graph=*/false,
                                                /*create_graph=*/false, /*allow_unused=*/true);
    for (size_t i = 0; i < grads.size(); ++i) result[target_slot[i]] = grads[i];
    return result;
  }
};

// ---- chunked linear + cross-entropy --------------------------------------------------------

int64_t vocab_chunk(int64_t n, int64_t v, int64_t chunk_elements) {
  const int64_t floor = std::min<int64_t>(v, 128);  // keep the matmuls reasonably wide
  return std::clamp<int64_t>(chunk_elements / std::max<int64_t>(n, 1), floor, v);
}

// apply(hidden [N,H], weight [V,H], labels [N], chunk_elements) -> fp32 scalar.
struct LinearCrossEntropy : public torch::autograd::Function<LinearCrossEntropy> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& labels,
                            int64_t chunk_elements) {
    const int64_t n = hidden.size(0), v = weight.size(0);
    const int64_t vc = vocab_chunk(n, v, chunk_elements);
    at::Tensor lse, target = at::zeros({n}, hidden.options().dtype(at::kFloat));
    for (int64_t v0 = 0; v0 < v; v0 += vc) {
      const int64_t len = std::min(vc, v - v0);
      at::Tensor logits = at::linear(hidden, weight.narrow(0, v0, len)).to(at::kFloat);  // [N, len]
      at::Tensor chunk_lse = at::logsumexp(logits, {1});
      lse = lse.defined() ? at::logaddexp(lse, chunk_lse) : chunk_lse;
      at::Tensor in_chunk = labels.ge(v0).logical_and_(labels.lt(v0 + len));
      at::Tensor idx = (labels - v0).clamp_(0, len - 1).unsqueeze(1);
      target.add_(at::where(in_chunk, logits.gather(1, idx).squeeze(1), 0.0));
    }
    at::Tensor valid = labels.ne(kIgnoreIndex);
    ctx->save_for_backward({hidden, weight, labels, lse});
    ctx->saved_data["chunk"] = vc;
    return at::where(valid, lse - target, 0.0).sum();
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor& hidden = saved[0];
    const at::Tensor& weight = saved[1];
    const at::Tensor& labels = saved[2];
    const at::Tensor& lse = saved[3];
    const int64_t vc = ctx->saved_data["chunk"].toInt();
    const int64_t n = hidden.size(0), v = weight.size(0);
    const bool need_h = ctx->needs_input_grad(0), need_w = ctx->needs_input_grad(1);
    variable_list result(4);
    if (!need_h && !need_w) return result;
    // d loss / d logits[n, j] = g * (softmax[n, j] - [j == label[n]]) on rows with a label.
    at::Tensor row_scale =
        at::where(labels.ne(kIgnoreIndex), grad_out[0].to(at::kFloat), 0.0).unsqueeze(1);
    const bool single = vc >= v;
    const bool fp32 = hidden.scalar_type() == at::kFloat;
    at::Tensor grad_h, grad_w;
    if (need_h && !single)
      grad_h = at::zeros({n, hidden.size(1)}, hidden.options().dtype(at::kFloat));
    if (need_w) grad_w = at::empty_like(weight, at::MemoryFormat::Contiguous);
    for (int64_t v0 = 0; v0 < v; v0 += vc) {
      const int64_t len = std::min(vc, v - v0);
      const at::Tensor w_chunk = weight.narrow(0, v0, len);
      at::Tensor p = at::linear(hidden, w_chunk).to(at::kFloat);
      p.sub_(lse.unsqueeze(1)).exp_();
      at::Tensor in_chunk = labels.ge(v0).logical_and_(labels.lt(v0 + len));
      at::Tensor idx = (labels - v0).clamp_(0, len - 1).unsqueeze(1);
      p.scatter_add_(1, idx, in_chunk.to(at::kFloat).neg_().unsqueeze(1));
      p.mul_(row_scale);
      at::Tensor d = p.to(hidden.scalar_type());
      if (need_w) {
        at::Tensor slice = grad_w.narrow(0, v0, len);
        at::mm_out(slice, d.t(), hidden);
      }
      if (need_h) {
        if (single)
          grad_h = at::mm(d, w_chunk);
        else if (fp32)
          grad_h.addmm_(d, w_chunk);
        else
          grad_h.add_(at::mm(d, w_chunk));
      }
    }
    if (need_h) result[0] = grad_h.to(hidden.scalar_type());
    if (need_w) result[1] = grad_w;
    return result;
  }
};

// apply(hidden [N,H], weight [V,H], labels [N], chunk_elements) -> fp32 scalar, with both
// gradients computed in the forward (LossBackward::kInForward). Tokens are taken in chunks of
// full-vocabulary logits; per chunk: lse, loss, d = softmax - onehot (fp32, then the weights'
// dtype), d hidden = d @ W (rows are independent: written once), d W += d^T @ hidden (accumulated
// in fp32 over chunks unless there is one chunk).
struct LinearCrossEntropyInForward : public torch::autograd::Function<LinearCrossEntropyInForward> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden,
                            const at::Tensor& weight, const at::Tensor& labels,
                            int64_t chunk_elements, bool need_h, bool need_w) {
    const int64_t n = hidden.size(0), v = weight.size(0);
    const int64_t rows =
        std::clamp<int64_t>(chunk_elements / std::max<int64_t>(v, 1), 1, std::max<int64_t>(n, 1));
    const bool one_chunk = rows >= n;
    const at::ScalarType dt = hidden.scalar_type();
    // Mixed-precision accumulation straight into an fp32 buffer (cuBLAS, bf16/fp16 inputs).
    const bool mixed_acc = hidden.is_cuda() && dt != at::kFloat;
    at::Tensor grad_h, grad_w, grad_w32;
    if (need_h) grad_h = at::empty_like(hidden, at::MemoryFormat::Contiguous);
    if (need_w && !one_chunk)
      grad_w32 = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    at::Tensor total = at::zeros({}, hidden.options().dtype(at::kFloat));
    for (int64_t r0 = 0; r0 < n; r0 += rows) {
      const int64_t len = std::min(rows, n - r0);
      const at::Tensor h = hidden.narrow(0, r0, len);
      const at::Tensor lab = labels.narrow(0, r0, len);
      at::Tensor logits = at::linear(h, weight).to(at::kFloat);  // [len, V]
      const at::Tensor lse = at::logsumexp(logits, {1});
      const at::Tensor valid = lab.ne(kIgnoreIndex);
      const at::Tensor idx = at::where(valid, lab, 0).unsqueeze(1);
      const at::Tensor target = logits.gather(1, idx).squeeze(1);
      total.add_(at::where(valid, lse - target, 0.0).sum());
      if (!need_h && !need_w) continue;
      // d loss / d logits = softmax - onehot on rows with a label, 0 elsewhere.
      logits.sub_(lse.unsqueeze(1)).exp_();
      logits.scatter_add_(1, idx, valid.to(at::kFloat).neg_().unsqueeze(1));
      logits.mul_(valid.to(at::kFloat).unsqueeze(1));
      const at::Tensor d = logits.to(dt);
      logits = at::Tensor();
      if (need_h) {
        at::Tensor slice = grad_h.narrow(0, r0, len);
        at::mm_out(slice, d, weight);
      }
      if (need_w) {
        if (one_chunk)
          grad_w = at::mm(d.t(), h);
        else if (dt == at::kFloat)
          grad_w32.addmm_(d.t(), h);
        else if (mixed_acc)
          at::addmm_out(grad_w32, grad_w32, d.t(), h, at::kFloat);
        else
          grad_w32.add_(at::mm(d.t(), h));
      }
    }
    if (need_w && !one_chunk) grad_w = dt == at::kFloat ? grad_w32 : grad_w32.to(dt);
    ctx->save_for_backward({grad_h, grad_w});
    return total;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    if (ctx->saved_data.count("used"))
      throw Error(
          "linear_cross_entropy_sum: a second backward through the loss (retain_graph) is not "
          "supported "
          "with [model] loss_backward = \"in_forward\" (its gradients are scaled in place); use "
          "\"recompute\"");
    ctx->saved_data["used"] = true;
    variable_list saved = ctx->get_saved_variables();
    variable_list result(6);
    // Scaled in place: the saved gradients are this function's own and used once.
    const at::Tensor g = grad_out[0];
    if (ctx->needs_input_grad(0) && saved[0].defined())
      result[0] = saved[0].mul_(g.to(saved[0].scalar_type()));
    if (ctx->needs_input_grad(1) && saved[1].defined())
      result[1] = saved[1].mul_(g.to(saved[1].scalar_type()));
    return result;
  }
};

}  // namespace

at::Tensor checkpointed_decoder_layer(const LayerWeights& w, const LayerShape& s,
                                      const at::Tensor& x, const RopeTables& rope,
                                      const std::optional<at::Tensor>& mask, const PackedDocs* docs,
                                      ciuic::Sharding* boundaries, int group) {
  std::vector<at::Tensor> weights;
  int64_t slots = 0;
  for (int i = 0; i < LayerWeights::kCount; ++i)
    if (w.t[i].defined()) {
      weights.push_back(w.t[i]);
      slots |= int64_t{1} << i;
    }
  std::optional<at::Tensor> cu;
  DocsMeta meta;
  if (docs) {
    cu = docs->cu_seqlens;
    meta = {docs->max_len, docs->rows, docs->row_len};
  }
  return CheckpointedLayer::apply(s, x, rope.cos, rope.sin_signed, mask, cu, meta,
                                  at::TensorList(weights), Announce{boundaries, group, w.nf4},
                                  slots);
}

namespace {
// Identity; its backward announces the boundary (group_boundary in model/llama_ops.h).
struct GroupBoundary : public torch::autograd::Function<GroupBoundary> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const Announce& a,
                            int64_t upper) {
    ctx->saved_data["boundaries"] = static_cast<int64_t>(reinterpret_cast<intptr_t>(a.boundaries));
    ctx->saved_data["lower"] = static_cast<int64_t>(a.group);
    ctx->saved_data["upper"] = upper;
    return x;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto* b = reinterpret_cast<ciuic::Sharding*>(
        static_cast<intptr_t>(ctx->saved_data["boundaries"].toInt()));
    const int upper = static_cast<int>(ctx->saved_data["upper"].toInt());
    const int lower = static_cast<int>(ctx->saved_data["lower"].toInt());
    if (upper >= 0) b->after_group(upper, ciuic::GroupPass::kBackward);
    if (lower >= 0) {
      b->before_group(lower, ciuic::GroupPass::kBackward);
      if (lower ==
          0)  // nothing below the embedding needs a gradient: its backward ends with the whole
        torch::autograd::Engine::get_default_engine().queue_callback(
            [b] { b->after_group(0, ciuic::GroupPass::kBackward); });
    }
    return {grad_out[0], at::Tensor(), at::Tensor()};
  }
};
}  // namespace

at::Tensor group_boundary(const at::Tensor& x, ciuic::Sharding* boundaries, int upper, int lower) {
  if (!boundaries || !at::GradMode::is_enabled() || !x.requires_grad()) return x;
  return GroupBoundary::apply(x, Announce{boundaries, lower}, static_cast<int64_t>(upper));
}

at::Tensor linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight,
                                    const at::Tensor& labels, int64_t chunk_elements,
                                    LossBackward mode) {
  if (mode == LossBackward::kInForward) {
    const bool grad = at::GradMode::is_enabled();
    return LinearCrossEntropyInForward::apply(hidden, weight, labels, chunk_elements,
                                              grad && hidden.requires_grad(),
                                              grad && weight.requires_grad());
  }
  return LinearCrossEntropy::apply(hidden, weight, labels, chunk_elements);
}

}  // namespace ciuic::model
