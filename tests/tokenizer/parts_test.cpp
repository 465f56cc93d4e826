// Normalizers, the Metaspace pre-tokenizer and decoders, each alone, vs HF `tokenizers`' own
// output (tests/fixtures/tokenizer/parts.json, written by tests/fixtures/gen_tokenizer_spm.py).
#include <gtest/gtest.h>

#include <ciuic/error.h>
#include <ciuic/tokenizer.h>

#include "test_util.h"
#include "tokenizer/decoder.h"
#include "tokenizer/factory.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/normalizer.h"

namespace ciuic {
namespace {

using nlohmann::json;

json parts() {
  return test::read_json_file(std::string(CIUIC_FIXTURES_DIR) + "/tokenizer/parts.json");
}

TEST(TokenizerParts, NormalizersMatchHf) {
  const json fx = parts();
  ASSERT_GE(fx["normalizers"].size(), 15u);
  for (const json& n : fx["normalizers"]) {
    tok::Normalizer norm(n["config"], "parts.json", "/normalizer");
    for (const json& c : n["cases"]) {
      const std::string text = c[0].get<std::string>();
      EXPECT_EQ(norm.normalize(text), c[1].get<std::string>())
          << n["config"].dump() << " on " << json(text).dump();
    }
  }
}

// A character-level tokenizer with `pre` as its pre-tokenizer: pre_tokenize() shows its pieces.
std::shared_ptr<const tok::HfTokenizer> with_pre_tokenizer(const json& pre) {
  json j = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}}}, {"merges", json::array()}}},
            {"pre_tokenizer", pre},
            {"decoder", nullptr}};
  return std::dynamic_pointer_cast<const tok::HfTokenizer>(
      tokenizer_from_json(j.dump(), "parts.json"));
}

TEST(TokenizerParts, MetaspaceMatchesHf) {
  const json fx = parts();
  ASSERT_EQ(fx["metaspace"].size(), 12u);
  for (const json& m : fx["metaspace"]) {
    auto tok = with_pre_tokenizer(m["config"]);
    for (const json& c : m["cases"]) {
      const std::string text = c[0].get<std::string>();
      EXPECT_EQ(tok->pre_tokenize(text), c[1].get<std::vector<std::string>>())
          << m["config"].dump() << " on " << json(text).dump();
    }
  }
}

// "first" prepends only at offset 0 of the original text: not after an added token at the start,
// nor to the stretch after one in the middle (HF: offsets_original().0 == 0).
TEST(TokenizerParts, MetaspaceFirstOnlyAtTheStartOfTheText) {
  json j = {
      {"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"<s>", 1}}}, {"merges", json::array()}}},
      {"pre_tokenizer",
       {{"type", "Metaspace"},
        {"replacement", "_"},
        {"prepend_scheme", "first"},
        {"split", false}}},
      {"added_tokens",
       json::array({{{"id", 1}, {"content", "<s>"}, {"special", true}, {"normalized", false}}})},
      {"decoder", nullptr}};
  auto tok = std::dynamic_pointer_cast<const tok::HfTokenizer>(
      tokenizer_from_json(j.dump(), "first.json"));
  EXPECT_EQ(tok->pre_tokenize("a b<s>a b"), (std::vector<std::string>{"_a_b", "<s>", "a_b"}));
  EXPECT_EQ(tok->pre_tokenize("<s>a b"), (std::vector<std::string>{"<s>", "a_b"}));
}

TEST(TokenizerParts, DecodersMatchHf) {
  const json fx = parts();
  ASSERT_GE(fx["decoders"].size(), 12u);
  for (const json& d : fx["decoders"]) {
    tok::Decoder dec(d["config"], "parts.json", "/decoder");
    ASSERT_FALSE(d["cases"].empty()) << d["config"].dump();
    for (const json& c : d["cases"]) {
      auto tokens = c[0].get<std::vector<std::string>>();
      EXPECT_EQ(dec.decode(tokens), c[1].get<std::string>())
          << d["config"].dump() << " on " << c[0].dump();
    }
  }
}

}  // namespace
}  // namespace ciuic
