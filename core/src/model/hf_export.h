// model/hf_export.h — writing a Hugging Face model folder that transformers loads.
//
// write_hf_folder() produces
//   config.json, generation_config.json,
//   model.safetensors  or  model-0000i-of-0000N.safetensors + model.safetensors.index.json,
//   and copies of the extra files (tokenizer.json, tokenizer_config.json, ...)
// atomically: everything is written into a temporary sibling folder which then replaces `folder`
// in one rename (an existing folder is swapped out with renameat2(RENAME_EXCHANGE) and removed),
// so readers see the old folder or the complete new one, never a mix. On failure the temporary
// folder is removed and `folder` is untouched.
//
// Failure: ciuic::Error naming the folder and the tensor or file at fault (a tensor whose name or
// shape does not belong to `config`'s architecture, a missing extra file, I/O errors).
#pragma once

#include <optional>
#include <string_view>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "model/config.h"
#include "model/safetensors.h"

#include <ciuic/export.h>

namespace ciuic::model {

// The dtype names an export accepts ([checkpoint] export_dtype, --export-dtype): the one table
// of dtype names in the engine (tests/arch holds it to that). nullopt for other names.
CIUIC_API std::optional<at::ScalarType> export_dtype_from_name(std::string_view name);
// "bf16|fp32": for messages.
CIUIC_API std::string export_dtype_names();

struct HfExportOptions {
  // Floating-point tensors are written in this dtype: kBFloat16 (the usual release format) or
  // kFloat.
  at::ScalarType dtype = at::kBFloat16;
  // Shard size limit (transformers' default max_shard_size is 5 GB).
  uint64_t max_shard_bytes = 5'000'000'000ull;
  // Files copied into the folder under their own names (e.g. the source model's tokenizer.json).
  std::vector<std::string> extra_files;
};

// The files of a tokenizer that travel with a model: `tokenizer_json` and, in its folder,
// tokenizer_config.json (special tokens, chat template) and chat_template.jinja when they exist.
// "" gives none. Used for the run's export, the checkpoints and `ciuic-run --export-hf`.
CIUIC_API std::vector<std::string> tokenizer_files(const std::string& tokenizer_json);

// `tensors`: every parameter of `config`'s model under its HF name (LlamaModel::named_parameters()
// names; order kept in the files), any device and floating dtype — e.g. fp32 master weights.
// A tied config must not carry lm_head.weight; an untied one must.
CIUIC_API void write_hf_folder(const std::string& folder, const LlamaConfig& config,
                               const NamedTensors& tensors, const HfExportOptions& options = {});

}  // namespace ciuic::model
