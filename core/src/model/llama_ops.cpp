// Llama building blocks: rotary tables, the packed-document mask, one decoder layer.
#include "model/llama_ops.h"

#include "model/cpu_skinny_gemm.h"
#include "model/fused_ops.h"
#include "quant/nf4.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <limits>
#include <numbers>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/TensorOperators.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/_flash_attention_forward.h>
#include <ATen/ops/addcmul.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/cumsum.h>
#include <ATen/ops/dropout.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/eq.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/index_copy.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/ones.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/reciprocal.h>
#include <ATen/ops/rms_norm.h>
#include <ATen/ops/roll.h>
#include <ATen/ops/scaled_dot_product_attention.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/where.h>

#include <ciuic/error.h>

namespace ciuic::model {

std::vector<int> layer_slots(const LlamaConfig& cfg) {
  using W = LayerWeights;
  std::vector<int> s{W::kQ};
  if (cfg.qkv_bias) s.push_back(W::kQBias);
  s.push_back(W::kK);
  if (cfg.qkv_bias) s.push_back(W::kKBias);
  s.push_back(W::kV);
  if (cfg.qkv_bias) s.push_back(W::kVBias);
  s.push_back(W::kO);
  if (cfg.qk_norm) s.insert(s.end(), {W::kQNorm, W::kKNorm});
  s.insert(s.end(), {W::kGate, W::kUp, W::kDown, W::kLnIn, W::kLnPostAttn});
  if (cfg.sandwich_norms) s.insert(s.end(), {W::kLnPreFfn, W::kLnPostFfn});
  return s;
}

at::Tensor rms_norm_of(const at::Tensor& x, const at::Tensor& w, int64_t dim, double eps,
                       bool gemma_norm, bool fused) {
  if (!gemma_norm) return at::rms_norm(x, {dim}, w, eps);
  if (fused) return fused_rms_norm(x, w, eps, /*gemma=*/true);
  if (x.scalar_type() == at::kFloat) return at::rms_norm(x, {dim}, w + 1.0, eps);
  return at::rms_norm(x.to(at::kFloat), {dim}, w.to(at::kFloat) + 1.0, eps).to(x.scalar_type());
}

double largest_product_flops(const LlamaConfig& cfg, int64_t rows, int64_t head_rows) {
  const double h = static_cast<double>(cfg.hidden_size);
  const double width = static_cast<double>(
      std::max({cfg.intermediate_size, cfg.num_attention_heads * cfg.head_dim, cfg.hidden_size}));
  return 2.0 * std::max(static_cast<double>(rows) * h * width,
                        static_cast<double>(head_rows) * h * static_cast<double>(cfg.vocab_size));
}

SmallStepThreads::SmallStepThreads(c10::Device device, double largest_flops) {
  if (!device.is_cpu() || largest_flops >= kSerialProductFlops) return;
  static const bool off = [] {  // CIUIC_SERIAL_SMALL_STEPS=0: keep the thread count (A/B)
    const char* e = std::getenv("CIUIC_SERIAL_SMALL_STEPS");
    return e && std::string(e) == "0";
  }();
  if (off) return;
  const int n = at::get_num_threads();
  if (n <= 1) return;
  at::set_num_threads(1);
  restore_ = n;
}

SmallStepThreads::~SmallStepThreads() {
  if (restore_ > 0) at::set_num_threads(restore_);
}

at::Tensor rope_inv_freq(const LlamaConfig& cfg, bool local) {
  // Same operations, in fp32, as transformers' rope initialisers (modeling_rope_utils.py).
  const int64_t dim = cfg.head_dim;
  at::Tensor exponents = at::arange(0, dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(dim);
  at::Tensor inv_freq =
      at::reciprocal(at::pow(local ? cfg.rope_local_theta : cfg.rope_theta, exponents));
  switch (local ? RopeType::kDefault : cfg.rope_type) {
    case RopeType::kDefault: break;
    case RopeType::kLinear: inv_freq = inv_freq / cfg.rope_scaling_factor; break;
    case RopeType::kLlama3: {
      const double factor = cfg.rope_scaling_factor;
      const double low = cfg.rope_low_freq_factor, high = cfg.rope_high_freq_factor;
      const double old_len = static_cast<double>(cfg.rope_original_max_position_embeddings > 0
                                                     ? cfg.rope_original_max_position_embeddings
                                                     : cfg.max_position_embeddings);
      const double low_wavelen = old_len / low, high_wavelen = old_len / high;
      at::Tensor wavelen = (2 * std::numbers::pi) / inv_freq;
      at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / factor, inv_freq);
      at::Tensor smooth = (old_len / wavelen - low) / (high - low);
      at::Tensor smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
      at::Tensor medium = (wavelen >= high_wavelen).logical_and(wavelen <= low_wavelen);
      inv_freq = at::where(medium, smoothed, scaled);
      break;
    }
  }
  return inv_freq;
}

RopeTables rope_tables(const at::Tensor& inv_freq, const at::Tensor& position_ids,
                       at::ScalarType dtype) {
  // f[b, t, i] = position[b, t] * inv_freq[i] in fp32, as transformers' LlamaRotaryEmbedding.
  at::Tensor f = position_ids.to(at::kFloat).unsqueeze(-1) * inv_freq.to(position_ids.device());
  at::Tensor c = f.cos(), s = f.sin();
  RopeTables r;
  r.cos = at::cat({c, c}, -1).to(dtype).unsqueeze(2);
  r.sin_signed = at::cat({-s, s}, -1).to(dtype).unsqueeze(2);
  return r;
}

at::Tensor packed_causal_mask(const at::Tensor& position_ids) {
  const int64_t t = position_ids.size(1);
  at::Tensor doc = at::cumsum(position_ids.eq(0), 1, at::kInt);  // document index per token
  at::Tensor same = doc.unsqueeze(2).eq(doc.unsqueeze(1));       // [B, T, T]
  at::Tensor causal = at::ones({t, t}, position_ids.options().dtype(at::kBool)).tril();
  return same.logical_and_(causal).unsqueeze(1);
}

at::Tensor sliding_causal_mask(int64_t t, int64_t window, c10::Device device) {
  const auto opts = at::TensorOptions().dtype(at::kLong).device(device);
  const at::Tensor i = at::arange(t, opts).unsqueeze(1), j = at::arange(t, opts).unsqueeze(0);
  const at::Tensor d = i - j;  // query minus key index
  return d.ge(0).logical_and_(d.lt(window)).view({1, 1, t, t});
}

PackedDocs PackedDocs::from_position_ids(const at::Tensor& cpu_position_ids, c10::Device device) {
  if (!cpu_position_ids.defined() || cpu_position_ids.dim() != 2 ||
      !cpu_position_ids.device().is_cpu() ||
      !at::isIntegralType(cpu_position_ids.scalar_type(), /*includeBool=*/false))
    throw Error("PackedDocs: position_ids must be a [B, T] integer tensor on the CPU");
  const at::Tensor pos = cpu_position_ids.to(at::kLong).contiguous();
  PackedDocs d;
  d.rows = pos.size(0);
  d.row_len = pos.size(1);
  const int64_t* p = pos.data_ptr<int64_t>();
  std::vector<int32_t> cu;
  int64_t start = 0;
  const int64_t total = d.rows * d.row_len;
  if (total > std::numeric_limits<int32_t>::max())
    throw Error("PackedDocs: more than 2^31 tokens in one batch");
  for (int64_t i = 0; i < total; ++i) {
    if (i % d.row_len == 0 || p[i] == 0) {
      if (i > start) d.max_len = std::max(d.max_len, i - start);
      cu.push_back(static_cast<int32_t>(i));
      start = i;
    }
  }
  if (total > start) d.max_len = std::max(d.max_len, total - start);
  cu.push_back(static_cast<int32_t>(total));
  at::Tensor host = at::empty({static_cast<int64_t>(cu.size())}, at::kInt);
  std::copy(cu.begin(), cu.end(), host.data_ptr<int32_t>());
  d.cu_seqlens = device.is_cpu() ? host : host.pin_memory().to(device, /*non_blocking=*/true);
  return d;
}

bool varlen_attention_supported(at::ScalarType dtype, c10::Device device, int64_t head_dim) {
  return device.is_cuda() && (dtype == at::kBFloat16 || dtype == at::kHalf) && head_dim % 8 == 0 &&
         head_dim <= 256;
}

at::Tensor lora_input(const at::Tensor& x, double p) {
  return lora_input(x, p, at::GradMode::is_enabled());
}

at::Tensor lora_input(const at::Tensor& x, double p, bool train) {
  return p > 0 && train ? at::dropout(x, p, /*train=*/true) : x;
}

namespace {
// linear(x, w.t[slot], bias) (through quant::nf4_linear when the slot is stored NF4), plus the
// slot's LoRA term when it has an adapter: PEFT's lora.Linear, result + lora_B(lora_A(dropout(x)))
// * scaling. `xa` (optional): the adapter's A product A dropout(x), computed by the caller
// (lora_a_shared); computed here when undefined. The B product, its scaling and the addition are
// one GEMM updating the base output in place (addmm_ with beta 1, alpha = scaling): the sum is
// rounded once instead of after each of the three ops (PEFT's order), and the [N, out] product is
// never written apart, scaled and added (four passes over it less in forward, one in backward).
// In place is safe: nothing saves the base output for backward (linear and nf4_linear save their
// input, the adapter's GEMM saves xa and B). A dense base product of a decode call (s.decode) goes
// through decode_linear (the CPU skinny GEMM where it applies).
at::Tensor lin(const LayerWeights& w, const LayerShape& s, int slot, const at::Tensor& x,
               const at::Tensor& bias = at::Tensor(), const at::Tensor& xa = at::Tensor()) {
  const quant::Nf4Tensor* q = w.nf4_of(slot);
  const auto base = [&](const at::Tensor& in) {
    if (q) return quant::nf4_linear(in, *q, bias);
    return s.decode ? decode_linear(in, w.t[slot], bias) : at::linear(in, w.t[slot], bias);
  };
  const int a = LayerWeights::lora_a_slot(slot);
  if (a < 0 || !w.t[a].defined()) return base(x);
  const at::Tensor& b = w.t[a + 1];  // [out, r]
  const at::Tensor x2 = x.reshape({-1, x.size(-1)});
  at::Tensor y = base(x2);
  const at::Tensor ax =
      xa.defined() ? xa : at::linear(lora_input(x, s.lora_dropout, /*train=*/true), w.t[a]);
  y.addmm_(ax.reshape({-1, b.size(1)}), b.t(), /*beta=*/1.0, /*alpha=*/s.lora_scale);
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = b.size(0);
  return y.view(shape);
}
// The adapters' A products A x of linear slots `slots`, which all read x, in slot order (undefined
// where a slot has no adapter, and all undefined when lin() should compute them itself). Without
// dropout (lora_dropout 0: none configured, or not training) two or more adapters share one product
// with their A matrices concatenated along the output dimension ([r + r + ..., in]) and split
// after: x is read once instead of once per adapter in forward, and backward's dX gets one
// [N, in] term instead of one per adapter (each summed into dX). The A parameters stay separate
// leaves (the sharding plugins hold them); the concatenation, r x in per adapter, is rebuilt per
// call and autograd splits its gradient back. With dropout each adapter drops x with its own mask
// (PEFT's lora_dropout is per adapter), so each keeps its own product.
std::vector<at::Tensor> lora_a_shared(const LayerWeights& w, const LayerShape& s,
                                      const at::Tensor& x, std::initializer_list<int> slots) {
  std::vector<at::Tensor> out(slots.size());
  if (s.lora_dropout > 0) return out;
  std::vector<at::Tensor> as;
  std::vector<int64_t> ranks;
  std::vector<size_t> where;
  size_t i = 0;
  for (int slot : slots) {
    const int a = LayerWeights::lora_a_slot(slot);
    if (a >= 0 && w.t[a].defined()) {
      as.push_back(w.t[a]);
      ranks.push_back(w.t[a].size(0));
      where.push_back(i);
    }
    ++i;
  }
  if (as.size() < 2) return out;
  const std::vector<at::Tensor> parts =
      at::linear(x, at::cat(as, 0)).split_with_sizes(ranks, /*dim=*/-1);
  for (size_t k = 0; k < where.size(); ++k) out[where[k]] = parts[k];
  return out;
}
inline bool has_lora(const LayerWeights& w, int slot) {
  const int a = LayerWeights::lora_a_slot(slot);
  return a >= 0 && w.t[a].defined();
}
inline at::Tensor apply_rope(const at::Tensor& x, const RopeTables& r, bool fused) {
  if (fused) return fused_rope(x, r);
  // x [B, T, heads, D]; roll by D/2 gives cat(x2, x1), the sign sits in sin_signed.
  return at::addcmul(x * r.cos, at::roll(x, {x.size(-1) / 2}, {-1}), r.sin_signed);
}
// The rest of a layer after attention: output projection, (norm,) residual, MLP block, residual.
at::Tensor attention_tail(const LayerWeights& w, const LayerShape& s, const at::Tensor& x,
                          const at::Tensor& a) {
  using W = LayerWeights;
  at::Tensor o = lin(w, s, W::kO, a);
  if (s.sandwich) o = rms_norm_of(o, w.t[W::kLnPostAttn], s.hidden, s.eps, s.gemma_norm, s.fused);
  at::Tensor out = x + o;
  at::Tensor h = rms_norm_of(out, w.t[s.sandwich ? W::kLnPreFfn : W::kLnPostAttn], s.hidden, s.eps,
                             s.gemma_norm, s.fused);
  const std::vector<at::Tensor> gu = lora_a_shared(w, s, h, {W::kGate, W::kUp});
  at::Tensor gate = lin(w, s, W::kGate, h, at::Tensor(), gu[0]),
             up = lin(w, s, W::kUp, h, at::Tensor(), gu[1]);
  at::Tensor m;
  if (s.fused && !has_lora(w, W::kDown) && !w.nf4_of(W::kDown))
    m = fused_glu_down(gate, up, w.w_down(), s.act);
  else if (s.fused)  // the adapter (or the NF4 weight) reads the product: no fused down projection
    m = lin(w, s, W::kDown, fused_glu(gate, up, s.act));
  else
    m = lin(w, s, W::kDown,
            (s.act == Activation::kGeluTanh ? at::gelu(gate, "tanh") : at::silu(gate)) * up);
  if (s.sandwich) m = rms_norm_of(m, w.t[W::kLnPostFfn], s.hidden, s.eps, s.gemma_norm, s.fused);
  return out + m;
}
// q or k [B, T, heads, D]: projected, normed over D (qk_norm), rotated.
at::Tensor project(const at::Tensor& h, const LayerWeights& w, int slot, const at::Tensor& bias,
                   const at::Tensor& norm, const LayerShape& s, int64_t heads,
                   const RopeTables& rope, const at::Tensor& xa) {
  at::Tensor y = lin(w, s, slot, h, bias, xa).view({h.size(0), h.size(1), heads, s.head_dim});
  if (s.qk_norm && s.fused) return fused_qk_norm_rope(y, norm, rope, s.eps, s.gemma_norm);
  if (s.qk_norm) y = rms_norm_of(y, norm, s.head_dim, s.eps, s.gemma_norm);
  return apply_rope(y, rope, s.fused);
}
}  // namespace

at::Tensor decoder_layer(const LayerWeights& w, const LayerShape& s, const at::Tensor& x,
                         const RopeTables& rope, const std::optional<at::Tensor>& mask,
                         KVCacheLayer* cache, const PackedDocs* docs) {
  using W = LayerWeights;
  const int64_t b = x.size(0), t = x.size(1);
  at::Tensor h = rms_norm_of(x, w.ln_in(), s.hidden, s.eps, s.gemma_norm, s.fused);
  // Projections stay in [B, T, heads, D] (the layout flash kernels use); the transposes to
  // [B, heads, T, D] for SDPA are views.
  const std::vector<at::Tensor> qkv = lora_a_shared(w, s, h, {W::kQ, W::kK, W::kV});
  at::Tensor q = project(h, w, W::kQ, w.t[W::kQBias], w.t[W::kQNorm], s, s.n_heads, rope, qkv[0]);
  at::Tensor k =
      project(h, w, W::kK, w.t[W::kKBias], w.t[W::kKNorm], s, s.n_kv_heads, rope, qkv[1]);
  at::Tensor v = lin(w, s, W::kV, h, w.t[W::kVBias], qkv[2]).view({b, t, s.n_kv_heads, s.head_dim});
  const std::optional<double> scale = s.scale > 0 ? std::optional<double>(s.scale) : std::nullopt;
  at::Tensor a;
  if (docs) {
    // Variable-length flash attention over the documents of the flattened batch ([B*T, heads, D]
    // views, no copies; GQA handled by the kernel). Differentiable through ATen's own autograd.
    // A window: keys j with i - j <= window - 1 (flash's window_size_left; -1: unbounded).
    const int64_t n = b * t;
    const std::optional<int64_t> left(s.window > 0 ? s.window - 1 : -1);
    const std::optional<int64_t> right(s.window > 0 ? 0 : -1);
    a = std::get<0>(at::_flash_attention_forward(
                        q.view({n, s.n_heads, s.head_dim}), k.view({n, s.n_kv_heads, s.head_dim}),
                        v.view({n, s.n_kv_heads, s.head_dim}), docs->cu_seqlens, docs->cu_seqlens,
                        docs->max_len, docs->max_len, 0.0,
                        /*is_causal=*/true, /*return_debug_mask=*/false, scale, left, right))
            .view({b, t, s.n_heads * s.head_dim});
    return attention_tail(w, s, x, a);
  }
  q = q.transpose(1, 2);
  k = k.transpose(1, 2);
  v = v.transpose(1, 2);
  bool causal = !mask.has_value();
  std::optional<at::Tensor> step_mask = mask;
  if (cache && cache->slot.defined()) {
    // A static step: this token's key/value at the slot the device tensor names, the query over
    // every slot of the cache under the caller's key bias (unfilled slots, padding, window).
    if (t != 1 || !mask)
      throw Error("decoder_layer: a static step (KV cache slot) takes one token and a key bias");
    cache->k.index_copy_(2, cache->slot, k);
    cache->v.index_copy_(2, cache->slot, v);
    k = cache->k;
    v = cache->v;
    causal = false;
  } else if (cache && cache->len >= 0) {
    const int64_t past = cache->len, total = past + t;
    // Without a mask: a causal prefill (empty cache) or one query over every cached position.
    if (!mask && past > 0 && t > 1)
      throw Error(
          "decoder_layer: a preallocated KV cache needs the caller's attention mask for "
          "several new tokens after cached ones");
    if (total > cache->k.size(2))
      throw Error("decoder_layer: the KV cache holds " + std::to_string(cache->k.size(2)) +
                  " positions, " + std::to_string(total) + " asked");
    cache->k.narrow(2, past, t).copy_(k);
    cache->v.narrow(2, past, t).copy_(v);
    cache->len = total;
    // One query (t == 1) in a sliding layer sees the last `window` positions only: the keys and
    // the mask's key columns narrowed to them (no window mask).
    const int64_t start = t == 1 && s.window > 0 && total > s.window ? total - s.window : 0;
    k = cache->k.narrow(2, start, total - start);
    v = cache->v.narrow(2, start, total - start);
    if (step_mask && start > 0) step_mask = step_mask->narrow(-1, start, total - start);
    causal = !mask && past == 0 && t > 1;
  } else if (cache) {
    if (cache->k.defined()) {
      if (t != 1) throw Error("decoder_layer: a KV cache takes one new token per step once filled");
      k = at::cat({cache->k, k}, 2);
      v = at::cat({cache->v, v}, 2);
      causal = false;                              // one query attends to every cached position
      if (s.window > 0 && k.size(2) > s.window) {  // ... within its window
        k = k.narrow(2, k.size(2) - s.window, s.window);
        v = v.narrow(2, v.size(2) - s.window, s.window);
      }
    }
    cache->k = k;
    cache->v = v;
  }
  if (cache && (cache->len >= 0 || cache->slot.defined()) && t == 1 && s.n_heads != s.n_kv_heads) {
    // One query per row: the g query heads that share a KV head become g queries of that head
    // (query head h reads KV head h / g, as enable_gqa's repeat_interleave), so no backend
    // repeats the cache and the key-padding mask broadcasts over them; nothing is causal.
    const int64_t g = s.n_heads / s.n_kv_heads;
    a = at::scaled_dot_product_attention(q.reshape({b, s.n_kv_heads, g, s.head_dim}), k, v,
                                         step_mask, 0.0, /*is_causal=*/false, scale);
    return attention_tail(w, s, x, a.reshape({b, 1, s.n_heads * s.head_dim}));
  }
  a = at::scaled_dot_product_attention(q, k, v, step_mask, 0.0, causal, scale,
                                       /*enable_gqa=*/s.n_heads != s.n_kv_heads);
  return attention_tail(w, s, x, a.transpose(1, 2).reshape({b, t, s.n_heads * s.head_dim}));
}

}  // namespace ciuic::model
