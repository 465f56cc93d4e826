// Internal: the body of one worker process (core/src/train).
#pragma once

#include "launch/launch.h"
#include "model/config.h"
#include "plan/recipe_inputs.h"

namespace ciuic {
class Recipe;
class Registry;
class DataSource;
struct DataOpenArgs;
}  // namespace ciuic

namespace ciuic::train {

struct WorkerOptions {
  // --resume: "" (fresh start), "latest" (the newest checkpoint; an error when there is none),
  // "auto" (the newest checkpoint, or a fresh start when there is none), or a checkpoint folder.
  std::string resume;
  // Claim the run directory in this worker (checkpoint/run_dir.h: rank 0 checks and locks it, the
  // other ranks wait for its verdict). Set for workers of other launchers (torchrun, srun,
  // mpirun); under ciuic-run's own launcher and in a single process, ciuic-run claimed it before
  // starting the run.
  bool claim_run_dir = false;
  // --overwrite: move another run's files out of the way instead of refusing to start.
  bool overwrite = false;
};

// The recipe's model architecture (plan/recipe_inputs.h: the planner reads it too).
using plan::recipe_model_config;

// Checks across keys that need no plugin, device or data (the learning-rate schedule against
// train.max_steps), so that the launcher refuses such a recipe before starting any worker.
// Throws ConfigError naming the key.
CIUIC_API void check_recipe(const Recipe& recipe);

// Opens `data` (the recipe's data plugin) with `args`. Whatever the plugin throws names the plugin
// and its file, as the factory's errors do, with its exit code kept. The run and --dry-run's
// preflight open data this way. An error about a missing file gets the recipe's [run] setup (how
// its inputs are made) as a hint.
CIUIC_API void open_data_plugin(const Recipe& recipe, const Registry& registry, DataSource& data,
                                const DataOpenArgs& args);

// Builds the run context for `env`, creates the recipe's plugins, trains, checkpoints and exports
// as the recipe says. Returns the process exit code; throws ciuic::Error on failure.
int run_worker(const Recipe& recipe, const Registry& registry, const launch::WorkerEnv& env,
               const WorkerOptions& options);

}  // namespace ciuic::train
