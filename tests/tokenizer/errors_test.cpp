// Every bad-input path of Tokenizer construction and encode, with its message.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <functional>

#include <ciuic/error.h>
#include <ciuic/files.h>
#include <ciuic/json.h>
#include <ciuic/tokenizer.h>

#include "../support/deep_json.h"
#include "test_util.h"
#include "tokenizer/factory.h"
#include "tokenizer/hf_tokenizer.h"

namespace ciuic {
namespace {

using nlohmann::json;

// The message of the ciuic::Error that `f` throws ("<no error>" when it returns).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "<no error>";
}

json base() {
  return test::read_json_file(test::tokenizer_fixture_dir("deepseek_llm") + "/tokenizer.json");
}

// The message from_json(mutated base) throws.
std::string error_after(const std::function<void(json&)>& mutate) {
  json j = base();
  mutate(j);
  return error_of([&] { tokenizer_from_json(j.dump(), "bad.json"); });
}

// Expects the exact message.
void expect_error(const std::function<void(json&)>& mutate, const std::string& message) {
  EXPECT_EQ(error_after(mutate), message);
}

// Expects a message that starts with `prefix` (PCRE2's own wording follows).
void expect_error_prefix(const std::function<void(json&)>& mutate, const std::string& prefix) {
  std::string what = error_after(mutate);
  EXPECT_EQ(what.rfind(prefix, 0), 0u) << what;
}

TEST(TokenizerErrors, MissingFileAndDirectory) {
  {
    const std::string what = error_of([&] { load_tokenizer("/nonexistent/dir/tokenizer.json"); });
    EXPECT_EQ(what, "cannot read tokenizer file '/nonexistent/dir/tokenizer.json': no such file");
  }
  const std::string dir = test::tokenizer_fixture_dir("gpt2");
  {
    const std::string what = error_of([&] { load_tokenizer(dir); });
    EXPECT_EQ(what, "cannot read tokenizer file '" + dir +
                        "': it is a directory (expected tokenizer.json)");
  }
}

// Special files are refused at once (issue 16 item 3): /dev/zero would grow memory forever, a FIFO
// without a writer would block forever; a file over the bound is refused before it is read.
TEST(TokenizerErrors, SpecialAndHugeFilesAreRefusedAtOnce) {
  EXPECT_EQ(error_of([&] { load_tokenizer("/dev/zero"); }),
            "cannot read tokenizer file /dev/zero: not a regular file (a character device)");
  // A fresh folder: opening a FIFO left by an earlier run for writing would block.
  const std::filesystem::path dir = std::filesystem::path(CIUIC_TEST_TMP) / "tokenizer" / "special";
  {
    std::error_code ec;
    ciuic::remove_tree(dir.string(), ec);
  }
  std::filesystem::create_directories(dir);
  const std::string fifo = (dir / "tokenizer.json").string();
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0) << fifo;
  EXPECT_EQ(error_of([&] { load_tokenizer(fifo); }),
            "cannot read tokenizer file " + fifo + ": not a regular file (a FIFO (named pipe))");
  const std::string huge = (dir / "huge.json").string();
  std::ofstream(huge).close();
  std::filesystem::resize_file(huge, kMaxJsonInputBytes + 1);  // sparse: nothing is written
  EXPECT_EQ(error_of([&] { load_tokenizer(huge); }),
            "cannot read tokenizer file " + huge +
                ": it has 268435457 bytes, over the limit of 268435456 bytes for this file");
}

TEST(TokenizerErrors, MalformedJsonNamesLineAndColumn) {
  std::string path = test::write_temp_file("malformed/tokenizer.json",
                                           "{\n  \"model\": {\"type\": \"BPE\",,}\n}\n");
  {
    const std::string what = error_of([&] { load_tokenizer(path); });
    std::string m = what;
    EXPECT_EQ(
        m.rfind(
            path + ": malformed JSON at line 2, column 27: syntax error while parsing object key",
            0),
        0u)
        << m;
  }
}

TEST(TokenizerErrors, NotATokenizerJson) {
  {
    const std::string what = error_of([&] { tokenizer_from_json("[1, 2]", "x.json"); });
    EXPECT_EQ(what, "x.json: /: expected a JSON object (an HF tokenizer.json)");
  }
  {
    const std::string what = error_of([&] { tokenizer_from_json("{}", "x.json"); });
    EXPECT_EQ(what, "x.json: /model: missing (not an HF tokenizer.json?)");
  }
}

TEST(TokenizerErrors, UnsupportedModel) {
  expect_error(
      [](json& j) { j["model"]["type"] = "WordPiece"; },
      "bad.json: /model/type: unsupported model type \"WordPiece\" (ciuic supports \"BPE\")");
  expect_error([](json& j) { j["model"]["byte_fallback"] = "yes"; },
               "bad.json: /model/byte_fallback: expected a boolean");
  expect_error([](json& j) { j["model"]["dropout"] = 0.1; },
               "bad.json: /model/dropout: BPE dropout is not supported (encoding must be "
               "deterministic): 0.1");
  expect_error([](json& j) { j["model"]["continuing_subword_prefix"] = "##"; },
               "bad.json: /model/continuing_subword_prefix: unsupported BPE option (ciuic supports "
               "byte-level BPE "
               "without it): \"##\"");
  expect_error([](json& j) { j["model"].erase("vocab"); },
               "bad.json: /model/vocab: missing or not an object (token -> id)");
  expect_error([](json& j) { j["model"]["vocab"]["Ġzzz"] = "seven"; },
               "bad.json: /model/vocab/Ġzzz: expected a non-negative integer id, got \"seven\"");
  expect_error(
      [](json& j) {
        j["model"]["merges"][3] = json::array({"Ġqqq", "x"});
      },
      "bad.json: /model/merges/3: merge token \"Ġqqq\" is not in the vocabulary");
  expect_error([](json& j) { j["model"]["merges"][0] = "a b c"; },
               "bad.json: /model/merges/0: a merge written as a string must be two tokens "
               "separated by one space: "
               "\"a b c\"");
  expect_error([](json& j) { j["model"]["merges"][1] = 7; },
               "bad.json: /model/merges/1: expected \"a b\" or [\"a\", \"b\"], got 7");
  expect_error([](json& j) { j["model"]["vocab"]["Ġzzz"] = 2000000000; },
               "bad.json: /model/vocab: the largest id 2000000000 is far beyond the vocabulary "
               "size 701 (ids must be "
               "dense)");
  expect_error([](json& j) { j["added_tokens"][3]["id"] = 1500000000; },
               "bad.json: /added_tokens: an added token id (1500000000) is far beyond the "
               "vocabulary (ids must be "
               "dense)");
  expect_error([](json& j) { j["model"]["unk_token"] = "<unk>"; },
               "bad.json: /model/unk_token: unk_token \"<unk>\" is not in the vocabulary");
}

TEST(TokenizerErrors, UnsupportedNormalizerPreTokenizerPostProcessorDecoder) {
  expect_error(
      [](json& j) {
        j["normalizer"] = {{"type", "BertNormalizer"}};
      },
      "bad.json: /normalizer/type: unsupported normalizer \"BertNormalizer\" (ciuic supports NFC, "
      "NFD, NFKC, "
      "NFKD, Lowercase, Strip, Prepend, Replace and Sequence)");
  expect_error(
      [](json& j) {
        j["normalizer"]["normalizers"] =
            json::array({{{"type", "NFC"}}, {{"type", "StripAccents"}}});
      },
      "bad.json: /normalizer/normalizers/1/type: unsupported normalizer \"StripAccents\" (ciuic "
      "supports NFC, "
      "NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace and Sequence)");
  expect_error(
      [](json& j) {
        j["normalizer"] = {{"type", "Precompiled"}, {"precompiled_charsmap", "AAAA"}};
      },
      "bad.json: /normalizer/type: unsupported normalizer \"Precompiled\" (SentencePiece's "
      "compiled character "
      "map; ciuic supports NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace and Sequence: "
      "convert the "
      "model with transformers' LlamaConverter / GemmaConverter layouts, which have none)");
  expect_error(
      [](json& j) {
        j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"String", " "}}}};
      },
      "bad.json: /normalizer/content: missing or not a string");
  expect_error(
      [](json& j) {
        j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Glob", "*"}}}, {"content", ""}};
      },
      "bad.json: /normalizer/pattern: expected {\"String\": \"...\"} or {\"Regex\": \"...\"}, got "
      "{\"Glob\":\"*\"}");
  expect_error(
      [](json& j) {
        j["normalizer"] = {{"type", "Prepend"}, {"prepend", 7}};
      },
      "bad.json: /normalizer/prepend: missing or not a string");
  expect_error(
      [](json& j) {
        j["normalizer"] = {{"type", "Strip"}, {"strip_left", "yes"}};
      },
      "bad.json: /normalizer/strip_left: expected a boolean, got \"yes\"");
  expect_error(
      [](json& j) {
        j["pre_tokenizer"]["pretokenizers"][2] = {{"type", "Whitespace"}};
      },
      "bad.json: /pre_tokenizer/pretokenizers/2/type: unsupported pre-tokenizer \"Whitespace\" "
      "(ciuic "
      "supports Sequence, Split, Digits, ByteLevel and Metaspace)");
  expect_error(
      [](json& j) {
        j["pre_tokenizer"]["pretokenizers"].push_back({{"type", "Digits"}});
      },
      "bad.json: /pre_tokenizer/pretokenizers/7: pre-tokenizer \"Digits\" after ByteLevel is not "
      "supported "
      "(ByteLevel must be last)");
  expect_error(
      [](json& j) {
        j["pre_tokenizer"]["pretokenizers"][2] = {{"type", "Metaspace"}};
      },
      "bad.json: /pre_tokenizer/pretokenizers/3: pre-tokenizer \"Split\" after Metaspace is not "
      "supported "
      "(Metaspace must be last)");
  expect_error(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}};
      },
      "bad.json: /pre_tokenizer/prepend_scheme: expected \"first\", \"always\" or \"never\", got "
      "\"sometimes\"");
  expect_error(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "__"}};
      },
      "bad.json: /pre_tokenizer/replacement: expected a one-character string, got \"__\"");
  expect_error(
      [](json& j) {
        j["pre_tokenizer"] = {{"type", "Metaspace"}, {"split", 1}};
      },
      "bad.json: /pre_tokenizer/split: expected a boolean, got 1");
  expect_error([](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Sideways"; },
               "bad.json: /pre_tokenizer/pretokenizers/0/behavior: unknown behavior \"Sideways\" "
               "(expected Removed, "
               "Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
  expect_error(
      [](json& j) {
        j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Glob", "*"}};
      },
      "bad.json: /pre_tokenizer/pretokenizers/0/pattern: expected {\"Regex\": \"...\"} or "
      "{\"String\": "
      "\"...\"}, got {\"Glob\":\"*\"}");
  expect_error_prefix(
      [](json& j) { j["pre_tokenizer"]["pretokenizers"][1]["pattern"]["Regex"] = "(unclosed"; },
      "bad.json: /pre_tokenizer/pretokenizers/1/pattern/Regex: cannot compile regex \"(unclosed\"");
  expect_error(
      [](json& j) {
        j["post_processor"] = {{"type", "RobertaProcessing"}};
      },
      "bad.json: /post_processor/type: unsupported post-processor \"RobertaProcessing\" (ciuic "
      "supports "
      "TemplateProcessing, ByteLevel and Sequence)");
  expect_error([](json& j) { j["post_processor"]["special_tokens"] = json::object(); },
               "bad.json: /post_processor/special_tokens: no entry for \"<｜begin▁of▁sentence｜>\" "
               "used in the template");
  expect_error([](json& j) { j["post_processor"]["single"].erase(1); },
               "bad.json: /post_processor/single: the template has no $A sequence");
  expect_error(
      [](json& j) {
        j["decoder"] = {{"type", "WordPiece"}};
      },
      "bad.json: /decoder/type: unsupported decoder \"WordPiece\" (ciuic supports ByteLevel, "
      "Replace, "
      "ByteFallback, Fuse, Strip, Metaspace and Sequence)");
  expect_error(
      [](json& j) {
        j["decoder"] = {{"type", "Sequence"},
                        {"decoders", json::array({{{"type", "Fuse"}}, {{"type", "CTC"}}})}};
      },
      "bad.json: /decoder/decoders/1/type: unsupported decoder \"CTC\" (ciuic supports ByteLevel, "
      "Replace, "
      "ByteFallback, Fuse, Strip, Metaspace and Sequence)");
  expect_error(
      [](json& j) {
        j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", -1}, {"stop", 0}};
      },
      "bad.json: /decoder/start: expected a non-negative integer, got -1");
  expect_error(
      [](json& j) {
        j["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}, {"stop", 0}};
      },
      "bad.json: /decoder/content: expected exactly one character, got \"ab\"");
  expect_error(
      [](json& j) {
        j["decoder"] = {{"type", "Metaspace"}, {"prepend_scheme", 3}};
      },
      "bad.json: /decoder/prepend_scheme: expected \"first\", \"always\" or \"never\", got 3");
  expect_error(
      [](json& j) {
        j["decoder"] = {{"type", "Replace"}, {"pattern", {{"String", "▁"}}}};
      },
      "bad.json: /decoder/content: missing or not a string");
  expect_error([](json& j) { j["added_tokens"][0].erase("content"); },
               "bad.json: /added_tokens/0/content: missing or not a string");
  expect_error([](json& j) { j["added_tokens"][1]["lstrip"] = "yes"; },
               "bad.json: /added_tokens/1/lstrip: expected a boolean, got \"yes\"");
}

TEST(TokenizerErrors, BadTokenizerConfig) {
  const std::string tj =
      test::read_text_file(test::tokenizer_fixture_dir("gpt2") + "/tokenizer.json");
  std::string path = test::write_temp_file("badcfg/tokenizer.json", tj);
  std::string cfg =
      test::write_temp_file("badcfg/tokenizer_config.json", "{\"eos_token\": \"<|nope|>\"}");
  {
    const std::string what = error_of([&] { load_tokenizer(path); });
    EXPECT_EQ(what, cfg + ": /eos_token: token \"<|nope|>\" is not in the tokenizer's vocabulary");
  }
  test::write_temp_file("badcfg/tokenizer_config.json", "{\"bos_token\": [1]}");
  {
    const std::string what = error_of([&] { load_tokenizer(path); });
    EXPECT_EQ(what, cfg + ": /bos_token: expected a string or {\"content\": ...}, got [1]");
  }
  test::write_temp_file("badcfg/tokenizer_config.json", "{\"bos_token\": ");
  {
    const std::string what = error_of([&] { load_tokenizer(path); });
    EXPECT_EQ(what.rfind(cfg + ": malformed JSON at line 1, column 15: syntax error", 0), 0u)
        << what;
  }
  // {"content": ...} objects (as transformers writes them) are understood.
  test::write_temp_file(
      "badcfg/tokenizer_config.json",
      "{\"bos_token\": {\"content\": \"<|endoftext|>\", \"lstrip\": false}, \"eos_token\": null}");
  auto tok = load_tokenizer(path);
  EXPECT_EQ(tok->bos_id(), tok->token_to_id("<|endoftext|>"));
  EXPECT_FALSE(tok->eos_id());
}

// Issue 27: a tokenizer.json nested 100,000 deep — Sequence pre-tokenizers or post-processors, or
// any unknown key — crashed (SIGSEGV) while parsing or fingerprinting. Nesting past 128 levels
// (ciuic/json.h; serde_json's limit, which HF tokenizers parses with) is refused first, naming the
// file and the place; up to the limit it loads, the recursive parse and the fingerprint included.
TEST(TokenizerErrors, NestingPastTheDepthLimitIsRefused) {
  // base() with `key` set to the JSON text `value`.
  const auto with = [](const char* key, const std::string& value) {
    json j = base();
    j[key] = "@@";
    std::string t = j.dump();
    return t.replace(t.find("\"@@\""), 4, value);
  };
  const auto repeat = [](const std::string& s, size_t n) {
    std::string out;
    out.reserve(s.size() * n);
    for (size_t i = 0; i < n; ++i) out += s;
    return out;
  };
  const std::string byte_level = base()["pre_tokenizer"].dump();
  const auto pre_sequence = [&](size_t levels) {
    return repeat("{\"type\": \"Sequence\", \"pretokenizers\": [", levels) + byte_level +
           repeat("]}", levels);
  };
  const std::string limit =
      "JSON nested deeper than 128 levels (arrays and objects) at line 1, column ";
  for (const std::string& text :
       {with("pre_tokenizer", pre_sequence(ciuic_test::kDeep)),
        with("post_processor",
             repeat("{\"type\": \"Sequence\", \"processors\": [", ciuic_test::kDeep) +
                 repeat("]}", ciuic_test::kDeep)),
        with("unknown_key", ciuic_test::nested_arrays(ciuic_test::kDeep)),
        with("unknown_key", ciuic_test::nested_objects(ciuic_test::kDeep)),
        with("unknown_key", ciuic_test::nested_arrays(128))}) {  // 129 with the root object
    const std::string what = error_of([&] { tokenizer_from_json(text, "deep.json"); });
    EXPECT_EQ(what.rfind("deep.json: " + limit, 0), 0u) << what.substr(0, 300);
    EXPECT_NE(what.find("; ciuic reads at most 128"), std::string::npos) << what.substr(0, 300);
  }
  // At the limit: the most Sequences (2 levels each) around the fixture's pre-tokenizer that stay
  // within 128 levels load, through the recursive parse; one more is refused.
  size_t most = 0;
  while (json_depth_problem(with("pre_tokenizer", pre_sequence(most + 1))).empty()) ++most;
  EXPECT_GE(most, 60u);
  EXPECT_NE(error_of([&] {
              tokenizer_from_json(with("pre_tokenizer", pre_sequence(most + 1)), "deep.json");
            }).find(limit),
            std::string::npos);
  auto deepest = tokenizer_from_json(with("pre_tokenizer", pre_sequence(most)), "ok.json");
  EXPECT_EQ(deepest->encode("Hello world", false),
            tokenizer_from_json(base().dump(), "b.json")->encode("Hello world", false));
  EXPECT_EQ(tokenizer_from_json(with("unknown_key", ciuic_test::nested_arrays(127)), "ok.json")
                ->fingerprint()
                .size(),
            16u);
  // tokenizer_config.json is read with the same bound.
  const std::string tj =
      test::read_text_file(test::tokenizer_fixture_dir("gpt2") + "/tokenizer.json");
  const std::string path = test::write_temp_file("deepcfg/tokenizer.json", tj);
  const std::string cfg = test::write_temp_file(
      "deepcfg/tokenizer_config.json",
      "{\"bos_token\": " + ciuic_test::nested_arrays(ciuic_test::kDeep) + "}");
  const std::string what = error_of([&] { load_tokenizer(path); });
  EXPECT_EQ(what.rfind(cfg + ": " + limit + "142;", 0), 0u) << what.substr(0, 300);
}

TEST(TokenizerErrors, InvalidUtf8Text) {
  auto tok = load_tokenizer(test::tokenizer_fixture_dir("deepseek_llm") + "/tokenizer.json");
  {
    const std::string what = error_of([&] { tok->encode("ok \xC3\x28 bad", false); });
    EXPECT_EQ(what, "tokenizer (" + test::tokenizer_fixture_dir("deepseek_llm") +
                        "/tokenizer.json): the text is not valid UTF-8 (first bad byte at offset 3 "
                        "of 9)");
  }
  for (std::string bad : {std::string("\xED\xA0\x80"), std::string("\xC0\xAF"),
                          std::string("\xF4\x90\x80\x80"), std::string("abc\xE2\x82")})
    EXPECT_THROW(tok->encode(bad, false), Error) << bad.size();
}

TEST(TokenizerErrors, DecodeIsLossyLikeHf) {
  // A lone continuation byte token decodes to U+FFFD (Rust's from_utf8_lossy), unknown ids are
  // skipped.
  auto tok = load_tokenizer(test::tokenizer_fixture_dir("gpt2") + "/tokenizer.json");
  EXPECT_EQ(tok->decode({*tok->token_to_id("Ã")}, false), "\xEF\xBF\xBD");  // 0xC3 alone
  EXPECT_EQ(tok->decode({-5, 1 << 30}, false), "");
}

TEST(Tokenizer, FingerprintIsStableAndSensitive) {
  json j = base();
  auto a = tokenizer_from_json(j.dump(), "a.json");
  auto b = tokenizer_from_json(j.dump(2), "b.json");  // formatting and origin do not matter
  EXPECT_EQ(a->fingerprint(), b->fingerprint());
  EXPECT_EQ(a->fingerprint().size(), 16u);
  EXPECT_EQ(a->fingerprint().find_first_not_of("0123456789abcdef"), std::string::npos);
  json k = j;
  std::swap(k["model"]["merges"][0], k["model"]["merges"][1]);
  EXPECT_NE(tokenizer_from_json(k.dump(), "k.json")->fingerprint(), a->fingerprint());
  json l = j;
  l["added_tokens"][2]["lstrip"] = true;
  EXPECT_NE(tokenizer_from_json(l.dump(), "l.json")->fingerprint(), a->fingerprint());
  // FNV-1a 64 reference values (from the algorithm's published test vectors).
  EXPECT_EQ(tok::fnv1a64_hex(""), "cbf29ce484222325");
  EXPECT_EQ(tok::fnv1a64_hex("a"), "af63dc4c8601ec8c");
  EXPECT_EQ(tok::fnv1a64_hex("foobar"), "85944171f73967e8");
}

}  // namespace
}  // namespace ciuic
