// Internal: DeepSpeed config import (`ciuic-run --from-deepspeed ds_config.json`).
//
// import/ holds the translators of other tools' configs into recipe text. Unlike recipe/, it may
// name plugins: translating DeepSpeed's fp16/bf16 sections, ZeRO stages and offload into the
// plugins that implement them is its job (tests/arch lists the folders that may).
//
// Translates a DeepSpeed JSON config into an equivalent ciuic recipe (TOML text): batch shape,
// clipping, precision (fp16 with its loss-scaler knobs, bf16, communication_data_type), ZeRO
// stage 0/1/2 with its buckets and optimizer offload, Adam/AdamW and the WarmupLR / WarmupDecayLR /
// WarmupCosineLR schedules. docs/deepspeed.md is the key-by-key table; this file implements it.
//
//  * "auto" values take what the HF Trainer fills them with (transformers'
//    integrations/deepspeed.py: trainer_config_process / trainer_config_finalize) from
//    `TrainerArgs` (TrainingArguments' defaults, or a training file's values), or ciuic's own
//    answer where it has a better one (micro-batch "auto": the planner for the global batch; fp16 /
//    bf16 "auto" with default arguments: bf16). Each such value's recipe line says so:
//    `# "auto" -> 1.0: HF TrainingArguments max_grad_norm default`. --set still wins. An "auto"
//    without an HF value (fp16.loss_scale = "auto", ...) is named in one UsageError with its --set.
//  * Booleans and numbers are read as DeepSpeed's pydantic config reads them: "true", "off", 1, 0
//    for booleans; "1e-5", "2e8" for numbers.
//  * Keys that mean nothing to ciuic (wall_clock_breakdown, contiguous_gradients, ...) are
//    listed with the reason, as comments in the recipe and in `ignored`.
//  * What ciuic cannot do (ZeRO-3, NVMe offload, pipeline/tensor parallelism, other optimizers,
//    OneCycle, ...) is refused with a UsageError (exit 2) naming the key.
//  * ZeRO stage 1 becomes ciuic's zero2 (gradients sharded too: same updates, less memory), with
//    a note; stage 0 becomes ddp.
//  * The recipe uses the [optimizer] slot: the device AdamW, or the host one when the config sets
//    offload_optimizer (the plugin names are in deepspeed.cpp's mapping).
//  * A DeepSpeed config names no model, data or run length: [model], [data] and [train]
//    max_steps come from --set, else loadable placeholders are written and listed in
//    `placeholders` (train.max_steps from the scheduler's total_num_steps when it has one).
//
// --set values (section.key=value, TOML or a bare word) override or add recipe keys; they win over
// the imported values. The world size for train_batch_size comes from cluster.nproc_per_node x
// cluster.nnodes when --set (or --nproc/--nnodes) gives them, else it is the recipe's [cluster]
// default (1), with a note saying so.
#pragma once

#include <ciuic/export.h>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ciuic::importer {

// Every string here is safe to show: the lists' entries are one line each, with the config's
// control bytes and invalid UTF-8 written \xNN (sdk/printable.h).
struct DeepSpeedImport {
  std::string toml;                       // the recipe, with comments: data only (see below)
  std::vector<std::string> ignored;       // "key: reason", in config order
  std::vector<std::string> notes;         // translations worth knowing (stage 1 -> zero2, ...)
  std::vector<std::string> placeholders;  // recipe keys written as placeholders
};

// `json_text` is the config's content, `origin` its name in messages; both are untrusted (a
// downloaded config, a file name). The recipe holds only the tables and keys the translation
// writes: the config's keys and values reach it as one-line comments (toml_comment) or TOML
// literals (toml_quote), never as syntax. Time and memory are linear in the config's size.
// Throws UsageError for malformed JSON, nesting deeper than kMaxJsonDepth (ciuic/json.h), wrong
// types, "auto" values the HF Trainer does not fill (without --set), unsupported features and
// inconsistent batch sizes.
// Thread-safe (no shared state).
CIUIC_API DeepSpeedImport import_deepspeed(const std::string& json_text, const std::string& origin,
                                           const std::vector<std::string>& overrides);

// One TrainingArguments value, and where it came from: `source` is shown in the recipe's comment
// ("HF TrainingArguments max_grad_norm default", or "train.yaml: max_grad_norm").
struct TrainerValue {
  double value = 0;
  bool given = false;  // from a training file, not TrainingArguments' default
  std::string source;
};

// What the HF Trainer fills DeepSpeed's "auto" values from (its TrainingArguments). defaults() is
// TrainingArguments() as transformers defines it; a training-file importer (import/training_file.h)
// sets the values the file gives, with their sources.
struct CIUIC_API TrainerArgs {
  TrainerValue per_device_train_batch_size, gradient_accumulation_steps, max_grad_norm,
      learning_rate, adam_beta1, adam_beta2, adam_epsilon, weight_decay, warmup_steps, warmup_ratio,
      fp16, bf16;
  // The optimizer steps of the whole run (the Trainer's num_training_steps), when known.
  std::optional<int64_t> num_training_steps;
  std::string num_training_steps_source;
  // True when the values are a training file's: the HF Trainer then refuses a DeepSpeed value that
  // is not "auto" and differs from its argument (the "mismatch" check), and so does the import.
  bool from_file = false;
  static TrainerArgs defaults();
};

// A recipe value an importer of a training file decided, with the comment that says where from.
struct RecipeValue {
  std::string key;      // "section.key" (the section may be dotted: "model.config.x")
  std::string literal;  // a TOML literal (toml_quote, a number, true/false, an array)
  std::string comment;  // one line; made printable when written
};

// How a training file's import drives the DeepSpeed import: the Trainer's arguments, the recipe
// values the file decides (they win over the DeepSpeed config's, and --set wins over them), and
// what it found to list (its own ignored keys, notes, placeholders, refusals — put first). `tool`
// names the command in the recipe's header ("--from-llamafactory train.yaml").
struct ImportOptions {
  TrainerArgs trainer = TrainerArgs::defaults();
  std::vector<RecipeValue> given;
  std::vector<std::string> ignored, notes, placeholders, refused;
  // Values that apply only when the DeepSpeed config has none of the top-level keys `unless`: the
  // Trainer builds the optimizer, the schedule, the batch and the mixed precision itself when the
  // config leaves them out (with no config, every group applies).
  struct Conditional {
    std::vector<std::string> unless;
    std::vector<RecipeValue> values;
  };
  std::vector<Conditional> given_unless;
  std::string tool;
  std::string deepspeed_origin;  // the DeepSpeed config's name, or "" when the file names none
};

// As above, with `options`. With options.deepspeed_origin empty, `json_text` is "{}" and the
// DeepSpeed defaults the recipe would get are replaced by the Trainer's own behaviour where the
// caller gives values. Same failures, plus the mismatches of options.trainer.from_file and the
// caller's refusals (all listed in one UsageError).
CIUIC_API DeepSpeedImport import_deepspeed(const std::string& json_text, const std::string& origin,
                                           const std::vector<std::string>& overrides,
                                           const ImportOptions& options);

}  // namespace ciuic::importer
