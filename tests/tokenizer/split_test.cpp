// Split / Digits pre-tokenizers vs HF `tokenizers`' own (splits.json: every behavior, invert,
// Oniguruma-specific classes \s \w \h, line anchors, empty matches, literal String patterns).
#include <gtest/gtest.h>

#include <ciuic/tokenizer.h>

#include "test_util.h"
#include "tokenizer/bpe.h"
#include "tokenizer/factory.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/regex.h"

namespace ciuic {
namespace {

using nlohmann::json;

// A tokenizer whose pre-tokenizer is `step` followed by a plain ByteLevel, over the 256 byte
// tokens (no merges): pre_tokenize() then shows the pieces `step` made.
std::shared_ptr<const tok::HfTokenizer> with_step(const json& step) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b)
    vocab[tok::ByteAlphabet::get().to_token(std::string(1, static_cast<char>(b)))] = b;
  json j = {
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}}},
      {"pre_tokenizer",
       {{"type", "Sequence"},
        {"pretokenizers",
         json::array(
             {step, {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
      {"decoder", {{"type", "ByteLevel"}}}};
  auto tok = tokenizer_from_json(j.dump(), "split-test");
  return std::dynamic_pointer_cast<const tok::HfTokenizer>(tok);
}

TEST(SplitPreTokenizer, MatchesHfOnEveryConfiguration) {
  json fx = test::read_json_file(std::string(CIUIC_FIXTURES_DIR) + "/tokenizer/splits.json");
  ASSERT_GT(fx["configs"].size(), 30u);
  for (const json& cfg : fx["configs"]) {
    json step = cfg;
    step.erase("cases");
    auto tok = with_step(step);
    ASSERT_TRUE(tok);
    for (const json& c : cfg["cases"]) {
      const std::string text = c[0].get<std::string>();
      std::vector<std::string> want = c[1].get<std::vector<std::string>>();
      EXPECT_EQ(tok->pre_tokenize(text), want) << step.dump() << " on " << json(text).dump();
      // And the ids are the bytes of those pieces, in order (no merges).
      std::vector<int32_t> ids = tok->encode(text, false);
      std::string joined;
      for (const std::string& p : want) joined += p;
      EXPECT_EQ(ids.size(), joined.size());
    }
  }
}

TEST(SplitPreTokenizer, OnigurumaTranslation) {
  using tok::Regex;
  EXPECT_EQ(Regex::translate_onig(R"(\s+)"), R"([\s\x{85}]+)");
  EXPECT_EQ(Regex::translate_onig(R"([^\s\p{L}\p{N}]+)"), R"([^\s\x{85}\p{L}\p{N}]+)");
  EXPECT_EQ(Regex::translate_onig(R"(\s+(?!\S))"), R"([\s\x{85}]+(?![^\s\x{85}]))");
  EXPECT_EQ(Regex::translate_onig(R"(\w\h)"), R"([\p{L}\p{M}\p{N}\p{Pc}][0-9a-fA-F])");
  EXPECT_EQ(Regex::translate_onig(R"([]\s])"),
            R"([]\s\x{85}])");  // ']' first in a class is literal
  EXPECT_EQ(Regex::translate_onig(R"([[:alpha:]\s])"), R"([[:alpha:]\s\x{85}])");
  EXPECT_EQ(Regex::translate_onig(R"(\[\s\])"),
            R"(\[[\s\x{85}]\])");  // escaped brackets are not a class
  EXPECT_EQ(Regex::escape_literal("a.b*c d"), R"(a\.b\*c\ d)");
}

}  // namespace
}  // namespace ciuic
