// tests/support/deep_json.h — JSON nested far past ciuic's depth limit (ciuic/json.h), generated
// by the tests that need it (issue 27: 100,000 levels crashed recursive code; such files are not
// committed).
#pragma once

#include <cstddef>
#include <string>

namespace ciuic_test {

inline constexpr size_t kDeep = 100000;

// `depth` nested arrays around `inner`: "[[[1]]]" for nested_arrays(3).
inline std::string nested_arrays(size_t depth, const std::string& inner = "1") {
  return std::string(depth, '[') + inner + std::string(depth, ']');
}

// `depth` nested objects {"k": {"k": ... inner ...}}.
inline std::string nested_objects(size_t depth, const std::string& inner = "1") {
  std::string s;
  s.reserve(depth * 8 + inner.size());
  for (size_t i = 0; i < depth; ++i) s += "{\"k\": ";
  s += inner;
  s.append(depth, '}');
  return s;
}

}  // namespace ciuic_test
