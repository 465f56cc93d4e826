// What the planner and the trainer read from a recipe first (plan/recipe_inputs.h).
#include "plan/recipe_inputs.h"

#include <filesystem>

#include <nlohmann/json.hpp>

#include <ciuic/config.h>
#include <ciuic/error.h>

#include "recipe/recipe.h"

namespace fs = std::filesystem;

namespace ciuic::plan {
namespace {

// [model] -> LlamaConfig: the folder's config.json with [model.config] on top, or
// [model.config] alone for a randomly initialised model.
model::LlamaConfig model_config(const Recipe& recipe, const std::string& model_path) {
  const Config mc = recipe.section("model.config");
  nlohmann::json overrides = nlohmann::json::object();
  for (const std::string& k : mc.keys()) {
    if (k == "tie_word_embeddings" || k == "use_sliding_window")
      overrides[k] = mc.get_bool(k);
    else if (k == "rope_theta" || k == "rms_norm_eps" || k == "rope_scaling_factor" ||
             k == "query_pre_attn_scalar" || k == "rope_local_base_freq")
      overrides[k] = mc.get_float(k);
    else if (k == "rope_scaling_type" || k == "model_type")
      overrides[k] = mc.get_string(k);
    else
      overrides[k] = mc.get_int(k);
  }
  const std::string origin =
      recipe.path().empty() ? "[model.config]" : recipe.path() + " [model.config]";
  if (!model_path.empty())
    return model::LlamaConfig::from_file((fs::path(model_path) / "config.json").string())
        .with_overrides(overrides, origin);
  return model::LlamaConfig{}.with_overrides(overrides, origin);
}

}  // namespace

std::string resolve_input(const std::string& p, const std::string& base) {
  if (p.empty()) return p;
  fs::path path(p);
  return path.is_absolute() ? p : (fs::path(base) / path).lexically_normal().string();
}

model::LlamaConfig recipe_model_config(const Recipe& recipe) {
  return model_config(recipe,
                      resolve_input(recipe.section("model").get_string("path"), recipe.dir()));
}

RecipeBatch recipe_batch(const Recipe& recipe) {
  const Config t = recipe.section("train");
  const Config cluster = recipe.section("cluster");
  RecipeBatch b;
  b.world = cluster.get_int("nproc_per_node") * cluster.get_int("nnodes");
  b.global = t.get_int("global_batch_size");
  b.micro_auto = is_auto(t, "micro_batch_size");
  const std::string ranks = std::to_string(b.world) + " rank" + (b.world == 1 ? "" : "s");
  if (b.micro_auto) {
    if (b.global <= 0)
      throw UsageError(
          t.location("micro_batch_size") +
          ": [train] micro_batch_size = \"auto\" needs [train] "
          "global_batch_size (sequences per optimizer step over all ranks), which the micro-batch "
          "chosen then splits into micro-batch x accumulation");
    if (b.global % b.world != 0)
      throw UsageError(t.location("global_batch_size") + ": [train] global_batch_size = " +
                       std::to_string(b.global) + " is not a multiple of the " + ranks +
                       " ([cluster] nproc_per_node x nnodes)");
    b.micro = 1;
    b.accumulation = b.global / b.world;
    return b;
  }
  b.micro = t.get_int("micro_batch_size");
  b.accumulation = t.get_int("gradient_accumulation_steps");
  const int64_t product = b.micro * b.accumulation * b.world;
  if (b.global > 0 && b.global != product)
    throw UsageError(
        t.location("global_batch_size") +
        ": [train] global_batch_size = " + std::to_string(b.global) +
        " but micro_batch_size x gradient_accumulation_steps x ranks = " + std::to_string(b.micro) +
        " x " + std::to_string(b.accumulation) + " x " + std::to_string(b.world) + " = " +
        std::to_string(product) + "; set one of them to agree, or micro_batch_size = \"auto\"");
  b.global = product;
  return b;
}

// [adapter]: the LoRA spec, or nullopt for type = "none". Bad values are usage errors naming the
// key.
std::optional<model::LoraSpec> recipe_adapter(const Recipe& recipe) {
  const Config a = recipe.section("adapter");
  const std::string q = a.get_string("base_quantization");
  if (!q.empty() && q != "nf4")
    throw UsageError(a.location("base_quantization") + ": [adapter] base_quantization = \"" + q +
                     "\" is not a quantization: expected \"\" (none) or \"nf4\" (QLoRA)");
  if (a.get_string("type") == "none") {
    if (!q.empty())
      throw UsageError(a.location("base_quantization") +
                       ": [adapter] base_quantization = \"nf4\" needs an adapter ([adapter] type "
                       "= \"lora\", QLoRA): a full fine-tune trains every weight and cannot keep "
                       "them in 4 bits");
    return std::nullopt;
  }
  model::LoraSpec s;
  s.r = a.get_int("r");
  s.alpha = a.get_float("alpha");
  s.dropout = a.get_float("dropout");
  s.rslora = a.get_bool("use_rslora");
  s.init =
      a.get_string("init") == "gaussian" ? model::LoraInit::kGaussian : model::LoraInit::kDefault;
  s.target_names = a.get_string_list("target_modules");
  s.targets = model::lora_target_slots(s.target_names, "[adapter] target_modules");
  s.base_quantization = q;
  for (const std::string& m : a.get_string_list("modules_to_save")) {
    if (m == "embed_tokens")
      s.save_embed = true;
    else if (m == "lm_head")
      s.save_lm_head = true;
    else
      throw UsageError("[adapter] modules_to_save: \"" + m +
                       "\" is not a module ciuic can train fully beside "
                       "an adapter: expected embed_tokens or lm_head");
  }
  if (const std::string from = a.get_string("init_from"); !from.empty()) {
    std::vector<std::string> defaulted;
    for (const char* k :
         {"r", "alpha", "dropout", "use_rslora", "target_modules", "modules_to_save"})
      if (a.location(k) == "<default>") defaulted.emplace_back(k);
    s = model::lora_spec_init_from(resolve_input(from, recipe.dir()), s, defaulted,
                                   a.location("init_from") + ": [adapter] init_from");
  }
  return s;
}

}  // namespace ciuic::plan
