// Internal: the memory planner behind `ciuic-run RECIPE --plan` (DESIGN §9).
//
// Estimates, before anything is allocated, the peak bytes per GPU (or per CPU worker) and the
// host memory per rank and per node of a recipe. The planner knows only the model: it asks the
// recipe's plugins for everything else through the `plan` function of their info record
// (ciuic/plan.h) — precision, then sharding, then optimizer, then comm and data — and adds the
// model terms itself: activations kept for backward per decoder layer (with or without
// checkpointing) and the loss chunk. A plugin without a plan function is listed as not counted.
//
// When the recipe does not fit [cluster] memory_per_device_gib it says what would: the other
// installed sharding and optimizer plugins are planned in place of the recipe's (with their
// default options) and those that lower the peak are named with their totals; activation
// checkpointing and a smaller micro-batch are model terms.
//
// Held to peaks measured on H200s: TrainE2E.PlanMatchesPeaksMeasuredOnH200
// (tests/train/train_e2e_test.cpp, within 10%).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <ciuic/export.h>
#include <ciuic/plan.h>

namespace ciuic {
class Config;
class Recipe;
class Registry;
enum class Slot : uint32_t;
struct PluginInfo;
}  // namespace ciuic

namespace ciuic::plan {

// An option that a plugin declares kOptionPlanned (ciuic/plugin.h) and the recipe leaves "auto",
// and what the planner chose for it.
struct PlannedOption {
  Slot slot{};
  std::string plugin;
  std::string key;
  std::string value;     // the choice, e.g. "no_sync" (a kInt option: its decimal text)
  std::string why;       // e.g. "the first of no_sync|reduce_each whose memory plan fits"
  bool integer = false;  // a kInt option
};

struct MemoryPlan {
  int world_size = 1;
  int local_world_size = 1;
  std::string device;           // "cuda" or "cpu"
  std::vector<PlanItem> items;  // everything alive at the peak (start of backward), per rank
  double device_peak = 0;       // sum of the device items
  // The most a rank's device holds while the model is built, before the first step:
  // PlanContext::start_bytes of the sharding, else the whole model in the parameter dtype.
  double start_peak = 0;
  std::string start_note;     // how it was counted
  double host_per_rank = 0;   // sum of the host items
  double host_per_node = 0;   // host_per_rank x ranks on a node
  double host_available = 0;  // this machine's physical memory (0: unknown)
  // What this node's memory must hold: host_per_node, plus on a CPU run each rank's device total
  // (a CPU run's "device" is host memory); host_fits: no more than host_available (or unknown).
  double node_memory = 0;
  bool host_fits = true;
  double cap = 0;    // [cluster] memory_per_device_gib in bytes (0: none)
  bool fits = true;  // device_peak <= cap (or no cap)
  std::vector<PlannedOption>
      planned;  // "auto" options chosen (against the cap; without one, the last choice)
  std::vector<std::string> unknown;  // "<slot> <plugin> (why)": not counted
  std::vector<std::string> advice;   // when it does not fit: what would
  // kOptionPlanned options the recipe sets: a choice the plugin lists before the recipe's (one it
  // prefers) whose plan also fits the cap, e.g. "[sharding] grad_accumulation = \"no_sync\" ...".
  std::vector<std::string> preferred;
};

// Throws UsageError naming the recipe location for a sharding, optimizer or precision plugin that
// is not installed, and for what the recipe leaves undefined (a model folder without config.json).
// Comm and data plugins missing from this build are listed as not counted (a CPU build can plan
// a GPU recipe).
CIUIC_API MemoryPlan plan_memory(const Recipe& recipe, const Registry& registry);

// "12.34 GiB" for sizes of a GiB and more, "12.3 MiB" below (tiny models plan in MiB).
CIUIC_API std::string bytes_text(double bytes);
// This machine's physical memory in bytes (0: unknown).
CIUIC_API double physical_memory();

// What "auto" settings ([model] checkpoint_layers, [train] micro_batch_size, a plugin's planned
// options) may fill of `whole_bytes` (the cap, or without one the device's memory): all of it but
// a headroom for what the plan does not count (the CUDA context, library workspaces, the caching
// allocator's fragmentation). The plan is within ~2% of measured peaks at the 7B shapes
// (TrainE2E.PlanMatchesPeaksMeasuredOnH200). The headroom is 8% of `whole_bytes`, capped at
// max(kAutoHeadroomBytes, 3% of it): what does not scale with the device (the context,
// workspaces) needs about the same on an 80 GB card as on a 24 GB one, and on an H200 8% left
// 11 GiB unused (docs/performance.md, "Model families"). So: a 24 GiB cap 22.08 GiB (1.92 GiB
// headroom), a 40 GB A100 (39.4 GiB) 37.4 GiB (2 GiB), an 80 GB H100 (79.1 GiB) 76.7 GiB (3%),
// an H200 (139.8 GiB) 135.6 GiB (3%).
inline constexpr double kAutoMemoryFraction = 0.92;  // below ~25 GiB
inline constexpr double kAutoHeadroomBytes = 2.0 * 1073741824.0;
inline constexpr double kAutoHeadroomLargeFraction = 0.03;
// The bytes "auto" may fill of `whole_bytes` (0 or less: 0). `dedicated` = false for a CPU
// worker's share of host memory, which the rest of the machine shares: always 8% headroom.
CIUIC_API double auto_budget_bytes(double whole_bytes, bool dedicated = true);
// How the log lines and --plan name that budget: "N% of " (N = the budget's share, floored), to
// which the caller appends what `whole_bytes` is ("the cap", "the device's 139.80 GiB").
CIUIC_API std::string auto_budget_share(double whole_bytes, bool dedicated = true);
// The fewest decoder layers to checkpoint whose plan fits `budget_bytes` per device: 0 when the
// activations of every layer fit, up to the layer count; -1 when nothing fits. The recipe's
// activation_checkpointing / checkpoint_layers are ignored; `micro_batch` > 0 replaces the recipe's
// (the global batch kept). Throws as plan_memory().
CIUIC_API int64_t fewest_checkpointed_layers(const Recipe& recipe, const Registry& registry,
                                             double budget_bytes, int64_t micro_batch = 0);
// [train] micro_batch_size = "auto": the largest micro-batch that divides the rows per rank
// (global_batch_size / ranks) and whose plan fits `budget_bytes` (checkpoint_layers = "auto"
// counted as every layer checkpointed); 0 when not even 1 fits. Throws as plan_memory().
CIUIC_API int64_t largest_micro_batch(const Recipe& recipe, const Registry& registry,
                                      double budget_bytes);
// Every kOptionPlanned option of the recipe's plugins that is "auto": the first of its later
// choices whose plan fits `budget_bytes` per device, with the model's leanest settings
// (micro_batch_size = "auto" counted as 1, checkpoint_layers = "auto" as every layer), options of
// earlier slots (precision, sharding, optimizer, comm, data) and keys chosen first; the last choice
// when none fits or `budget_bytes` <= 0. The same recipe and budget always give the same choices,
// so every rank chooses alike; fewest_checkpointed_layers() and largest_micro_batch() plan with the
// choices made for their budget. Throws as plan_memory().
CIUIC_API std::vector<PlannedOption> planned_options(const Recipe& recipe, const Registry& registry,
                                                     double budget_bytes);
// `[sharding] grad_accumulation = "auto": "no_sync", the first of ... whose memory plan fits`.
CIUIC_API std::string planned_text(const PlannedOption& option);
// Whether `options` (a section of plugin `info`) leaves a kOptionPlanned option "auto".
CIUIC_API bool has_planned_auto(const Config& options, const PluginInfo& info);
// `options` (the recipe's section for `slot`) with the values chosen in place of "auto".
CIUIC_API Config with_planned(const Config& options, Slot slot,
                              const std::vector<PlannedOption>& chosen);
CIUIC_API std::string plan_text(const MemoryPlan& plan);

}  // namespace ciuic::plan
