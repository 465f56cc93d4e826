// Internal: the recipe's core sections as the trainer uses them — typed, read once.
//
// Everything the training loop and its helpers (run.h, report.h, evaluate.h, checkpoints.h)
// read from [train], [optimizer], [model], [checkpoint], [log] and [run] is here, so that no
// string-keyed recipe read happens inside the loop. Defaults live in the recipe schema
// (core/src/recipe/schema.cpp), one per key; this struct has none of its own.
#pragma once

#include <cstdint>
#include <string>

#include <ciuic/export.h>

#include <optional>

#include "checkpoint/run_dir.h"
#include "model/lora.h"
#include "plan/recipe_inputs.h"

namespace ciuic {
class Recipe;
}

namespace ciuic::train {

// The recipe's batch and input paths, as the planner reads them too (plan/recipe_inputs.h).
using plan::recipe_batch;
using plan::RecipeBatch;
using plan::resolve_input;

struct TrainOptions {
  // [train]
  int64_t micro_batch = 0;
  int64_t accumulation = 0;  // gradient_accumulation_steps
  bool micro_batch_auto =
      false;  // "auto": chosen by each worker from the memory plan (train/run.cpp)
  int64_t seq_len = 0;
  int64_t max_steps = 0;
  double clip = 0.0;  // gradient_clipping; 0 = off
  int64_t eval_every = 0;
  int64_t eval_batches = 0;  // 0 = the whole held-out split
  bool nonfinite_skip = false;
  int64_t max_nonfinite_skips = 0;
  std::string exact_match_file;  // resolved against the recipe's folder; "" = off
  int64_t exact_match_limit = 0;
  int64_t exact_match_max_new_tokens = 0;
  int64_t exact_match_every = 0;   // exact_match_every_steps; 0 = before and after only
  int64_t exact_match_batch = 16;  // exact_match_batch_size: questions per batched generate()
  // [train] eval_metrics, each a flag ("exact_match" is always on: it costs nothing more);
  // bleu_tokenize: "13a" | "zh" | "none" (score/bleu.h)
  bool eval_bleu = true, eval_rouge_l = true, eval_response_time = true;
  std::string bleu_tokenize = "13a";
  bool rouge_use_stemmer = false;  // rouge-score's use_stemmer (score/porter.h)

  // [optimizer] (the core's keys; the plugin's own options are read by the plugin)
  double lr = 0.0;
  double weight_decay = 0.0;

  // [model]
  std::string model_path;      // resolved; "" = random initialisation from [model.config]
  std::string tokenizer_path;  // resolved; "" = <model_path>/tokenizer.json when it exists
  std::string chat_template;
  bool activation_checkpointing = false;
  int64_t checkpoint_layers = 0;        // 0 = all
  bool checkpoint_layers_auto = false;  // "auto": the fewest the memory plan fits (train/run.cpp)
  double init_std = 0.0;
  // [adapter] type = "lora": the adapter (model/lora.h); nullopt: every parameter trains.
  std::optional<model::LoraSpec> lora;
  std::string fused_kernels;  // "auto" | "on" | "off"
  std::string loss_backward;  // "in_forward" | "recompute"

  // [checkpoint]
  std::string checkpoint_dir;  // resolved: "" in the recipe = <output_dir>/checkpoints
  int64_t checkpoint_every = 0;
  int64_t keep_last = 0;
  bool export_hf = false;
  std::string export_dtype;  // a name model::export_dtype_from_name() knows (schema choices)
  bool save_on_signal = false;
  bool save_final = false;
  std::string hf_dir;  // <output_dir>/hf, where export_hf writes

  // [log]
  int64_t log_every = 1;
  std::string metrics_path;   // resolved against output_dir
  std::string progress;       // "auto" | "on" | "off"
  double peak_tflops = 0.0;   // 0 = from the GPU name table
  bool tensorboard = false;   // also TensorBoard event files in <output_dir>/tb
  int64_t profile_start = 0;  // [log] profile_start_step; 0 = off
  int64_t profile_steps = 0;
  bool rank_records = false;      // per-rank records in metrics.jsonl (docs/metrics.md)
  double straggler_margin = 0.0;  // 0 = no straggler detection
  int64_t straggler_log_steps = 0;

  // [run], [cluster]
  std::string output_dir;
  std::string run_name;         // [run] name
  uint64_t seed = 0;            // [run] seed
  std::string setup;            // [run] setup: how the recipe's inputs are made ("" = not said)
  bool cuda = false;            // [cluster] device
  double memory_cap_gib = 0.0;  // [cluster] memory_per_device_gib; 0 = none
  double timeout_s = 0.0;       // [cluster] timeout_s: rendezvous and collectives

  // Global batch in tokens: micro_batch x seq_len x accumulation x world.
  int64_t tokens_per_step(int world_size) const {
    return micro_batch * seq_len * accumulation * world_size;
  }

  // The folders and files this run writes, for the start-of-run claim (checkpoint/run_dir.h).
  checkpoint::RunPaths run_paths() const;

  static TrainOptions from(const Recipe& recipe);
};

}  // namespace ciuic::train
