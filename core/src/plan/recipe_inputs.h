// Internal: what both the memory planner and the trainer read from a recipe before anything runs —
// the model's architecture, the batch, input paths. Here, below both, so that plan/ does not
// depend on train/ (train/ builds on plan/: tests/arch, Architecture.PlanDoesNotIncludeTrain).
#pragma once

#include <cstdint>
#include <string>

#include <ciuic/export.h>

#include <optional>

#include "model/config.h"
#include "model/lora.h"

namespace ciuic {
class Recipe;
}

namespace ciuic::plan {

// `p` relative to `base` (a recipe's folder), unless absolute or empty.
CIUIC_API std::string resolve_input(const std::string& p, const std::string& base);

// The recipe's model architecture: [model] path's config.json with [model.config] on top, or
// [model.config] alone (random initialisation).
CIUIC_API model::LlamaConfig recipe_model_config(const Recipe& recipe);

// The recipe's batch: micro-batch, accumulation and global batch (rows per optimizer step over all
// ranks). With [train] micro_batch_size = "auto" the micro-batch is 1 and the accumulation the rows
// per rank until a worker chooses (train/run.cpp; the product, what a step trains on, is fixed).
// Throws UsageError naming the keys: "auto" without global_batch_size, a global batch the ranks do
// not divide, or one that disagrees with micro x accumulation x ranks.
struct RecipeBatch {
  int64_t micro = 1, accumulation = 1, global = 0, world = 1;
  bool micro_auto = false;
};
CIUIC_API RecipeBatch recipe_batch(const Recipe& recipe);

// [adapter]: the LoRA spec, or nullopt for type = "none". Bad values (targets matching no linear
// module, unknown modules_to_save, base_quantization other than "" or "nf4", "nf4" without an
// adapter) are UsageErrors naming the key.
CIUIC_API std::optional<model::LoraSpec> recipe_adapter(const Recipe& recipe);

}  // namespace ciuic::plan
