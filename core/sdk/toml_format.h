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
// A TOML basic string literal with escapes.
CIUIC_API std::string toml_quote(std::string_view s);
// The TOML literal of a value (shortest round-trip floats, basic strings, inline arrays/tables).
CIUIC_API std::string format_value(const toml::node& node);
// "<file>:<line>:<col>" of a node, or `fallback` when the node has no source.
CIUIC_API std::string toml_location(const toml::node& node, const std::string& fallback);

}  // namespace ciuic
