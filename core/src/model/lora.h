// model/lora.h — LoRA adapters on the decoder's linear slots (PEFT's LoraConfig semantics).
//
// An adapter on linear slot W (out x in) adds two parameters, A [r, in] and B [out, r], held in
// the layer's adapter slots (LayerWeights::kQLoraA ...), and the layer computes
//   W x (+ bias) + scaling * B (A dropout(x)),   scaling = alpha / r  (alpha / sqrt(r) with rslora)
// exactly as peft.tuners.lora.Linear. The base parameters are frozen by LlamaModel::enable_lora
// (requires_grad false): they get no gradient and are not handed to the sharding or optimizer
// plugins, which see only LlamaModel::trainable_parameters().
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include "model/config.h"
#include "model/safetensors.h"

#include <ciuic/export.h>

namespace ciuic::model {

enum class LoraInit { kDefault, kGaussian };

struct LoraSpec {
  int64_t r = 8;
  double alpha = 8;
  double dropout = 0;
  bool rslora = false;
  LoraInit init = LoraInit::kDefault;
  std::vector<int> targets;  // linear slots (LayerWeights::kQ ...), from lora_target_slots
  std::vector<std::string> target_names;  // as the recipe gave them (adapter_config.json)
  bool save_embed = false;                // modules_to_save: embed_tokens trained fully
  bool save_lm_head = false;              // modules_to_save: lm_head trained fully
  // Set by LlamaModel::enable_lora: the model ties lm_head to the embedding, so modules_to_save
  // trains the one shared tensor (PEFT's ensure_weight_tying = true, written so on export).
  bool tied = false;
  // From an adapter_config.json without ensure_weight_tying: on a tied model PEFT's
  // modules_to_save trains an untied copy; enable_lora refuses it on a tied model.
  bool untied_save = false;
  std::string init_from;  // [adapter] init_from: a PEFT adapter folder the run starts from
  // QLoRA: "nf4" stores the frozen base's linear weights as NF4 (LlamaModel::quantize_base);
  // "" keeps them dense. Not part of PEFT's adapter_config.json (PEFT records no quantization).
  std::string base_quantization;
  double scaling() const;
};

// PEFT's module names of the decoder's linear layers (q_proj ... down_proj), in slot order.
CIUIC_API const std::vector<std::string>& lora_linear_names();
// Linear slots matched by `names` (PEFT names, or the single "all-linear": every linear of the
// decoder layers, lm_head excluded as PEFT does). Throws ciuic::UsageError naming `key` and listing
// the model's linear module names when a name matches nothing or the list is empty.
CIUIC_API std::vector<int> lora_target_slots(const std::vector<std::string>& names,
                                             const std::string& key);

// Elements of the adapter on `cfg`'s model: r x (in + out) per targeted linear per layer, plus
// modules_to_save (the embedding; lm_head, or nothing more when tied).
CIUIC_API int64_t lora_num_parameters(const LlamaConfig& cfg, const LoraSpec& spec);

// PEFT's adapter_config.json for `spec` on the base model folder `base_path` (PEFT 0.21's keys;
// target_modules by module name, "all-linear" written out as the seven names).
CIUIC_API nlohmann::json peft_adapter_config(const LoraSpec& spec, const std::string& base_path);
// The spec an adapter_config.json describes (LORA only; `where` names the file in errors: a
// UsageError for another peft_type, a bias, fan_in_fan_out, DoRA, or per-layer rank patterns).
CIUIC_API LoraSpec lora_spec_from_peft(const nlohmann::json& config, const std::string& where);
// The JSON of an adapter_config.json file: a regular file of at most kMaxJsonInputBytes
// (ciuic/files.h), nested at most kMaxJsonDepth; otherwise, or when it is not JSON, a UsageError
// naming `path`. lora_spec_from_peft() then reads the spec from it.
CIUIC_API nlohmann::json read_peft_adapter_config(const std::string& path);
// A PEFT adapter folder, written atomically file by file: adapter_config.json (`config`) and
// adapter_model.safetensors with `adapter` (names as LlamaModel::trainable_parameters()) under
// PEFT's saved keys ("base_model.model." + name: save_pretrained drops modules_to_save's
// ".modules_to_save.default"), floating tensors in `dtype`. With ensure_weight_tying in `config`
// the tied embedding is written under the lm_head key too, as PEFT writes it.
CIUIC_API void write_peft_folder(const std::string& folder, const nlohmann::json& config,
                                 const NamedTensors& adapter, at::ScalarType dtype);

// [adapter] init_from: the spec of the PEFT adapter folder `folder` (its adapter_config.json)
// reconciled with the recipe's `recipe` spec: keys the recipe left at their defaults
// (`defaulted` holds their names: r, alpha, dropout, use_rslora, target_modules, modules_to_save)
// are filled from the folder, a key the recipe set to another value is a UsageError naming the key
// and both values. `where` names the recipe key in errors.
CIUIC_API LoraSpec lora_spec_init_from(const std::string& folder, const LoraSpec& recipe,
                                       const std::vector<std::string>& defaulted,
                                       const std::string& where);

}  // namespace ciuic::model
