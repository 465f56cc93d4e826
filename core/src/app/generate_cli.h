// Internal: `ciuic-run --generate` and `ciuic-run --chat` (apps/ciuic-run/main.cpp parses, these
// run). Both load an HF folder (config.json, safetensors, tokenizer.json; a run's output folder
// is taken through its hf/ export) and generate with model/generate.h.
//
//   --generate DIR (--prompt TEXT... | --prompts FILE.jsonl) [--out OUT.jsonl]
//       FILE.jsonl: one object per line, {"prompt": "raw text"} (encoded with the tokenizer's
//       special tokens, as transformers' tokenizer(text)) or {"messages": [{"role", "content"}...]}
//       (the chat template's generation prompt), either with "stop_strings" (a string or a list:
//       that prompt's stop strings instead of the flags'). Batches of --batch prompts; one JSON
//       line per prompt on OUT (stdout by default): {"index", "text", "ids", "prompt_tokens",
//       "new_tokens", "stopped" ("eos" | "stop_string" | "length"), "first_token_s", "seconds",
//       "tokens_per_s"}; a progress line on stderr.
//   --chat DIR: reads a user turn per line from `in`, renders the conversation with the model's
//       chat template, streams the reply as it is decoded; /reset forgets the conversation,
//       /system TEXT sets the system message, /exit or end of input ends. Ctrl-C (SIGINT) during
//       a reply stops that reply only.
// Sampling and stop strings: generation_config.json's settings, then the flags. Failures:
// UsageError (exit 2) for a missing folder, tokenizer, chat template, a bad prompts file
// (file:line) or sampling value.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include <ciuic/export.h>

namespace ciuic::app {

struct GenerateCliOptions {
  std::string folder;
  std::vector<std::string> prompts;  // --prompt, repeatable
  std::string prompts_file;          // --prompts FILE.jsonl
  std::string out;                   // --out (empty: stdout)
  int64_t max_new_tokens = 256;
  int64_t batch = 8;
  std::string dtype = "float32";  // float32 | bfloat16
  std::string device = "cpu";     // cpu | cuda[:N]
  // Flags given on the command line (unset: generation_config.json's value, else transformers').
  std::optional<bool> do_sample;
  std::optional<double> temperature, top_p, min_p, repetition_penalty;
  std::optional<int64_t> top_k;
  uint64_t seed = 0;
  std::string system;  // --system: the chat's first system message
  // --stop-string, repeatable (transformers' stop_strings); unset: generation_config.json's.
  std::vector<std::string> stop_strings;
};

CIUIC_API int generate_cli(const GenerateCliOptions& o, std::ostream& out, std::ostream& err);
CIUIC_API int chat_cli(const GenerateCliOptions& o, std::istream& in, std::ostream& out,
                       std::ostream& err);

}  // namespace ciuic::app
