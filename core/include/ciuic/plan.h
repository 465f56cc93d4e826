// ciuic/plan.h — how a plugin answers for its own memory in `ciuic-run RECIPE --plan`.
//
// The planner knows the model (parameters, activations, the loss chunk) and nothing of any
// plugin. It asks the recipe's plugins, in this order, through the optional `plan` function of
// their info record (ciuic/plugin.h, PluginPlanFn):
//
//   precision  sets param_bytes and reduce_bytes (what parameters and reduced gradients cost)
//   sharding   sets shard_numel, grad_chunk_elements, grad_bytes and one_chunk_per_step; adds the
//              parameters it keeps and its gradient buffers (buckets in flight, gradients not
//              yet reduced)
//   optimizer  adds its state for shard_numel elements (master weights, moments, gradient shard,
//              staging), on the device or in host memory
//   comm, data may add their own buffers
//
// then adds the model terms, sums per device and per host, and says whether the recipe fits
// [cluster] memory_per_device_gib. A plugin without a plan function is reported as not counted.
// Each answer describes ONE rank at the peak (the start of backward, with the previous step's
// state alive); host items are per rank too (the planner multiplies by the ranks of a node).
//
// Answers must follow the code: count the buffers the plugin really allocates, so that the plan
// stays within 10% of measured peaks (ciuic's own plugins are held to that on GPUs).
// Threading: main thread. Failure: throw ciuic::UsageError through Config::fail() for options the
// planner cannot work with.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ciuic/export.h>

namespace ciuic {

struct PlanItem {
  std::string what;  // e.g. "master weights + AdamW moments"
  bool device =
      true;  // on the run's device (a CPU run's "device" is host memory), else host memory
  double bytes = 0;
  std::string note;  // how it was counted, one short line
  std::string by;    // who answered: "<slot> <plugin>" (filled by the planner)
};

struct PlanContext {
  // ---- set by the planner ---------------------------------------------------------------------
  int world_size = 1;
  int local_world_size = 1;       // ranks per node (host memory is shared by them)
  bool cuda = false;              // [cluster] device = "cuda"
  int64_t num_parameters = 0;     // of the model
  int64_t largest_parameter = 0;  // elements of the largest single parameter tensor
  int64_t micro_batch_size = 1;
  int64_t seq_len = 1;
  int64_t gradient_accumulation_steps = 1;

  // ---- answers of earlier slots (defaults hold when the plugin gives none)
  // ------------------------
  int param_bytes = 4;              // precision: bytes per parameter element
  int reduce_bytes = 4;             // precision: bytes per element of a reduced gradient
  int64_t shard_numel = 0;          // sharding: elements of this rank's optimizer shard
  int64_t grad_chunk_elements = 0;  // sharding: largest chunk handed to Optimizer::accumulate_grad
  int grad_bytes = 4;  // sharding: bytes per element of those chunks (OptimizerSetup::grad_dtype)
  bool one_chunk_per_step = false;  // sharding: OptimizerSetup::one_chunk_per_step
  // sharding (API 8): device bytes this rank holds at most while the model is built and set up,
  // before the first step (a strategy that builds parameters itself: its shard plus the transient
  // whole parameter); 0: the planner's default, the whole model in the parameter dtype (built on
  // each rank before setup). Shown by --plan as "start"; not part of the step's peak.
  double start_bytes = 0;

  // ---- what everyone adds
  // ---------------------------------------------------------------------------
  std::vector<PlanItem> items;
  void add(std::string what, bool device, double bytes, std::string note) {
    items.push_back(PlanItem{std::move(what), device, bytes, std::move(note), {}});
  }
};

}  // namespace ciuic
