// model/config.h — the Llama architecture as described by a Hugging Face config.json.
//
// LlamaConfig reads both forms of config.json found in the wild:
//   * older files (transformers < 5, DeepSeek-LLM, deepseek-coder, Llama-2/3):
//       "rope_theta": 100000, "rope_scaling": {"type": "linear", "factor": 4.0}   (or null)
//   * transformers >= 5:
//       "rope_parameters": {"rope_type": "linear", "rope_theta": 100000, "factor": 4.0}
// plus "head_dim" when present (else hidden_size / num_attention_heads), grouped-query attention
// (num_key_value_heads, default num_attention_heads) and tied or untied embeddings. Defaults for
// absent keys are those of transformers' LlamaConfig. Supported rope types: "default", "linear"
// and "llama3" (Llama-3.1 style frequency smoothing); anything else (dynamic, yarn, longrope,
// per-layer rope dicts, partial_rotary_factor != 1) and any architecture option the model does not
// implement (model_type other than "llama", hidden_act other than "silu", attention_bias,
// mlp_bias) is refused with a ciuic::Error naming the file and the key.
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

struct CIUIC_API LlamaConfig {
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
  std::optional<int64_t> pad_token_id;
  double initializer_range = 0.02;
  std::string torch_dtype;  // as written in the file ("bfloat16", ...); "" when absent

  // Parses a config.json object. `origin` (usually the file path) prefixes every error message.
  static LlamaConfig from_json(const nlohmann::json& j, const std::string& origin);
  static LlamaConfig from_file(const std::string& config_json_path);
  // Applies HF keys given in `overrides` (the recipe's [model.config] section as JSON) on top of
  // this config and validates the result. Besides config.json keys it understands the recipe's
  // flat keys "rope_scaling_type" ("none" | "linear") and "rope_scaling_factor".
  LlamaConfig with_overrides(const nlohmann::json& overrides, const std::string& origin) const;

  // A config.json transformers loads as LlamaForCausalLM (model_type "llama"). Rope settings are
  // written in both forms (rope_theta + rope_scaling for transformers 4, rope_parameters for 5).
  nlohmann::json to_json() const;
  // generation_config.json content (bos/eos/pad ids).
  nlohmann::json generation_json() const;

  // Checks ranges and divisibility; throws ciuic::Error prefixed with `origin`.
  void validate(const std::string& origin) const;

  // Parameter count. include_embeddings=false leaves out embed_tokens and an untied lm_head.
  int64_t num_parameters(bool include_embeddings = true) const;
  // Training FLOPs per token (PaLM appendix B): 6 * N + 12 * L * (heads * head_dim) * seq_len,
  // where N counts every weight used in a matmul (all parameters but the input embedding; an
  // lm_head counts even when tied) — norms are included, they are negligible.
  double flops_per_token(int64_t seq_len) const;

  bool operator==(const LlamaConfig&) const = default;
};

}  // namespace ciuic::model
