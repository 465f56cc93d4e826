// Internal: the memory planner behind `ciuic-run RECIPE --plan` (DESIGN §9).
//
// Estimates, before anything is allocated, the peak bytes per GPU (or per CPU worker) and per host
// process of a recipe: parameters, gradients (shard, reductions in flight, gradients not yet
// reduced), optimizer state, activations (with or without checkpointing) and the loss chunk —
// from the model config, the world size and the chosen sharding / offload / precision plugins.
// The model states follow the code exactly (BucketSharding's layout and buffers); activations are
// counted per decoder layer from the tensors autograd keeps. Checked against peaks measured on
// H200s (TrainE2E.PlanMatchesPeaksMeasuredOnH200 in tests/train/train_e2e_test.cpp, within 10%).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ciuic/export.h>

namespace ciuic {
class Recipe;
class Registry;
}  // namespace ciuic

namespace ciuic::train {

struct MemoryItem {
  std::string what;
  bool device = true;  // false: host memory
  double bytes = 0;
  std::string note;
};

struct MemoryPlan {
  int world_size = 1;
  std::string device;            // "cuda" or "cpu"
  std::vector<MemoryItem> items; // everything alive at the peak (start of backward)
  double device_peak = 0;        // sum of the device items
  double host_total = 0;         // sum of the host items (per rank)
  double cap = 0;                // [cluster] memory_per_device_gib in bytes (0: none)
  bool fits = true;              // device_peak <= cap (or no cap)
  std::vector<std::string> unknown;  // plugins whose memory the planner does not know
  std::vector<std::string> advice;   // when it does not fit: what would
};

// Throws UsageError for what the recipe leaves undefined (e.g. a model folder without config.json).
CIUIC_API MemoryPlan plan_memory(const Recipe& recipe, const Registry& registry);
CIUIC_API std::string plan_text(const MemoryPlan& plan);

}  // namespace ciuic::train
