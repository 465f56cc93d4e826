// ciuic/json.h — the nesting bound of every JSON input (docs/reliability.md, "Hostile inputs:
// importer and parsers").
//
// A downloaded tokenizer.json, config.json, safetensors header, JSONL line or DeepSpeed config is
// untrusted: nested 100,000 levels deep it crashed the recursive code that walks, dumps or
// fingerprints it (issue 27). Every JSON text ciuic or a shipped plugin parses is checked first
// with check_json_depth() (tests/arch holds it: a file calling nlohmann's parse must call it), and
// deeper nesting is refused before a value is built. The limit is serde_json's default recursion
// limit (128), which HF `tokenizers` and the `safetensors` crate parse with: no file they accept
// is refused here.
//
// Threading: any thread. Cost: one pass over the text, no allocation.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <ciuic/error.h>
#include <ciuic/export.h>

namespace ciuic {

// The most arrays and objects open at once in an accepted text: `[[1]]` is depth 2.
inline constexpr size_t kMaxJsonDepth = 128;

// "" when no array or object of `text` is nested deeper than `max_depth`; else where the first
// one past it opens: "nested deeper than 128 levels (arrays and objects) at line L, column C".
// Brackets inside strings do not count. `text` need not be valid JSON: the parser that runs after
// this check reports what else is wrong (the scan agrees with a JSON parser on every text that
// parser accepts).
CIUIC_API std::string json_depth_problem(std::string_view text, size_t max_depth = kMaxJsonDepth);

// Throws Error(`origin` + ": JSON " + json_depth_problem(...) + "; ciuic reads at most 128 ...",
// exit_code) — a UsageError when exit_code is kExitUsage — when the text nests too deep; returns
// otherwise. `origin` names the input in the message (a path, "path:line" for a JSONL line).
CIUIC_API void check_json_depth(std::string_view text, const std::string& origin,
                                int exit_code = kExitRuntime);

}  // namespace ciuic
