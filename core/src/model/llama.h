// model/llama.h — the decoder of every supported family (Llama, Mistral, Qwen2, Qwen3, Gemma 3
// text) in LibTorch: one implementation whose per-family switches come from LlamaConfig
// (model/config.h) through LayerShape and the layer's weight slots (model/llama_ops.h).
//
// Architecture (identical to transformers' <Family>ForCausalLM): token embedding (times
// sqrt(hidden) with scale_embeddings); per layer
//   q, k = rope(norm_qk(q_proj(n) [+ bias])), rope(norm_qk(k_proj(n) [+ bias])), v = v_proj(n) [+
//   bias] a = o_proj(attn(q, k, v)) with n = RMSNorm(x)  [a = RMSNorm(a) with sandwich norms] x +=
//   a; x += down_proj(act(gate_proj(n)) * up_proj(n)) with n = RMSNorm(x) [the MLP output
//   RMSNorm'ed too with sandwich norms]
// final RMSNorm; lm_head (or the embedding matrix when tie_word_embeddings). act is silu
// (SwiGLU) or tanh GELU (GeGLU); norm_qk is an RMSNorm over head_dim when qk_norm; RMSNorm scales
// by (1 + w) when gemma_norm. RMSNorm computes in fp32 and casts back (at::rms_norm); attention is
// at::scaled_dot_product_attention with grouped-query heads (flash / cuDNN kernels on GPU),
// causal, or block-diagonal causal for packed rows, within the layer's sliding window when it
// has one (a mask on the CPU; flash varlen with a window on CUDA in bf16/fp16); scores scaled
// by query_pre_attn_scalar^-1/2 when set. Gemma's sliding layers use their own rope base.
//
// Parameters are leaf tensors (requires_grad) in `dtype` on `device`, created once by the
// constructor and never replaced: callers may keep them, register autograd hooks on them and
// swap their storage with param.set_data(view) (a sharding plugin's flat buffer); the model
// reads them afresh on every call and caches nothing derived from them. Until init_random() or
// load_hf() their values are unspecified.
//
// Threading: forward/loss/generate may run concurrently only if no one mutates the parameters;
// configuration setters are not thread-safe. Failure: ciuic::Error with the file / tensor / shape
// at fault; malformed inputs (wrong rank, dtype or device) are reported before any compute.
// Token ids must lie in [0, vocab_size) and labels in [0, vocab_size) or -100: they are not
// checked on the device (that would synchronise with the host).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include "model/config.h"
#include "model/llama_ops.h"
#include "model/lora.h"
#include "quant/nf4.h"

#include <ciuic/export.h>
#include <ciuic/sharding.h>

namespace ciuic::model {

class SafetensorsReader;

// One parameter of the architecture: its HF name and shape, and where it sits in the model
// (layer index and LayerWeights slot; -1 for the embedding, final norm and lm_head).
struct LlamaParamSpec {
  std::string name;
  std::vector<int64_t> shape;
  int64_t layer = -1;
  int slot = -1;
};
// Every parameter of `cfg`'s model, in LlamaModel::named_parameters() order.
CIUIC_API std::vector<LlamaParamSpec> llama_parameter_specs(const LlamaConfig& cfg);

class CIUIC_API LlamaModel {
 public:
  // Logit elements per chunk of loss_sum (set_loss_chunk_elements), by default.
  static constexpr int64_t kDefaultLossChunkElements = int64_t{1} << 26;

  // Allocates the parameters (uninitialised). dtype: kFloat, kBFloat16 or kHalf.
  // allocate = false: the parameters get storage without memory (right shape, dtype, device and
  // requires_grad; reading one throws "data is not allocated") for a sharding that materialises
  // its shard itself (Sharding::builds_parameters(); it fills them through set_data). Their values
  // then come from init_random_values() / the reader's load_slice_into() (after check_hf()).
  LlamaModel(const LlamaConfig& cfg, at::ScalarType dtype, c10::Device device,
             bool allocate = true);
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  // <folder>/config.json + its safetensors weights.
  static std::unique_ptr<LlamaModel> from_pretrained(const std::string& folder,
                                                     at::ScalarType dtype, c10::Device device);

  // transformers' initialisation: every matrix ~ normal(0, std) (the embedding row of
  // pad_token_id zeroed), biases 0, norm weights 1 (0 with gemma_norm: they scale by 1 + w). Each
  // parameter draws from its own generator seeded from (seed, its index), on the parameter's
  // device: deterministic for a given seed and device type, identical on every rank.
  void init_random(uint64_t seed, double std);
  // Elements [offset, offset + out.numel()) of the flattened value init_random(seed, std) gives
  // parameter `param` (named_parameters() order), written into `out` (1-D, contiguous, the model's
  // dtype, any device): the same bits, drawn whole on device() (in `out` itself when it is the
  // whole parameter, contiguous on device(); in a temporary otherwise). Reads no parameter.
  void init_random_values(int param, int64_t offset, const at::Tensor& out, uint64_t seed,
                          double std) const;
  // Loads safetensors weights (single file or sharded; see SafetensorsReader::open for `path`),
  // converting floating dtypes. Errors name the file and tensor: missing tensor, unexpected tensor
  // (rotary inv_freq buffers and a tied model's lm_head.weight are ignored), shape or dtype
  // mismatch. Parameters keep their identity (values are copied in).
  void load_hf(const std::string& path);
  void load_hf(const SafetensorsReader& reader);
  // load_hf's checks (missing, unexpected tensors, shapes, dtypes) without copying anything.
  void check_hf(const SafetensorsReader& reader) const;

  // HF names in transformers' named_parameters() order: model.embed_tokens.weight, then per layer
  // the family's slots (layer_slots; Llama: self_attn.{q,k,v,o}_proj, mlp.{gate,up,down}_proj,
  // input_layernorm, post_attention_layernorm, each ".weight", prefixed "model.layers.<i>."),
  // model.norm.weight, and lm_head.weight unless the embeddings are tied.
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;
  std::vector<at::Tensor> parameters() const;
  // The parameter groups the model computes with together, indices into named_parameters():
  // "embed" (the embedding), "layers.<i>" (a decoder layer's tensors) and "head" (the final
  // norm and lm_head, or the tied embedding) — ciuic/sharding.h, ParamGroup.
  std::vector<ciuic::ParamGroup> param_groups() const;
  // Announces each group's forward, backward and recomputation to `boundaries`
  // (Sharding::before_group/after_group, in the order ciuic/sharding.h states) in every later
  // forward; null: none. Not owned; must outlive the model's passes.
  void set_group_boundaries(ciuic::Sharding* boundaries) { boundaries_ = boundaries; }

  // LoRA (model/lora.h): allocates A and B for every targeted linear slot of every layer (in the
  // model's dtype, on its device; values unspecified until init_lora() or load_lora()), and
  // freezes every base parameter (requires_grad false) except modules_to_save. Once only.
  void enable_lora(const LoraSpec& spec);
  const LoraSpec* lora() const { return lora_ ? &*lora_ : nullptr; }
  // PEFT's initialisation: A Kaiming-uniform (a = sqrt(5), bound 1/sqrt(in)) or, with
  // LoraInit::kGaussian, normal(0, 1/r); B zero. Deterministic per (seed, parameter index).
  void init_lora(uint64_t seed);
  // The adapter parameters: "model.layers.<i>.<slot name>" (e.g.
  // model.layers.0.self_attn.q_proj.lora_A.weight; PEFT prefixes "base_model.model."), per layer in
  // slot order.
  std::vector<std::pair<std::string, at::Tensor>> lora_parameters() const;
  // Loads a PEFT adapter (adapter_model.safetensors, keys "base_model.model." + the
  // lora_parameters() names; modules_to_save tensors as "base_model.model.<module>.weight").
  // Errors name the file and the tensor: missing, unexpected, or a shape that differs (an
  // adapter made for another base model or rank).
  void load_lora(const SafetensorsReader& reader);
  // Folds each adapter into its base weight, W += scaling * B A (computed in fp32, rounded once
  // to the model's dtype), as PEFT's merge_and_unload(); named_parameters() then holds the merged
  // model (modules_to_save are the base's own tensors already). An NF4 base (quantize_base) is
  // dequantized to fp32 first, W = dequantize(W_nf4) + scaling * B A, every linear weight dense
  // again (PEFT then quantizes the sum back to NF4; quantizing this one gives the same bits). The
  // adapter stays attached: do not run forward afterwards.
  void merge_lora();
  // QLoRA (quant/nf4.h): stores every linear weight of the decoder layers (q, k, v, o, gate, up,
  // down_proj — as bitsandbytes' load_in_4bit replaces every nn.Linear but lm_head; not the
  // embedding, norms or biases) as NF4 in blocks of `blocksize`, with double quantization of the
  // scales when `double_quant`, quantized from the weight in the model's dtype — on the model's
  // device where quant::nf4_quantizes_on(device()) (CUDA builds on CUDA: quant/cuda's kernels),
  // else on the CPU; the same bits either way. The dense weight is dropped (its slot undefined,
  // named_parameters() no longer lists it) and the layer multiplies through quant::nf4_linear in
  // the activations' dtype (the model's: the compute dtype), which dequantizes on the fly and
  // gives the weight no gradient. Without `values` the current weights are quantized (they must
  // hold memory). With `values` (ciuic::ParamValues over named_parameters() indices, e.g.
  // SafetensorsReader::load_slice_into or init_random_values) every parameter is filled from it: a
  // linear weight through a temporary on the device where it is quantized (one weight at a time,
  // dropped before the next), the others given memory if they have none (a model built with
  // allocate = false): the peak is the NF4 base plus one weight (and quantize_nf4's working copy).
  // `progress` (optional) is called with (0, total) first, then (k, total) after the k-th of the
  // `total` linear weights. Once only, before enable_lora or after.
  using QuantizeProgress = std::function<void(int64_t done, int64_t total)>;
  void quantize_base(const ciuic::ParamValues& values = {}, int64_t blocksize = 64,
                     bool double_quant = true, const QuantizeProgress& progress = {});
  bool base_quantized() const { return !nf4_.empty(); }
  // The NF4 weights, by the names their dense parameters had (model.layers.<i>.self_attn.q_proj.
  // weight ...), in named_parameters() order; empty unless quantize_base.
  std::vector<std::pair<std::string, const quant::Nf4Tensor*>> nf4_weights() const;
  // Bytes the NF4 weights hold (quant::nf4_bytes of each).
  int64_t nf4_bytes() const;
  // What training updates: without an adapter named_parameters(); with one the embedding (when in
  // modules_to_save), each layer's adapters, lm_head (when in modules_to_save; a tied model
  // trains the embedding instead). trainable_param_groups() indexes into it.
  std::vector<std::pair<std::string, at::Tensor>> trainable_parameters() const;
  std::vector<ciuic::ParamGroup> trainable_param_groups() const;

  // Recompute each decoder layer in backward instead of keeping its activations. Gradients are
  // unchanged; only the layer inputs stay alive between forward and backward.
  // `layers` > 0 checkpoints only the first `layers` decoder layers (the others keep their
  // activations: less recomputation where memory allows); <= 0 checkpoints all of them.
  void set_activation_checkpointing(bool on, int64_t layers = 0) {
    checkpointing_ = on;
    checkpoint_layers_ = layers;
  }
  bool activation_checkpointing() const { return checkpointing_; }
  // Upper bound on the fp32 logits loss_sum materialises at once (elements). By default
  // (loss_chunk_elements(N) for N tokens): 2^26 with kRecompute; with kInForward at least 2048
  // tokens' logits, max(2^26, min(N, 2048) * V), since each token chunk reads and writes the fp32
  // accumulator of d lm_head (V x H x 8 bytes). A value set here is used as is.
  void set_loss_chunk_elements(int64_t n);
  int64_t loss_chunk_elements(int64_t tokens) const;
  // How loss_sum's gradient is computed (model/llama_ops.h, LossBackward); default kInForward.
  void set_loss_backward(LossBackward mode) { loss_backward_ = mode; }
  LossBackward loss_backward() const { return loss_backward_; }
  // Rotary embedding and the gated MLP activation (SwiGLU, or GeGLU for gemma3_text) through
  // fused CUDA kernels (model/fused_ops.h). On by default where fused_kernels_supported(dtype,
  // device); `on` elsewhere is ignored (the ATen path runs).
  void set_fused_kernels(bool on);
  bool fused_kernels() const { return shape_.fused; }

  // input_ids [B, T] integer; position_ids [B, T] integer or undefined (then 0..T-1 per row).
  // packed: rows hold several documents, each starting where position_ids == 0; attention is
  // block-diagonal causal and rotary positions restart per document.
  // Returns logits [B, T, V] in the model dtype.
  // docs (optional, with packed): the rows' document boundaries known on the host
  // (PackedDocs::from_position_ids of the CPU position_ids); on CUDA in bf16/fp16 attention then
  // runs as varlen flash attention instead of a dense block-diagonal mask. Same results.
  at::Tensor forward(const at::Tensor& input_ids, const at::Tensor& position_ids, bool packed,
                     const PackedDocs* docs = nullptr) const;
  // The final-normed hidden states [B, T, hidden] (what lm_head multiplies).
  at::Tensor hidden_states(const at::Tensor& input_ids, const at::Tensor& position_ids, bool packed,
                           const PackedDocs* docs = nullptr) const;
  // Sum over positions with labels != -100 of the token cross-entropy, fp32 scalar on the model's
  // device, computed in fp32 from logits upcast chunk by chunk (see set_loss_chunk_elements);
  // labels [B, T] int64 are already shifted (labels[t] is the token after input_ids[t]).
  at::Tensor loss_sum(const at::Tensor& input_ids, const at::Tensor& labels,
                      const at::Tensor& position_ids, bool packed,
                      const PackedDocs* docs = nullptr) const;
  // Greedy decoding with a KV cache. Returns the new tokens only (at most max_new_tokens; the
  // last is stop_id when it was produced). Runs without autograd.
  std::vector<int32_t> generate_greedy(const std::vector<int32_t>& prompt, int64_t max_new_tokens,
                                       std::optional<int32_t> stop_id) const;

  // Generation with a preallocated KV cache (model/generate.h drives it; tests call it directly).
  struct DecodeCache {
    std::vector<KVCacheLayer> layers;  // per layer [B, n_kv_heads, capacity, head_dim]
    at::Tensor valid;                  // bool [B, capacity]: a real token (false: left padding)
    // [B, capacity] in the model's dtype: 0 where valid, -inf at padding — the key-padding mask
    // of a one-token step, kept up to date in place (a view of it is the step's mask).
    at::Tensor key_bias;
    int64_t len = 0;  // positions filled
    // The caller's promise that every position it gives is valid (no padding): attention then
    // runs without a mask (causal prefill, one-token steps over the filled cache). Set by
    // new_decode_cache's `no_padding`; a false `valid` with it set is an error of the caller.
    bool no_padding = false;
    // CPU, fp32, batch >= 2, a head product of at least kSerialProductFlops (model/llama_ops.h),
    // and a batch the skinny GEMM does not take (more than kSkinnyMaxRows rows, or
    // CIUIC_SKINNY_GEMM=0; model/cpu_skinny_gemm.h): the lm_head weight reordered once for
    // oneDNN's linear (made by new_decode_cache for this cache's generation; decode's
    // last-position logits use it, 1.1-2.4x faster than MKL's sgemm at batch 8 here:
    // docs/performance.md, "CPU decode against its floor"); undefined elsewhere, or with
    // CIUIC_ONEDNN_HEAD=0 in the environment.
    at::Tensor head_reordered;
    int64_t capacity() const { return valid.defined() ? valid.size(1) : 0; }
  };
  DecodeCache new_decode_cache(int64_t batch, int64_t capacity, bool no_padding = false) const;
  // Runs input_ids [B, T] at position_ids [B, T] (integer, the model's device) after the cached
  // positions; valid [B, T] bool marks real tokens (padding is never attended to, except by
  // itself). Every layer attends to the cached and new positions causally, within its window
  // counted in cache positions (as transformers' masks count them). Returns fp32 logits [B, V] of
  // the last position (last_only) or [B, T, V] of all. Runs without autograd.
  // A one-token step (T == 1) builds no mask: its queries see the filled cache (narrowed to the
  // last `window` positions in a sliding layer) under key_bias, or under no mask at all with
  // no_padding; a prefill (empty cache) with no_padding runs plain causal attention.
  at::Tensor decode(const at::Tensor& input_ids, const at::Tensor& position_ids,
                    const at::Tensor& valid, DecodeCache& cache, bool last_only = true) const;
  // A one-token step of static shape (the alternative to decode's T == 1 step), for CUDA-graph
  // capture (model/step_graph.h): input_ids and position_ids [B, 1] and slot [1] (int64), all on
  // the model's device, are read there and not on the host, so every shape and host value of the
  // call is the same from step to step. The new key/value go to cache slot `slot` of every
  // layer, valid[:, slot] is set, and the query attends over all `capacity` slots under a key
  // bias computed on the device from `valid` (-inf at unfilled slots and left padding) and, for
  // a sliding layer, from `slot` (-inf at slots <= slot - window, the window counted in cache
  // slots as decode counts it). Returns fp32 logits [B, V] (a new tensor). Runs without autograd.
  // The caller owns the slot arithmetic: the cache must have been prefilled by decode() (len > 0),
  // slot must lie in [len, capacity) and grow by one per step (not checked: that would read the
  // device); cache.len is not advanced, so after the first decode_step the cache takes only
  // decode_step calls. The group boundaries are announced as in forward (host callbacks: a
  // captured graph would not replay them).
  at::Tensor decode_step(const at::Tensor& input_ids, const at::Tensor& position_ids,
                         const at::Tensor& slot, DecodeCache& cache) const;
  // The boundaries set_group_boundaries gave (null: none).
  ciuic::Sharding* group_boundaries() const { return boundaries_; }

  const LlamaConfig& config() const { return cfg_; }
  at::ScalarType dtype() const { return dtype_; }
  c10::Device device() const { return device_; }
  const at::Tensor& embed_weight() const { return embed_; }
  const at::Tensor& lm_head_weight() const { return cfg_.tie_word_embeddings ? embed_ : lm_head_; }
  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }

 private:
  // The embedding and the decoder layers: the last layer's output, the head group begun (its
  // before_group announced); head_begin() normalises it, head_end() ends the head group on the
  // head's result.
  // cache_masks (with cache): the attention masks of every layer and of the sliding ones
  // (undefined: the same), instead of the ones built here.
  struct CacheMasks {
    at::Tensor full, window;
  };
  at::Tensor hidden_impl(const at::Tensor& input_ids, const at::Tensor& position_ids, bool packed,
                         const PackedDocs* docs, std::vector<KVCacheLayer>* cache,
                         const CacheMasks* cache_masks = nullptr) const;
  at::Tensor head_begin(const at::Tensor& h) const;
  at::Tensor head_end(const at::Tensor& out) const;
  int head_group() const { return static_cast<int>(layers_.size()) + 1; }
  void announce_before(int group) const;
  void announce_after(int group) const;
  void check_tokens(const at::Tensor& t, const char* what, c10::IntArrayRef shape) const;
  // init_random's value of parameter `index` (named_parameters() order) `name`, written into `t`.
  void init_parameter(size_t index, const std::string& name, const at::Tensor& t, uint64_t seed,
                      double std) const;

  LlamaConfig cfg_;
  LayerShape shape_;
  at::ScalarType dtype_;
  c10::Device device_;
  at::Tensor inv_freq_;  // fp32 [head_dim / 2] on device_ (derived from the config, not weights)
  at::Tensor inv_freq_local_;  // the sliding layers' (local_rope); undefined otherwise
  double embed_scale_ = 1.0;   // sqrt(hidden) rounded to dtype_ (scale_embeddings), else 1
  std::vector<int> slots_;     // layer_slots(cfg_)
  at::Tensor embed_;
  std::vector<LayerWeights> layers_;
  at::Tensor norm_;
  at::Tensor lm_head_;            // undefined when tied
  std::optional<LoraSpec> lora_;  // enable_lora
  std::vector<std::unique_ptr<quant::Nf4Tensor>>
      nf4_;  // quantize_base: LayerWeights::nf4 point here
  bool checkpointing_ = false;
  int64_t checkpoint_layers_ = 0;    // <= 0: all
  int64_t loss_chunk_elements_ = 0;  // 0: the default rule (loss_chunk_elements)
  LossBackward loss_backward_ = LossBackward::kInForward;
  ciuic::Sharding* boundaries_ = nullptr;  // set_group_boundaries
};

}  // namespace ciuic::model
