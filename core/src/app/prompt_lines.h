// Internal: the lines of a --generate --prompts file (docs/generate.md), parsed without a
// tokenizer: a raw prompt ({"prompt": "..."}) or chat messages ({"messages": [{"role": ...,
// "content": ...}, ...]}). Kept apart from generate_cli.cpp so that the fuzz target
// (tests/fuzz/modelfiles_fuzz.cpp) compiles it without the model.
//
// Threading: any thread. Failure: UsageError (exit 2) naming `where` ("FILE:LINE").
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ciuic/tokenizer.h>

namespace ciuic::app {

struct PromptLine {
  std::optional<std::string> prompt;  // raw text, or
  std::vector<ChatMessage> messages;  // messages for the chat template (when `prompt` is unset)
  // The line's own "stop_strings" (a string or a list of strings), unset when the line has none;
  // not checked against a tokenizer here (empty strings and the rest: the caller).
  std::optional<std::vector<std::string>> stop_strings;
};

// One line; nullopt for a blank one (spaces, tabs, a CR). Nesting past kMaxJsonDepth, a line that
// is not a JSON object, or neither a string "prompt" nor a "messages" list of string role/content
// pairs, or a "stop_strings" that is neither a string nor a list of strings: UsageError.
std::optional<PromptLine> parse_prompt_line(std::string_view line, const std::string& where);

}  // namespace ciuic::app
