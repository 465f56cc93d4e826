// Internal: a YAML reader for other tools' training files (LLaMA-Factory, axolotl: import/
// training_file.h), with the bounds a downloaded file needs (docs/reliability.md, "Hostile
// inputs").
//
// The file is parsed by libyaml (events, no recursion) into a tree of YamlNode. What PyYAML's
// safe_load accepts — the loader both tools use — is accepted, with these limits:
//  * nesting deeper than kMaxYamlDepth (128, as for JSON: ciuic/json.h) sequences and mappings,
//    also through aliases, is refused where it opens;
//  * aliases are expanded into copies, and the whole tree may hold at most kMaxYamlNodes nodes, so
//    a "billion laughs" file (each anchor aliased ten times by the next) is refused at once, naming
//    the alias, instead of growing exponentially;
//  * tags other than YAML's core ones (!!str, !!int, !!float, !!bool, !!null, !!seq, !!map) are
//    refused (PyYAML's safe_load refuses !!python/... too), and so is a second document;
//  * merge keys (`<<: *base`) merge as PyYAML does: keys written in the mapping win.
// Scalars keep their text; YAML 1.1 resolution (PyYAML's: yes/no/on/off are booleans, "1e-5"
// without a dot is a string, ~ and empty are null) is done by the accessors below.
#pragma once

#include <ciuic/export.h>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ciuic::importer {

inline constexpr size_t kMaxYamlDepth = 128;
inline constexpr size_t kMaxYamlNodes = 1000000;

struct YamlEntry;  // a mapping's key and value

struct CIUIC_API YamlNode {
  enum class Kind { kNull, kScalar, kSeq, kMap };
  Kind kind = Kind::kNull;
  std::string text;             // a scalar's text (as written, unescaped)
  bool plain = true;            // an unquoted scalar (subject to resolution: true, null, 3, 1.5e-5)
  std::vector<YamlNode> items;  // kSeq
  std::vector<YamlEntry>
      map;  // kMap, in order; a repeated key keeps its first place and last value
  size_t line = 0, column = 0;  // 1-based start

  // The value of `key` in a mapping, or null (also when this is not a mapping).
  const YamlNode* find(const std::string& key) const;
  bool is_null() const;  // kNull, or a plain ~ / null / Null / NULL / empty scalar
  std::optional<bool> as_bool()
      const;  // YAML 1.1 booleans (plain): true/false/yes/no/on/off in 3 cases
  std::optional<double> as_number()
      const;  // a number, also when quoted or written "2e-5" (pydantic/HF coerce them)
  std::optional<std::string> as_string()
      const;                  // a scalar's text (numbers and booleans too), not null
  std::string where() const;  // "line L, column C"
};

struct YamlEntry {
  std::string first;
  YamlNode second;
};

// Parses `text` (`origin` names it in messages). Throws UsageError (exit 2) naming origin, line and
// column for malformed YAML, the limits above, foreign tags, several documents, non-scalar keys.
// Time and memory are linear in the text's size plus the expansion (bounded). Thread-safe.
CIUIC_API YamlNode parse_yaml(const std::string& text, const std::string& origin);

}  // namespace ciuic::importer
