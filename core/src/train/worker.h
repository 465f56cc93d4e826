// Internal: the body of one worker process (core/src/train).
#pragma once

#include "launch/launch.h"
#include "model/config.h"

namespace ciuic {
class Recipe;
class Registry;
}  // namespace ciuic

namespace ciuic::train {

struct WorkerOptions {
  // --resume: "" (fresh start), "latest" (the newest checkpoint; an error when there is none),
  // "auto" (the newest checkpoint, or a fresh start when there is none), or a checkpoint folder.
  std::string resume;
};

// The recipe's model architecture: [model] path's config.json with [model.config] on top, or
// [model.config] alone (random initialisation).
CIUIC_API model::LlamaConfig recipe_model_config(const Recipe& recipe);

// Checks across keys that need no plugin, device or data (the learning-rate schedule against
// train.max_steps), so that the launcher refuses such a recipe before starting any worker.
// Throws ConfigError naming the key.
CIUIC_API void check_recipe(const Recipe& recipe);

// Builds the run context for `env`, creates the recipe's plugins, trains, checkpoints and exports
// as the recipe says. Returns the process exit code; throws ciuic::Error on failure.
int run_worker(const Recipe& recipe, const Registry& registry, const launch::WorkerEnv& env,
               const WorkerOptions& options);

}  // namespace ciuic::train
