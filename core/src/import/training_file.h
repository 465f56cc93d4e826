// Internal: training files of the tools people leave (`ciuic-run --from-llamafactory train.yaml`,
// `--from-axolotl config.yml`) -> a ciuic recipe. docs/migrate.md is the key-by-key table; this
// file implements it.
//
// The YAML is read by import/yaml.h (depth, alias and tag bounds). The file's values become the
// HF Trainer's arguments (TrainerArgs: both tools train through transformers' Trainer), and the
// recipe is written by the DeepSpeed importer (import/deepspeed.h) from the DeepSpeed config the
// file names (its "auto" values filled from those arguments, as the Trainer fills them; a value
// that differs from its argument refused, as the Trainer refuses it) or, without one, as the
// Trainer trains without DeepSpeed. On top of it the file decides the model (path, chat template),
// the data, the sequence length, the run's length (epochs -> steps, computed from the data),
// the schedule, logging and checkpoints.
//
//  * Datasets (JSON arrays or JSON lines, in alpaca, sharegpt/messages or text form) are converted
//    into ciuic's chat (or text) JSONL under `data_dir`, one file per dataset, and the recipe's
//    [data] names them; a dataset that is not a local file (a hub name) is a placeholder.
//  * A chat template name maps to the model's own template ("hf"), when it is the model family's
//    own format (checked against the model's tokenizer_config.json when the model is a local
//    folder), or to a built-in one ("deepseek"); other names are refused (--set
//    model.chat_template=... imports anyway).
//  * Keys without a ciuic meaning are listed with the reason; what ciuic cannot do (LoRA, other
//    stages than sft/pt, quantized models, other optimizers and schedules, ...) is refused with a
//    UsageError (exit 2) naming each key.
//  * Everything from the file reaches the recipe as TOML literals or escaped one-line comments.
#pragma once

#include <ciuic/export.h>
#include <string>
#include <vector>

#include "import/deepspeed.h"

namespace ciuic::importer {

enum class TrainingTool { kLlamaFactory, kAxolotl };

struct TrainingImport {
  DeepSpeedImport recipe;            // the recipe text and the lists to show
  std::vector<std::string> written;  // the data files written (converted datasets), in order
};

// `path`: the training file; relative paths inside it (datasets, the DeepSpeed config, the model)
// are looked up in the working directory, as the tools do, then next to the file. `overrides`:
// --set (recipe keys; cluster.nproc_per_node / nnodes give the world size, else 1 with a note).
// `data_dir`: where converted datasets go (created; files there of the same names are replaced,
// each written to a temporary file first). Throws UsageError (exit 2) for unreadable or malformed
// files, refused keys and bad values; nothing is written to data_dir before the training file
// and the DeepSpeed config have been read and checked.
CIUIC_API TrainingImport import_training_file(TrainingTool tool, const std::string& path,
                                              const std::vector<std::string>& overrides,
                                              const std::string& data_dir);

}  // namespace ciuic::importer
