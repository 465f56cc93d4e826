// LoRA target resolution and scaling (model/lora.h).
#include "model/lora.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <ciuic/error.h>
#include <ciuic/files.h>
#include <ciuic/json.h>

#include "model/llama_ops.h"
#include "model/safetensors.h"

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
          {"ensure_weight_tying", spec.tied && !save.empty()},
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
  // A key of another type (`"bias": 1`) is named, never a library exception (fuzz: modelfiles).
  using J = nlohmann::json;
  auto typed = [&](const char* k, bool (J::*is)() const noexcept, const char* type) {
    const auto it = j.find(k);
    if (it != j.end() && !it->is_null() && !((*it).*is)())
      bad(std::string(k) + " must be " + type + ", got " + it->dump());
  };
  for (const char* k : {"peft_type", "bias"}) typed(k, &J::is_string, "a string");
  for (const char* k : {"fan_in_fan_out", "use_rslora"}) typed(k, &J::is_boolean, "true or false");
  for (const char* k : {"lora_alpha", "lora_dropout"}) typed(k, &J::is_number, "a number");
  typed("r", &J::is_number_integer, "an integer");  // a float past int64 would be UB to convert
  LoraSpec s;
  try {
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
    // PEFT lists a tied module under its path too ("model.embed_tokens"): names count by their
    // last part.
    if (j.contains("modules_to_save") && j["modules_to_save"].is_array())
      for (const auto& m : j["modules_to_save"]) {
        std::string name = m.get<std::string>();
        if (const auto dot = name.rfind('.'); dot != std::string::npos) name = name.substr(dot + 1);
        if (name == "embed_tokens")
          s.save_embed = true;
        else if (name == "lm_head")
          s.save_lm_head = true;
        else
          bad("modules_to_save: \"" + name + "\" is not supported (embed_tokens, lm_head)");
      }
    s.untied_save = (s.save_embed || s.save_lm_head) &&
                    !(j.contains("ensure_weight_tying") && j["ensure_weight_tying"].is_boolean() &&
                      j["ensure_weight_tying"].get<bool>());
  } catch (const nlohmann::json::exception& e) {
    bad(std::string("malformed adapter config: ") + e.what());
  }
  if (s.r <= 0) bad("r = " + std::to_string(s.r) + " must be > 0");
  if (!(s.alpha > 0)) bad("lora_alpha must be > 0");
  s.targets = lora_target_slots(s.target_names, where + ": target_modules");
  return s;
}

nlohmann::json read_peft_adapter_config(const std::string& path) {
  std::string text;
  try {
    text = read_input(path, "adapter config (PEFT's adapter_config.json)", kMaxJsonInputBytes);
  } catch (const Error& e) {
    throw UsageError(e.what());
  }
  check_json_depth(text, path, kExitUsage);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(path + ": malformed JSON: " + e.what());
  }
}

void write_peft_folder(const std::string& folder, const nlohmann::json& config,
                       const NamedTensors& adapter, at::ScalarType dtype) {
  std::filesystem::create_directories(folder);
  NamedTensors out;
  bool has_head = false;
  for (const auto& [name, t] : adapter) {
    out.emplace_back("base_model.model." + name,
                     t.is_floating_point() ? t.to(at::kCPU).to(dtype).contiguous() : t);
    has_head = has_head || name == "lm_head.weight";
  }
  // A tied modules_to_save: PEFT writes the one trained tensor under both modules' keys.
  if (config.is_object() && config.value("ensure_weight_tying", false) && !has_head)
    for (const auto& [name, t] : out)
      if (name == "base_model.model.model.embed_tokens.weight") {
        out.emplace_back("base_model.model.lm_head.weight", t);
        break;
      }
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

namespace {

// The rank the adapter's config claims must be the rank of its tensors (lora_A [r, in], lora_B
// [out, r]) before anything of that rank is allocated: a config saying r = 1e11 beside small
// tensors would otherwise allocate r x hidden per targeted layer first (fuzz: modelfiles). Only
// the safetensors header is read.
void check_adapter_rank(const std::string& folder, int64_t r) {
  const std::string file = (std::filesystem::path(folder) / "adapter_model.safetensors").string();
  std::shared_ptr<const SafetensorsFile> f;
  try {
    f = SafetensorsFile::open(file);
  } catch (const Error& e) {
    throw UsageError(std::string("[adapter] init_from: ") + e.what());
  }
  for (const auto& e : f->entries()) {
    const bool a = e.name.ends_with(".lora_A.weight"), b = e.name.ends_with(".lora_B.weight");
    if (!a && !b) continue;
    const bool fits = e.shape.size() == 2 && e.shape[a ? 0 : 1] == r;
    if (!fits) {
      std::string shape;
      for (int64_t d : e.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      throw UsageError(file + ": tensor `" + e.name + "` has shape [" + shape +
                       "], not that of a rank-" + std::to_string(r) +
                       " adapter (adapter_config.json's r)");
    }
  }
}

}  // namespace

LoraSpec lora_spec_init_from(const std::string& folder, const LoraSpec& recipe,
                             const std::vector<std::string>& defaulted, const std::string& where) {
  const std::string file = (std::filesystem::path(folder) / "adapter_config.json").string();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(file, ec))
    throw UsageError(where + ": " + folder +
                     " is not a PEFT adapter folder (no readable adapter_config.json)");
  // The same bounded, depth-checked read as every other file beside a model (fuzz: modelfiles).
  const nlohmann::json j = read_peft_adapter_config(file);
  LoraSpec s = lora_spec_from_peft(j, file);
  auto is_default = [&](const char* k) {
    return std::find(defaulted.begin(), defaulted.end(), k) != defaulted.end();
  };
  auto conflict = [&](const std::string& key, const std::string& ours, const std::string& theirs) {
    throw UsageError("[adapter] " + key + " = " + ours + " but " + where + " (" + file + ") has " +
                     theirs + "; remove the key to take the adapter's value, or make them agree");
  };
  auto num = [](double v) {
    std::ostringstream o;
    o << v;
    return o.str();
  };
  auto names = [](const std::vector<int>& slots) {
    std::string out;
    for (int slot : slots)
      for (int i = 0; i < LayerWeights::kNumLinear; ++i)
        if (LayerWeights::kLinear[i] == slot)
          out += (out.empty() ? "" : ", ") + lora_linear_names()[static_cast<size_t>(i)];
    return "[" + out + "]";
  };
  auto saves = [](const LoraSpec& x) {
    std::string out;
    if (x.save_embed) out = "embed_tokens";
    if (x.save_lm_head) out += std::string(out.empty() ? "" : ", ") + "lm_head";
    return "[" + out + "]";
  };
  if (!is_default("r") && recipe.r != s.r)
    conflict("r", std::to_string(recipe.r), "r = " + std::to_string(s.r));
  if (!is_default("alpha") && recipe.alpha != s.alpha)
    conflict("alpha", num(recipe.alpha), "lora_alpha = " + num(s.alpha));
  if (!is_default("use_rslora") && recipe.rslora != s.rslora)
    conflict("use_rslora", recipe.rslora ? "true" : "false",
             std::string("use_rslora = ") + (s.rslora ? "true" : "false"));
  if (!is_default("target_modules") && recipe.targets != s.targets)
    conflict("target_modules", names(recipe.targets), "target_modules = " + names(s.targets));
  if (!is_default("modules_to_save") &&
      (recipe.save_embed != s.save_embed || recipe.save_lm_head != s.save_lm_head))
    conflict("modules_to_save", saves(recipe), "modules_to_save = " + saves(s));
  // Training-time choices are the recipe's: dropout (PEFT saves the one it trained with) and
  // the init, which init_from replaces.
  s.dropout = is_default("dropout") ? s.dropout : recipe.dropout;
  s.init = recipe.init;
  if (!is_default("target_modules")) s.target_names = recipe.target_names;
  s.init_from = folder;
  check_adapter_rank(folder, s.r);
  return s;
}

}  // namespace ciuic::model
