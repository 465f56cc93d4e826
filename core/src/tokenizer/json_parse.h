// tokenizer/json_parse.h — reading the parts of a tokenizer.json, with errors that name the file
// and the JSON path ("<origin>: <path>: <what>"), shared by tokenizer.cpp, normalizer.cpp and
// decoder.cpp (internal header).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>

#include "tokenizer/regex.h"

namespace ciuic::tok {

[[noreturn]] inline void fail(const std::string& origin, const std::string& path,
                              const std::string& what) {
  throw Error(origin + ": " + path + ": " + what);
}

// j[key] as a boolean; `dflt` when absent or null.
inline bool get_bool(const nlohmann::json& j, const char* key, bool dflt, const std::string& origin,
                     const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_boolean()) fail(origin, path + "/" + key, "expected a boolean, got " + it->dump());
  return it->get<bool>();
}

// j[key] as a string; it must be there.
inline std::string get_string(const nlohmann::json& j, const char* key, const std::string& origin,
                              const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || !it->is_string()) fail(origin, path + "/" + key, "missing or not a string");
  return it->get<std::string>();
}

// The "pattern" of a Replace normalizer / decoder: {"String": literal} (non-empty; into
// `literal`) or {"Regex": Oniguruma pattern} (compiled into `re`).
inline void get_pattern(const nlohmann::json& j, const std::string& origin, const std::string& path,
                        std::string* literal, std::unique_ptr<Regex>* re) {
  auto pat = j.find("pattern");
  if (pat == j.end() || !pat->is_object() || pat->size() != 1)
    fail(origin, path + "/pattern", "expected {\"String\": \"...\"} or {\"Regex\": \"...\"}");
  if (auto s = pat->find("String"); s != pat->end() && s->is_string()) {
    *literal = s->get<std::string>();
    if (literal->empty())
      fail(origin, path + "/pattern/String", "an empty pattern is not supported");
  } else if (auto r = pat->find("Regex"); r != pat->end() && r->is_string()) {
    *re = std::make_unique<Regex>(r->get<std::string>(), origin + ": " + path + "/pattern/Regex");
  } else {
    fail(origin, path + "/pattern",
         "expected {\"String\": \"...\"} or {\"Regex\": \"...\"}, got " + pat->dump());
  }
}

}  // namespace ciuic::tok
