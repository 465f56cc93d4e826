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
//  * "auto" values (the HF Trainer fills them from TrainingArguments) must be given as recipe
//    keys with --set (e.g. optimizer.params.lr = "auto" needs --set optimizer.lr=3e-5); every
//    missing one is named in one UsageError.
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
// cluster.nnodes when --set (or --nproc/--nnodes) gives them.
#pragma once

#include <ciuic/export.h>
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
// types, "auto" values without --set, unsupported features and inconsistent batch sizes.
// Thread-safe (no shared state).
CIUIC_API DeepSpeedImport import_deepspeed(const std::string& json_text, const std::string& origin,
                                 const std::vector<std::string>& overrides);

}  // namespace ciuic::importer
