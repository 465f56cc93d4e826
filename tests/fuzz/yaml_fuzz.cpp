// tests/fuzz/yaml_fuzz.cpp — the YAML reader of the training-file importers
// (core/src/import/yaml.h).
//
// Input: YAML text.
// Checks: only ciuic::Error escapes (with a short, valid UTF-8 message); an accepted tree is at
// most kMaxYamlDepth deep and holds at most kMaxYamlNodes nodes (aliases expanded), and every
// accessor the importers use answers on every node.
#include <string>

#include "fuzz_common.h"
#include "import/yaml.h"

namespace {

using ciuic::importer::YamlNode;

size_t walk(const YamlNode& n, size_t depth) {
  ciuic::fuzz::check(depth <= ciuic::importer::kMaxYamlDepth + 1,
                     "a tree deeper than kMaxYamlDepth");
  (void)n.is_null();
  (void)n.as_bool();
  (void)n.as_number();
  (void)n.as_string();
  (void)n.where();
  size_t count = 1;
  const bool container = n.kind == YamlNode::Kind::kSeq || n.kind == YamlNode::Kind::kMap;
  for (const auto& i : n.items) count += walk(i, depth + 1);
  for (const auto& [k, v] : n.map) {
    (void)n.find(k);
    count += walk(v, depth + 1);
  }
  ciuic::fuzz::check(container || (n.items.empty() && n.map.empty()), "a scalar with children");
  return count;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  ciuic::fuzz::expect_ok_or_error([&] {
    const YamlNode root = ciuic::importer::parse_yaml(text, "fuzz.yaml");
    ciuic::fuzz::check(walk(root, 0) <= ciuic::importer::kMaxYamlNodes,
                       "more nodes than kMaxYamlNodes");
  });
  return 0;
}
