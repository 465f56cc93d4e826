// LoRA target resolution and scaling (model/lora.h).
#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <iterator>

#include <ciuic/error.h>

#include "model/llama_ops.h"

namespace ciuic::model {

double LoraSpec::scaling() const {
  return rslora ? alpha / std::sqrt(static_cast<double>(r)) : alpha / static_cast<double>(r);
}

const std::vector<std::string>& lora_linear_names() {
  static const std::vector<std::string> names{"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                              "gate_proj", "up_proj", "down_proj"};
  return names;
}

std::vector<int> lora_target_slots(const std::vector<std::string>& names, const std::string& key) {
  const auto& linear = lora_linear_names();
  std::string known;
  for (const auto& n : linear) known += (known.empty() ? "" : ", ") + n;
  if (names.empty())
    throw UsageError(key + ": empty; expected module names among " + known + ", or \"all-linear\"");
  std::vector<int> slots;
  for (const auto& n : names) {
    if (n == "all-linear") {
      for (int i = 0; i < LayerWeights::kNumLinear; ++i) slots.push_back(LayerWeights::kLinear[i]);
      continue;
    }
    const auto it = std::find(linear.begin(), linear.end(), n);
    if (it == linear.end())
      throw UsageError(key + ": \"" + n +
                       "\" matches no linear module of the model; its linear modules are " + known +
                       " (and \"all-linear\" for all of them)");
    slots.push_back(LayerWeights::kLinear[it - linear.begin()]);
  }
  std::sort(slots.begin(), slots.end());
  slots.erase(std::unique(slots.begin(), slots.end()), slots.end());
  return slots;
}

int64_t lora_num_parameters(const LlamaConfig& c, const LoraSpec& spec) {
  const int64_t h = c.hidden_size, q = c.num_attention_heads * c.head_dim,
                kv = c.num_key_value_heads * c.head_dim, m = c.intermediate_size;
  int64_t per_layer = 0;
  for (int slot : spec.targets) {
    using W = LayerWeights;
    const int64_t io = slot == W::kQ                    ? h + q
                       : slot == W::kK || slot == W::kV ? h + kv
                       : slot == W::kO                  ? q + h
                                                        : m + h;
    per_layer += spec.r * io;
  }
  int64_t n = per_layer * c.num_hidden_layers;
  if (spec.save_embed || (spec.save_lm_head && c.tie_word_embeddings)) n += c.vocab_size * h;
  if (spec.save_lm_head && !c.tie_word_embeddings) n += c.vocab_size * h;
  return n;
}

nlohmann::json peft_adapter_config(const LoraSpec& spec, const std::string& base_path) {
  nlohmann::json targets = nlohmann::json::array();
  for (int slot : spec.targets)
    for (int i = 0; i < LayerWeights::kNumLinear; ++i)
      if (LayerWeights::kLinear[i] == slot)
        targets.push_back(lora_linear_names()[static_cast<size_t>(i)]);
  nlohmann::json save = nlohmann::json::array();
  if (spec.save_embed) save.push_back("embed_tokens");
  if (spec.save_lm_head) save.push_back("lm_head");
  return {{"peft_type", "LORA"},
          {"task_type", "CAUSAL_LM"},
          {"base_model_name_or_path", base_path},
          {"r", spec.r},
          {"lora_alpha", spec.alpha},
          {"lora_dropout", spec.dropout},
          {"target_modules", targets},
          {"use_rslora", spec.rslora},
          {"use_dora", false},
          {"init_lora_weights",
           spec.init == LoraInit::kGaussian ? nlohmann::json("gaussian") : nlohmann::json(true)},
          {"modules_to_save", save.empty() ? nlohmann::json(nullptr) : save},
          {"bias", "none"},
          {"fan_in_fan_out", false},
          {"inference_mode", true},
          {"rank_pattern", nlohmann::json::object()},
          {"alpha_pattern", nlohmann::json::object()},
          {"peft_version", "0.21.2"}};
}

LoraSpec lora_spec_from_peft(const nlohmann::json& j, const std::string& where) {
  auto bad = [&](const std::string& what) { throw UsageError(where + ": " + what); };
  if (!j.is_object()) bad("not a JSON object");
  if (j.value("peft_type", std::string()) != "LORA")
    bad("peft_type is not \"LORA\" (ciuic reads LoRA adapters only)");
  if (j.value("bias", std::string("none")) != "none")
    bad("bias = \"" + j.value("bias", std::string()) + "\" is not supported (only \"none\")");
  if (j.value("fan_in_fan_out", false)) bad("fan_in_fan_out = true is not supported");
  if (j.contains("use_dora") && j["use_dora"].is_boolean() && j["use_dora"].get<bool>())
    bad("use_dora = true is not supported");
  for (const char* k : {"rank_pattern", "alpha_pattern"})
    if (j.contains(k) && j[k].is_object() && !j[k].empty())
      bad(std::string(k) + " (per-module ranks) is not supported");
  LoraSpec s;
  try {
    s.r = j.at("r").get<int64_t>();
    s.alpha = j.at("lora_alpha").get<double>();
    s.dropout = j.value("lora_dropout", 0.0);
    s.rslora = j.value("use_rslora", false);
    s.init = j.contains("init_lora_weights") && j["init_lora_weights"] == "gaussian"
                 ? LoraInit::kGaussian
                 : LoraInit::kDefault;
    const auto& t = j.at("target_modules");
    if (t.is_string()) {
      s.target_names = {t.get<std::string>()};
    } else {
      // Full module paths (what PEFT writes after matching "all-linear") count by their last part.
      for (const auto& n : t) {
        std::string name = n.get<std::string>();
        if (const auto dot = name.rfind('.'); dot != std::string::npos) name = name.substr(dot + 1);
        if (std::find(s.target_names.begin(), s.target_names.end(), name) == s.target_names.end())
          s.target_names.push_back(name);
      }
    }
    if (j.contains("modules_to_save") && j["modules_to_save"].is_array())
      for (const auto& m : j["modules_to_save"]) {
        const std::string name = m.get<std::string>();
        if (name == "embed_tokens")
          s.save_embed = true;
        else if (name == "lm_head")
          s.save_lm_head = true;
        else
          bad("modules_to_save: \"" + name + "\" is not supported (embed_tokens, lm_head)");
      }
  } catch (const nlohmann::json::exception& e) {
    bad(std::string("malformed adapter config: ") + e.what());
  }
  if (s.r <= 0) bad("r = " + std::to_string(s.r) + " must be > 0");
  if (!(s.alpha > 0)) bad("lora_alpha must be > 0");
  s.targets = lora_target_slots(s.target_names, where + ": target_modules");
  return s;
}

void write_peft_folder(const std::string& folder, const nlohmann::json& config,
                       const NamedTensors& adapter, at::ScalarType dtype) {
  std::filesystem::create_directories(folder);
  NamedTensors out;
  for (const auto& [name, t] : adapter)
    out.emplace_back("base_model.model." + name,
                     t.is_floating_point() ? t.to(at::kCPU).to(dtype).contiguous() : t);
  SafetensorsWriteOptions wo;
  wo.metadata["format"] = "pt";
  write_safetensors((std::filesystem::path(folder) / "adapter_model.safetensors").string(), out,
                    wo);
  nlohmann::json peft = config;
  for (auto it = peft.begin(); it != peft.end();)
    it = it.key().starts_with("ciuic_") ? peft.erase(it) : std::next(it);
  write_file_atomic((std::filesystem::path(folder) / "adapter_config.json").string(),
                    peft.dump(2) + "\n");
}

}  // namespace ciuic::model
