// The YAML reader of the training-file importers (import/yaml.h): what PyYAML's safe_load reads
// (tests/import/gen_yaml_cases.py writes yaml_cases.json with PyYAML), what it refuses, and the
// bounds a hostile file meets: nesting depth (also through aliases), alias bombs, foreign tags.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>

#include "../support/read_file.h"
#include "import/yaml.h"

namespace ciuic::importer {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string error_of(const std::string& yaml) {
  try {
    parse_yaml(yaml, "t.yaml");
  } catch (const UsageError& e) {
    EXPECT_EQ(e.exit_code(), kExitUsage);
    return e.what();
  }
  return "no error";
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// `n` against PyYAML's value: the accessors a training-file importer uses give what PyYAML gave.
void expect_same(const YamlNode& n, const json& want, const std::string& path) {
  if (want.is_null()) {
    EXPECT_TRUE(n.is_null()) << path << ": " << n.text;
  } else if (want.is_boolean()) {
    EXPECT_EQ(n.as_bool(), std::optional<bool>(want.get<bool>())) << path << ": " << n.text;
  } else if (want.is_number()) {
    ASSERT_TRUE(n.as_number()) << path << ": " << n.text;
    EXPECT_DOUBLE_EQ(*n.as_number(), want.get<double>()) << path;
    EXPECT_FALSE(n.as_bool()) << path;
  } else if (want.is_string()) {
    ASSERT_EQ(n.kind, YamlNode::Kind::kScalar) << path;
    EXPECT_EQ(n.text, want.get<std::string>()) << path;
    EXPECT_FALSE(n.as_bool()) << path << ": a string, not a boolean";
    EXPECT_FALSE(n.is_null()) << path;
  } else if (want.is_array()) {
    ASSERT_EQ(n.kind, YamlNode::Kind::kSeq) << path;
    ASSERT_EQ(n.items.size(), want.size()) << path;
    for (size_t i = 0; i < want.size(); ++i)
      expect_same(n.items[i], want[i], path + "[" + std::to_string(i) + "]");
  } else {
    ASSERT_EQ(n.kind, YamlNode::Kind::kMap) << path;
    std::set<std::string> keys;
    for (const auto& [k, v] : n.map) keys.insert(k);
    std::set<std::string> want_keys;
    for (auto it = want.begin(); it != want.end(); ++it) want_keys.insert(it.key());
    EXPECT_EQ(keys, want_keys) << path;
    for (auto it = want.begin(); it != want.end(); ++it)
      if (const YamlNode* v = n.find(it.key())) expect_same(*v, it.value(), path + "." + it.key());
  }
}

TEST(Yaml, ReadsWhatPyYamlReads) {
  const json fx =
      json::parse(ciuic_test::slurp(fs::path(CIUIC_SOURCE_DIR) / "tests/import/yaml_cases.json"));
  for (const auto& c : fx["cases"]) {
    SCOPED_TRACE(c["name"].get<std::string>());
    const YamlNode n = parse_yaml(c["yaml"].get<std::string>(), "t.yaml");
    expect_same(n, c["value"], c["name"].get<std::string>());
  }
  for (const auto& c : fx["refused"]) {
    const std::string e = error_of(c["yaml"].get<std::string>());
    EXPECT_EQ(e.rfind("t.yaml: line ", 0), 0u) << c["name"] << ": " << e;
  }
  EXPECT_TRUE(has(error_of("model: !!python/object/apply:os.system ['echo pwned']\n"),
                  "not one of YAML's core tags"));
  EXPECT_TRUE(has(error_of("a: 1\n---\nb: 2\n"), "a second YAML document"));
  EXPECT_TRUE(has(error_of("a: *nothing\n"), "alias *nothing names no anchor"));
  EXPECT_TRUE(has(error_of("? [a, b]\n: 1\n"), "a mapping key that is a sequence"));
  // Positions are 1-based.
  const YamlNode n = parse_yaml("a: 1\nb:\n  c: x\n", "t.yaml");
  EXPECT_EQ(n.find("b")->find("c")->where(), "line 3, column 6");
}

TEST(Yaml, NestingPastTheDepthLimitIsRefused) {
  const auto flow = [](size_t depth) {
    return "a: " + std::string(depth, '[') + std::string(depth, ']') + "\n";
  };
  EXPECT_EQ(error_of(flow(kMaxYamlDepth - 1)),
            "no error");  // the root mapping and 127 sequences: 128 levels
  EXPECT_TRUE(has(error_of(flow(kMaxYamlDepth)),
                  "t.yaml: line 1, column 131: YAML nested deeper than 128 levels"))
      << error_of(flow(kMaxYamlDepth));
  EXPECT_TRUE(has(error_of(flow(100000)), "t.yaml: line 1, column "));
  std::string block;
  for (size_t i = 0; i < 300; ++i) block += std::string(i * 2, ' ') + "k:\n";
  EXPECT_TRUE(has(error_of(block), "nested deeper than 128"));
  // Through an alias: a 100-deep anchor used 60 levels down.
  std::string y = "x: &deep " + std::string(100, '[') + std::string(100, ']') +
                  "\ny: " + std::string(60, '[') + "*deep" + std::string(60, ']') + "\n";
  EXPECT_TRUE(has(error_of(y), "alias *deep nests deeper than 128 levels")) << error_of(y);
}

// Each anchor aliased ten times by the next: 10^9 strings if expanded. Refused at once.
TEST(Yaml, AliasBombsAreRefusedQuickly) {
  std::string y =
      "a: &a [\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\",\"lol\"]\n";
  std::string prev = "a";
  for (char c = 'b'; c <= 'i'; ++c) {
    y += std::string(1, c) + ": &" + c + " [";
    for (int i = 0; i < 10; ++i) y += (i ? ",*" : "*") + prev;
    y += "]\n";
    prev = std::string(1, c);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = error_of(y);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(has(e, "expands the document to more than 1000000 nodes (an alias bomb?)")) << e;
  EXPECT_LT(s, 5.0);
  // A few aliases of a small anchor are fine, and merge keys keep the mapping's own keys.
  const YamlNode n =
      parse_yaml("base: &b {lr: 1, bf16: true}\nrun:\n  <<: *b\n  lr: 2\n", "t.yaml");
  EXPECT_EQ(n.find("run")->find("lr")->as_number(), 2.0);
  EXPECT_EQ(n.find("run")->find("bf16")->as_bool(), true);
}

TEST(Yaml, HostileTextInMessagesIsShownNotSent) {
  const std::string e = error_of("a: !<tag:evil\x1b[31m> 1\n");
  EXPECT_EQ(e.find('\x1b'), std::string::npos) << e;
  // Raw control characters are not YAML (PyYAML refuses them too): the line is named.
  const std::string c = error_of("a: 1\nb: x\x1b[2Jy\n");
  EXPECT_TRUE(
      has(c, "t.yaml: line 2, column 5: not valid YAML: control characters are not allowed"))
      << c;
  EXPECT_EQ(c.find('\x1b'), std::string::npos) << c;
  try {
    parse_yaml("a: [1,\n", "evil\n[run]\x1b.yaml");
    ADD_FAILURE();
  } catch (const UsageError& x) {
    EXPECT_EQ(std::string(x.what()).find('\n'), std::string::npos) << x.what();
  }
}

}  // namespace
}  // namespace ciuic::importer
