// model/config.h — a decoder-only architecture as described by a Hugging Face config.json.
//
// LlamaConfig (the name is historical: it describes every family ciuic implements) reads the
// config.json of these `model_type`s (ModelFamily), with transformers' defaults for absent keys:
//   * "llama"       — Llama 1/2/3, CodeLlama, DeepSeek-LLM / deepseek-coder, TinyLlama, SmolLM;
//   * "mistral"     — Llama plus `sliding_window` on every layer (null: full attention);
//   * "qwen2"       — biases on the q/k/v projections; `use_sliding_window` + `max_window_layers`
//                     (or `layer_types`) give windowed layers; DeepSeek-R1-Distill-Qwen, Qwen2.5;
//   * "qwen3"       — per-head RMSNorm on q and k (q_norm, k_norm), explicit head_dim;
//   * "gemma3_text" — (1 + w) RMSNorm, embeddings scaled by sqrt(hidden_size), GeGLU (tanh GELU),
//                     norms before and after attention and MLP, q/k norms, query_pre_attn_scalar,
//                     sliding-window layers (`layer_types` or `sliding_window_pattern`) with their
//                     own rope base (`rope_local_base_freq`, or rope_parameters.sliding_attention).
// Both rope forms found in the wild are read:
//   * older files (transformers < 5): "rope_theta": 100000, "rope_scaling": {"type": "linear", ...}
//   * transformers >= 5: "rope_parameters": {"rope_type": "linear", "rope_theta": 100000, ...}
//     (gemma3_text: one such dict per layer type, {"full_attention": {...}, "sliding_attention":
//     {...}})
// plus "head_dim" when present (else hidden_size / num_attention_heads), grouped-query attention
// and tied or untied embeddings. Supported rope types: "default", "linear" and "llama3"; anything
// else (dynamic, yarn, longrope, partial_rotary_factor != 1) and any option the family does not
// implement (an unknown model_type — the message lists the supported ones —, hidden_act other than
// the family's, attention_bias / mlp_bias, logit soft-capping, bidirectional attention, a
// non-default rope on gemma's sliding layers) is refused with a ciuic::Error naming the file, the
// key and the expected values. A `pad_token_id` may be negative, counting from the end of the
// vocabulary as torch.nn.Embedding's padding_idx does (-1 is the last row; old Llama conversions).
//
// Thread-safety: a plain value type. Failure: from_json/from_file/with_overrides throw
// ciuic::Error ("<file>: key `x`: <what was expected, what was found>").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <ciuic/export.h>

namespace ciuic::model {

enum class RopeType { kDefault, kLinear, kLlama3 };
CIUIC_API const char* rope_type_name(RopeType t);  // "default", "linear", "llama3"

// The architectures, by HF model_type.
enum class ModelFamily { kLlama, kMistral, kQwen2, kQwen3, kGemma3Text };
CIUIC_API const char* model_type_name(
    ModelFamily f);  // "llama", "mistral", "qwen2", "qwen3", "gemma3_text"
CIUIC_API std::string supported_model_types();  // "\"llama\", \"mistral\", ..." for messages

// The MLP's activation: SwiGLU (silu) or GeGLU with tanh-approximated GELU ("gelu_pytorch_tanh").
enum class Activation { kSilu, kGeluTanh };

struct CIUIC_API LlamaConfig {
  ModelFamily family = ModelFamily::kLlama;
  int64_t vocab_size = 32000;
  int64_t hidden_size = 4096;
  int64_t intermediate_size = 11008;
  int64_t num_hidden_layers = 32;
  int64_t num_attention_heads = 32;
  int64_t num_key_value_heads = 32;
  int64_t head_dim = 128;
  int64_t max_position_embeddings = 2048;
  double rope_theta = 10000.0;
  double rms_norm_eps = 1e-6;
  bool tie_word_embeddings = false;

  // Rotary scaling. kLinear divides positions (equivalently the inverse frequencies) by
  // rope_scaling_factor; kLlama3 additionally uses the three fields after it.
  RopeType rope_type = RopeType::kDefault;
  double rope_scaling_factor = 1.0;  // 1 = none
  double rope_low_freq_factor = 1.0;
  double rope_high_freq_factor = 4.0;
  int64_t rope_original_max_position_embeddings = 0;  // 0 = max_position_embeddings

  std::optional<int64_t> bos_token_id = 1;
  std::optional<int64_t> eos_token_id = 2;  // the first of eos_token_ids
  std::vector<int64_t> eos_token_ids{2};    // config.json may list several
  // Embedding padding row (torch.nn.Embedding's padding_idx): that row gets no gradient from the
  // embedding lookup and is zeroed by init_random. May be negative (counting from the end).
  std::optional<int64_t> pad_token_id;
  double initializer_range = 0.02;
  std::string torch_dtype;  // as written in the file ("bfloat16", ...); "" when absent

  // ---- family switches (set by from_json for the model_type; the model reads only these) ----
  Activation hidden_act = Activation::kSilu;
  bool qkv_bias = false;    // qwen2: biases on q_proj, k_proj, v_proj (not o_proj)
  bool qk_norm = false;     // qwen3, gemma3_text: RMSNorm over head_dim on q and k, before rope
  bool gemma_norm = false;  // gemma3_text: RMSNorm scales by (1 + weight); norms initialised to 0
  bool sandwich_norms = false;  // gemma3_text: post-attention, pre- and post-feed-forward norms
  bool scale_embeddings =
      false;                // gemma3_text: embeddings times sqrt(hidden_size) (in the model dtype)
  bool local_rope = false;  // gemma3_text: sliding layers use rope_local_theta (default rope type)
  // Attention scores are scaled by query_pre_attn_scalar^-1/2 (gemma3_text); 0: head_dim^-1/2.
  double query_pre_attn_scalar = 0;
  // Windowed layers attend to the last `sliding_window` positions (themselves included), as
  // transformers' sliding_window_overlay (kv > q - window). sliding_layers[i] != 0 marks layer i;
  // empty or sliding_window == 0: every layer attends to all earlier positions.
  int64_t sliding_window = 0;
  std::vector<uint8_t> sliding_layers;
  // qwen2/qwen3: layers from this index on slide when use_sliding_window (and no layer_types).
  int64_t max_window_layers = 0;
  // gemma3_text: every pattern-th layer is full, the others slide (when no layer_types); 0 when
  // the file's layer_types follow no such pattern.
  int64_t sliding_window_pattern = 0;
  // gemma3_text: the sliding layers' rope base (default rope type); the full layers use rope_theta
  // and the rope scaling above.
  double rope_local_theta = 10000.0;

  bool layer_slides(int64_t layer) const {
    return sliding_window > 0 && layer >= 0 && static_cast<size_t>(layer) < sliding_layers.size() &&
           sliding_layers[static_cast<size_t>(layer)] != 0;
  }
  // The embedding's padding row in [0, vocab_size), or -1 for none (at::embedding's convention).
  int64_t padding_idx() const {
    if (!pad_token_id) return -1;
    return *pad_token_id < 0 ? *pad_token_id + vocab_size : *pad_token_id;
  }

  // The family's defaults (transformers' <Family>Config defaults) for keys config.json leaves out.
  static LlamaConfig defaults(ModelFamily family);
  // Parses a config.json object. `origin` (usually the file path) prefixes every error message.
  static LlamaConfig from_json(const nlohmann::json& j, const std::string& origin);
  static LlamaConfig from_file(const std::string& config_json_path);
  // Applies HF keys given in `overrides` (the recipe's [model.config] section as JSON) on top of
  // this config and validates the result. Besides config.json keys it understands the recipe's
  // flat keys "rope_scaling_type" ("none" | "linear") and "rope_scaling_factor".
  LlamaConfig with_overrides(const nlohmann::json& overrides, const std::string& origin) const;

  // A config.json transformers loads as the family's *ForCausalLM (LlamaForCausalLM, ...,
  // Gemma3ForCausalLM). Rope settings are written in both forms (rope_theta + rope_scaling for
  // transformers 4, rope_parameters for 5). from_json(to_json()) == *this.
  nlohmann::json to_json() const;
  // generation_config.json content (bos/eos/pad ids).
  nlohmann::json generation_json() const;

  // Checks ranges and divisibility; throws ciuic::Error prefixed with `origin`.
  void validate(const std::string& origin) const;

  // Parameter count (transformers' num_parameters()). include_embeddings=false leaves out
  // embed_tokens and an untied lm_head.
  int64_t num_parameters(bool include_embeddings = true) const;
  // Training FLOPs per token (PaLM appendix B): 6 * N + 12 * L * (heads * head_dim) * seq_len,
  // where N counts every weight used in a matmul (all parameters but the input embedding; an
  // lm_head counts even when tied) — norms are included, they are negligible.
  double flops_per_token(int64_t seq_len) const;

  bool operator==(const LlamaConfig&) const = default;
};

}  // namespace ciuic::model
