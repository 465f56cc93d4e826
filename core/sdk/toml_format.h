// SDK-internal (not installed): TOML value formatting and source locations, shared by
// ciuic::Config (the SDK) and the recipe loader (the engine), which includes it as
// "sdk/toml_format.h". Exported from libciuic_sdk so that the two format values identically.
#pragma once

#include <string>
#include <string_view>

#include <toml++/toml.h>

#include <ciuic/export.h>

namespace ciuic {

// Shortest round-trip decimal form: "2e8", "1e-4", "0.5", "nan", "inf".
CIUIC_API std::string format_number(double v);
// format_number() that always reads back as a TOML float ("1" -> "1.0").
CIUIC_API std::string float_literal(double v);
// A TOML basic string literal holding `s` exactly: quotes, backslashes and control characters
// escaped (\", \\, \n, \t, \r, \u001b), and so are the characters printable_text() would escape
// (C1 controls, U+2028/U+2029, bidirectional controls: \u009b, \u202e). A byte that is not UTF-8,
// which no TOML string can hold, becomes \ufffd (strings parsed by toml++ never have one;
// callers quoting other text refuse it first, e.g. the DeepSpeed importer's --set values).
CIUIC_API std::string toml_quote(std::string_view s);
// A TOML comment "# <text>" on one line, whatever `text` holds: printable_text(text, false), so a
// newline, CR or any control byte in it is written \x0a, \x0d, ... and cannot end the comment.
CIUIC_API std::string toml_comment(std::string_view text);
// Whether `key` is a TOML bare key (letters, digits, '_' and '-': every ciuic key is one).
CIUIC_API bool is_bare_key(std::string_view key);
// `key` as written in a TOML key position: itself when bare, else toml_quote(key).
CIUIC_API std::string toml_key(std::string_view key);
// The TOML literal of a value (shortest round-trip floats, basic strings, inline arrays/tables).
CIUIC_API std::string format_value(const toml::node& node);
// "<file>:<line>:<col>" of a node, or `fallback` when the node has no source.
CIUIC_API std::string toml_location(const toml::node& node, const std::string& fallback);

}  // namespace ciuic
