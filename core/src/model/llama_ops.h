// model/llama_ops.h — the Llama building blocks as functions of explicit weight tensors.
//
// Stateless: every function reads the weights it is given at call time, so parameters whose
// storage is swapped (param.set_data by a sharding plugin) are always seen current. All tensors
// are on one device; activations are in the weights' dtype except where noted.
#pragma once

#include <cmath>
#include <cstdint>
#include <optional>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "model/config.h"

#include <ciuic/export.h>

namespace ciuic {
class Sharding;
}
namespace ciuic::quant {
struct Nf4Tensor;
}

namespace ciuic::model {

// What a decoder layer computes: sizes and the family's switches (copied out of LlamaConfig),
// and this layer's attention window.
struct LayerShape {
  int64_t hidden = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  double eps = 1e-6;
  // Rotary embedding (with the q/k norm before it), the gated MLP activation (SwiGLU or GeGLU)
  // and Gemma's (1 + w) RMSNorms through the fused CUDA kernels (model/fused_ops.h) instead of
  // their ATen compositions; only where fused_kernels_supported() for the layer's tensors.
  bool fused = false;
  Activation act = Activation::kSilu;
  bool qk_norm = false;     // RMSNorm over head_dim on q and k before rope (q_norm, k_norm)
  bool gemma_norm = false;  // every RMSNorm scales by (1 + weight), computed in fp32
  bool sandwich = false;    // norms after attention and around the MLP (gemma3_text)
  double scale = 0;         // attention score scale; 0: 1 / sqrt(head_dim)
  int64_t window = 0;       // attends to the last `window` positions (itself included); 0: all
  // LoRA (model/lora.h): a linear slot whose adapter slots are defined adds
  // lora_scale * B(A(dropout(x))) to its output, as PEFT's lora.Linear. The dropout applies
  // whenever lora_dropout > 0, with or without autograd: LlamaModel sets it only while training
  // (autograd recording) and 0 otherwise, so that a checkpointed layer's forward (which runs
  // without autograd) draws the masks its recomputation draws again (checkpointed_decoder_layer).
  double lora_scale = 0;
  double lora_dropout = 0;
  // A KV-cache generation call (LlamaModel sets it where it passes a cache): the layer's linear
  // products go through decode_linear (model/cpu_skinny_gemm.h: the skinny GEMM on the CPU in fp32
  // for at most kSkinnyMaxRows rows without autograd; at::linear otherwise). An NF4 slot keeps
  // quant::nf4_linear; a LoRA slot's base product takes it, its adapter's products do not.
  bool decode = false;
  // Layer `layer`'s shape (its window when it slides); -1: the model-wide part only.
  static LayerShape of(const LlamaConfig& c, int64_t layer = -1) {
    LayerShape s{c.hidden_size, c.num_attention_heads, c.num_key_value_heads,
                 c.head_dim,    c.rms_norm_eps,        false};
    s.act = c.hidden_act;
    s.qk_norm = c.qk_norm;
    s.gemma_norm = c.gemma_norm;
    s.sandwich = c.sandwich_norms;
    s.scale = c.query_pre_attn_scalar > 0 ? 1.0 / std::sqrt(c.query_pre_attn_scalar) : 0.0;
    s.window = c.layer_slides(layer) ? c.sliding_window : 0;
    return s;
  }
};

// One decoder layer's weights. A family uses a subset of the slots (layer_slots), in
// transformers' named_parameters() order; the others stay undefined.
struct LayerWeights {
  enum Slot : int {
    kQ,
    kQBias,
    kK,
    kKBias,
    kV,
    kVBias,
    kO,
    kQNorm,
    kKNorm,
    kGate,
    kUp,
    kDown,
    kLnIn,
    kLnPostAttn,
    kLnPreFfn,
    kLnPostFfn,
    // LoRA adapters (model/lora.h): A [r, in] and B [out, r] of each linear slot, in kLinear
    // order; undefined unless an adapter targets that linear.
    kQLoraA,
    kQLoraB,
    kKLoraA,
    kKLoraB,
    kVLoraA,
    kVLoraB,
    kOLoraA,
    kOLoraB,
    kGateLoraA,
    kGateLoraB,
    kUpLoraA,
    kUpLoraB,
    kDownLoraA,
    kDownLoraB,
    kCount
  };
  // The linear (matrix) slots, in the order of their adapter slots.
  static constexpr int kLinear[7] = {kQ, kK, kV, kO, kGate, kUp, kDown};
  static constexpr int kNumLinear = 7;
  // Adapter A slot of linear slot `slot` (B is the next one); -1 when `slot` is not linear.
  static constexpr int lora_a_slot(int slot) {
    for (int i = 0; i < kNumLinear; ++i)
      if (kLinear[i] == slot) return kQLoraA + 2 * i;
    return -1;
  }
  // Index into kLinear (and nf4) of linear slot `slot`; -1 when `slot` is not linear.
  static constexpr int linear_index(int slot) {
    for (int i = 0; i < kNumLinear; ++i)
      if (kLinear[i] == slot) return i;
    return -1;
  }
  static constexpr const char* kNames[kCount] = {"self_attn.q_proj.weight",
                                                 "self_attn.q_proj.bias",
                                                 "self_attn.k_proj.weight",
                                                 "self_attn.k_proj.bias",
                                                 "self_attn.v_proj.weight",
                                                 "self_attn.v_proj.bias",
                                                 "self_attn.o_proj.weight",
                                                 "self_attn.q_norm.weight",
                                                 "self_attn.k_norm.weight",
                                                 "mlp.gate_proj.weight",
                                                 "mlp.up_proj.weight",
                                                 "mlp.down_proj.weight",
                                                 "input_layernorm.weight",
                                                 "post_attention_layernorm.weight",
                                                 "pre_feedforward_layernorm.weight",
                                                 "post_feedforward_layernorm.weight",
                                                 "self_attn.q_proj.lora_A.weight",
                                                 "self_attn.q_proj.lora_B.weight",
                                                 "self_attn.k_proj.lora_A.weight",
                                                 "self_attn.k_proj.lora_B.weight",
                                                 "self_attn.v_proj.lora_A.weight",
                                                 "self_attn.v_proj.lora_B.weight",
                                                 "self_attn.o_proj.lora_A.weight",
                                                 "self_attn.o_proj.lora_B.weight",
                                                 "mlp.gate_proj.lora_A.weight",
                                                 "mlp.gate_proj.lora_B.weight",
                                                 "mlp.up_proj.lora_A.weight",
                                                 "mlp.up_proj.lora_B.weight",
                                                 "mlp.down_proj.lora_A.weight",
                                                 "mlp.down_proj.lora_B.weight"};
  at::Tensor t[kCount];
  // QLoRA (LlamaModel::quantize_base): linear slot kLinear[i] stored as NF4 (quant/nf4.h; owned by
  // the model) instead of t[kLinear[i]], which is then undefined; the layer multiplies through
  // quant::nf4_linear (dequantized on the fly, no gradient for the weight). Null: dense.
  const quant::Nf4Tensor* nf4[kNumLinear] = {};
  const quant::Nf4Tensor* nf4_of(int slot) const {
    const int i = linear_index(slot);
    return i < 0 ? nullptr : nf4[i];
  }
  const at::Tensor& wq() const { return t[kQ]; }
  const at::Tensor& wk() const { return t[kK]; }
  const at::Tensor& wv() const { return t[kV]; }
  const at::Tensor& wo() const { return t[kO]; }
  const at::Tensor& w_gate() const { return t[kGate]; }
  const at::Tensor& w_up() const { return t[kUp]; }
  const at::Tensor& w_down() const { return t[kDown]; }
  const at::Tensor& ln_in() const { return t[kLnIn]; }
  // Llama: the norm before the MLP; with sandwich norms: the norm of the attention output.
  const at::Tensor& ln_post() const { return t[kLnPostAttn]; }
};
// The slots `cfg`'s family has, in transformers' named_parameters() order (Llama: q, k, v, o,
// gate, up, down, input_layernorm, post_attention_layernorm).
CIUIC_API std::vector<int> layer_slots(const LlamaConfig& cfg);
// The input of a LoRA adapter's branch (PEFT's lora_dropout): x with each element zeroed with
// probability p and the rest scaled by 1 / (1 - p) while autograd records (training); x itself
// otherwise (evaluation, generation) and for p = 0. The masks come from the default generator of
// x's device.
CIUIC_API at::Tensor lora_input(const at::Tensor& x, double p);
// The same with the training decision made by the caller: dropped when `train` and p > 0.
CIUIC_API at::Tensor lora_input(const at::Tensor& x, double p, bool train);
// RMSNorm over the last `dim` elements with weight w (gemma_norm: 1 + w, in fp32, rounded once to
// x's dtype, as transformers' Gemma3RMSNorm). fused (where fused_kernels_supported): Gemma's
// through fused_rms_norm (one kernel instead of casts around at::rms_norm); the plain one is
// at::rms_norm either way (fused by PyTorch on CUDA).
CIUIC_API at::Tensor rms_norm_of(const at::Tensor& x, const at::Tensor& w, int64_t dim, double eps,
                                 bool gemma_norm, bool fused = false);

// Rotary tables for one batch, [B, T, 1, head_dim] in the activation dtype:
// cos = cos(cat(f, f)), sin_signed = cat(-sin(f), sin(f)) with f = position * inv_freq, so that
// rope(x) = x * cos + roll(x, head_dim / 2) * sin_signed equals transformers'
// x * cos + rotate_half(x) * sin.
struct RopeTables {
  at::Tensor cos;
  at::Tensor sin_signed;
};

// Inverse frequencies [head_dim / 2], fp32, computed the way transformers does for the config's
// rope type (default, linear: divided by the factor, llama3: smoothed per wavelength). local:
// the sliding layers' rope of gemma3_text (default type, base rope_local_theta).
CIUIC_API at::Tensor rope_inv_freq(const LlamaConfig& cfg, bool local = false);
// position_ids [B, T] (integer, any device) -> tables in `dtype` on position_ids' device.
CIUIC_API RopeTables rope_tables(const at::Tensor& inv_freq, const at::Tensor& position_ids,
                                 at::ScalarType dtype);
// Block-diagonal causal mask [B, 1, T, T] (true = may attend) for packed rows: a document starts
// where position_ids == 0 (the row's first token always starts one). No host synchronisation.
CIUIC_API at::Tensor packed_causal_mask(const at::Tensor& position_ids);
// Causal mask [1, 1, T, T] of a sliding window: query i sees keys j with i - window < j <= i.
CIUIC_API at::Tensor sliding_causal_mask(int64_t t, int64_t window, c10::Device device);

// Document boundaries of packed rows, known on the host (built from the batch's CPU
// position_ids before they go to the device). With them, CUDA runs in bf16/fp16 use
// variable-length flash attention over the documents instead of the dense block-diagonal mask:
// the masked kernel computes every [T, T] block, varlen only each document's own causal triangle
// (2.9x faster attention at 4096 tokens on an H200, docs/performance/model.md). Elsewhere (CPU,
// fp32) the model falls back to the mask, with the same results.
struct CIUIC_API PackedDocs {
  at::Tensor cu_seqlens;  // int32 [num_docs + 1] on the model's device: starts in the flattened
                          // batch, then B*T
  int64_t max_len = 0;    // tokens in the longest document
  int64_t rows = 0;       // B
  int64_t row_len = 0;    // T
  // position_ids [B, T] integer, on the CPU: a document starts at every row start and wherever
  // position_ids == 0. The device copy is asynchronous (from pinned memory on CUDA): no host sync.
  static PackedDocs from_position_ids(const at::Tensor& cpu_position_ids, c10::Device device);
};
// Whether decoder_layer runs `PackedDocs` as varlen flash attention for this dtype/device/head
// size.
CIUIC_API bool varlen_attention_supported(at::ScalarType dtype, c10::Device device,
                                          int64_t head_dim);

// Keys and values of earlier positions, [B, n_kv_heads, T_past, head_dim] (generation only).
// len < 0: the tensors grow by concatenation (one sequence, causal, no mask). len >= 0: k and v
// are preallocated [B, n_kv_heads, capacity, head_dim] with the first `len` positions filled;
// each call writes its keys/values at [len, len + T) and attends over [0, len + T) under the
// caller's mask (which carries padding, causality and the window). Without a mask: causal when
// the cache was empty, else one query (T == 1) over every filled position. With T == 1 a sliding
// layer attends to the last `window` positions only (keys and the mask's columns narrowed).
// slot defined (a static step, LlamaModel::decode_step): T == 1; the key/value go to the cache
// slot this int64 [1] tensor on the cache's device names (index_copy_, no host value), and the
// query attends over all `capacity` positions under the caller's mask, which must hide unfilled
// slots, padding and, for a sliding layer, what lies outside its window; len is neither read nor
// changed. Every shape and host value is then the same from step to step (CUDA-graph capturable).
struct KVCacheLayer {
  at::Tensor k;
  at::Tensor v;
  int64_t len = -1;
  at::Tensor slot;
};

// x [B, T, hidden] -> [B, T, hidden]. Attention is causal; with `mask` (from
// packed_causal_mask and/or sliding_causal_mask) that mask instead; with `docs` (only where
// varlen_attention_supported) causal within each document through flash varlen attention, with
// the layer's window (s.window) applied by the kernel. The caller gives the mask for s.window.
// With `cache`, this call's keys/values are appended to it and the queries attend to the cached
// positions too (T == 1 once the cache is non-empty; a windowed layer keeps its last `window`),
// or, with cache->slot, written at that slot (a static step: the mask is the caller's key bias).
CIUIC_API at::Tensor decoder_layer(const LayerWeights& w, const LayerShape& s, const at::Tensor& x,
                                   const RopeTables& rope, const std::optional<at::Tensor>& mask,
                                   KVCacheLayer* cache = nullptr, const PackedDocs* docs = nullptr);

// The same layer under activation checkpointing (model/autograd_fns.cpp): the forward runs
// without autograd and keeps only its input; the backward recomputes the layer with autograd and
// returns the weights' gradients to the engine, which accumulates them through the parameters'
// ordinary AccumulateGrad nodes (their hooks fire exactly as without checkpointing). With LoRA
// dropout (s.lora_dropout > 0) the forward keeps the state of x's device's default generator and
// the recomputation runs from it, so it draws the forward's masks (as torch's checkpoint with
// preserve_rng_state); the generator is then put back where it was, so the random stream after a
// step is the same as without checkpointing: losses and gradients equal the plain layer's.
// With `boundaries`, the backward's recomputation is announced as group `group`'s kRecompute pass
// (before_group/after_group around it, ciuic/sharding.h).
CIUIC_API at::Tensor checkpointed_decoder_layer(const LayerWeights& w, const LayerShape& s,
                                                const at::Tensor& x, const RopeTables& rope,
                                                const std::optional<at::Tensor>& mask,
                                                const PackedDocs* docs = nullptr,
                                                ciuic::Sharding* boundaries = nullptr,
                                                int group = -1);

// A group boundary on the tensor `x` that flows from group `lower` into group `upper` (-1: none):
// identity in forward; when autograd reaches it in backward, announces after_group(upper,
// kBackward) — group `upper`'s backward is done — then before_group(lower, kBackward). Group 0's
// backward has no input that needs a gradient: its after_group(0, kBackward) is queued for the end
// of the backward. `x` unchanged (no node) when autograd is off or x needs no gradient.
CIUIC_API at::Tensor group_boundary(const at::Tensor& x, ciuic::Sharding* boundaries, int upper,
                                    int lower);

// The FLOPs of the largest matrix product of a forward over `rows` tokens whose lm_head runs on
// `head_rows` of them: 2 * max(rows * hidden * max(q width, intermediate), head_rows * hidden *
// vocab).
CIUIC_API double largest_product_flops(const LlamaConfig& cfg, int64_t rows, int64_t head_rows);

// On the CPU, a product below this many FLOPs (about 0.1 ms on one core at this VM's sgemm rate)
// gains nothing from a second thread: MKL's sgemm and ATen's kernels open an OpenMP parallel region
// for it anyway, whose fork and join cost microseconds on idle cores and a scheduler slice
// (milliseconds) whenever another process holds a core (docs/performance.md, "Held-out evaluation
// on the batched path").
constexpr double kSerialProductFlops = 8.0 * 1024 * 1024;

// Runs its scope on one intra-op thread (at::set_num_threads(1), restored on exit) when `device`
// is the CPU and `largest_flops` < kSerialProductFlops; otherwise does nothing. A generation step
// of a small model (the demo's: hidden 128) is a few dozen such products. Generation decides once
// per call, by its decode step (not per step: going back to two threads for the prefill's larger
// products would wake a sleeping thread for each of them, a scheduler slice on a busy machine).
// CIUIC_SERIAL_SMALL_STEPS=0 in the environment turns it off (A/B).
class CIUIC_API SmallStepThreads {
 public:
  SmallStepThreads(c10::Device device, double largest_flops);
  ~SmallStepThreads();
  SmallStepThreads(const SmallStepThreads&) = delete;
  SmallStepThreads& operator=(const SmallStepThreads&) = delete;
  bool serial() const { return restore_ > 0; }

 private:
  int restore_ = 0;  // the thread count to restore (0: nothing changed)
};

// How linear_cross_entropy_sum gets its gradient.
//  kInForward: when autograd needs gradients, the forward computes them too, token chunk by
//    token chunk (full-vocabulary logits of a chunk, their softmax, d hidden and d weight), and
//    the backward only scales them by the incoming gradient. Three matmuls of [N, H] x [H, V] in
//    all (no recomputation); holds d weight ([V, H] in the weight dtype) and d hidden ([N, H])
//    from the forward to the backward instead of hidden.
//  kRecompute: the forward keeps hidden and the log-sum-exp; the backward recomputes the logits
//    vocabulary chunk by vocabulary chunk. Four matmuls; nothing of [V, H] is held.
enum class LossBackward { kInForward, kRecompute };

// Sum over rows n with labels[n] != -100 of cross_entropy(hidden[n] @ weight^T, labels[n]),
// fp32 scalar, differentiable w.r.t. hidden [N, H] and weight [V, H]. Logits are computed in the
// weights' dtype and upcast to fp32 chunk by chunk: kRecompute chunks the vocabulary (at most
// max(chunk_elements, N * min(V, 128)) fp32 logits at once, forward and backward), kInForward
// the tokens (at most max(chunk_elements, V) at once; with several chunks d weight accumulates in
// fp32, read and written once per chunk: prefer few large chunks, see LlamaModel). labels [N] int64
// must be in [0, V) or -100. Without autograd (no grad mode, or neither input requiring grad) both
// only compute the loss.
CIUIC_API at::Tensor linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight,
                                              const at::Tensor& labels, int64_t chunk_elements,
                                              LossBackward mode = LossBackward::kInForward);

}  // namespace ciuic::model
