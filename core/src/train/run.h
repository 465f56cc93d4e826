// Internal: everything one worker trains with — built once from the recipe, then read by the loop.
//
// build_run() makes, in this order: the run context (rank, device, store, memory cap), the claim
// on the run directory when this worker must take it (checkpoint/run_dir.h), the
// learning-rate schedule (a recipe error must not wait for tens of GiB of optimizer state), the
// plugins (comm first: the others may talk through it; then precision, optimizer, sharding,
// data), the tokenizer and chat template, the model (from an HF folder or random), and finally
// sets up the sharding (which lays out the flat buffers and the optimizer's shard) and opens the
// data source.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>

#include <ciuic/comm.h>
#include <ciuic/context.h>
#include <ciuic/data.h>
#include <ciuic/optimizer.h>
#include <ciuic/precision.h>
#include <ciuic/sharding.h>
#include <ciuic/tokenizer.h>

#include "launch/launch.h"
#include "model/llama.h"
#include "schedule/schedule.h"
#include "train/device_info.h"
#include "train/options.h"
#include "train/step.h"

namespace ciuic {
class Recipe;
class Registry;
}  // namespace ciuic

namespace ciuic::train {

struct WorkerOptions;

struct Run {
  checkpoint::RunDirClaim run_dir;  // first: its lock is released after everything else
  TrainOptions opt;
  RunContext ctx;
  DeviceInfo device;
  std::shared_ptr<Comm> comm;
  std::shared_ptr<Precision> precision;
  std::shared_ptr<Optimizer> optimizer;
  std::shared_ptr<Sharding> sharding;
  std::shared_ptr<DataSource> data;
  std::shared_ptr<const Tokenizer> tokenizer;   // null without [model] tokenizer / path
  std::unique_ptr<ChatTemplate> chat_template;  // with the tokenizer
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<schedule::LrSchedule> schedule;

  // The plugins as PluginObjects, for metrics (comm, precision, optimizer, sharding, data).
  std::vector<const PluginObject*> plugins() const;
  // The slots the optimizer step drives (train/step.h).
  StepSlots slots() const { return {comm.get(), precision.get(), optimizer.get(), sharding.get()}; }
};

Run build_run(const Recipe& recipe, const Registry& registry, const launch::WorkerEnv& env,
              const WorkerOptions& options);

// The composition rule of plugin API 9 (ciuic/sharding.h, shards_parameters()): a sharding that
// shards the parameters themselves (zero3) needs an optimizer and a precision policy that accept
// sharded parameters. Asks the sharding once and, when it says true, the two others; throws one
// UsageError (exit 2) naming every plugin that refuses, its recipe key with its location, the
// sharding's, and the fix. build_run() and --dry-run call it right after creating the plugins.
void check_sharded_parameters(const Recipe& recipe, const Registry& registry,
                              const Sharding& sharding, const Optimizer& optimizer,
                              const Precision& precision);

// One micro-batch on the run's device.
struct DeviceBatch {
  at::Tensor input_ids, labels, position_ids;
  bool packed = false;
  // Document boundaries of packed rows (lets the model run varlen flash attention on GPU instead
  // of a dense block-diagonal mask); built from the CPU position_ids, no host sync.
  std::optional<model::PackedDocs> docs;
  const model::PackedDocs* docs_ptr() const { return docs ? &*docs : nullptr; }
};
DeviceBatch to_device(const Batch& b, c10::Device device, int64_t micro_batch);
// sum(token losses) of one micro-batch, as a 0-d fp32 tensor on the device (autograd graph kept).
at::Tensor loss_sum(Run& r, const DeviceBatch& d);

// Sums `values` over ranks (fp64 on the comm's device) and returns them on the host.
std::vector<double> all_sum(Comm& comm, const std::vector<double>& values);

}  // namespace ciuic::train
