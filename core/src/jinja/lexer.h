// The Jinja lexer: template text and tags into tokens, with jinja2's whitespace control as
// transformers configures it (trim_blocks, lstrip_blocks, `-` and `+` modifiers), comments and
// {% raw %} handled here. Errors are TemplateErrors naming origin:line:col.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "jinja/value.h"

namespace ciuic::jinja {

enum class T : uint8_t {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kString,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Token {
  T type;
  std::string text;  // text, name, string value, number literal, operator
  Pos pos;
};

// jinja2's lexer first: \r\n and \r become \n (newline_sequence), and one final newline is
// dropped (transformers keeps keep_trailing_newline=False).
std::string normalize_newlines(std::string_view src);

// The tokens of `src` (after normalize_newlines), ending with kEof.
std::vector<Token> lex(std::string_view src, const std::string& origin);

}  // namespace ciuic::jinja
