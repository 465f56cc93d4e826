// core/src/score/ against sacrebleu, rouge-score and numpy: tests/fixtures/score/cases.json,
// written by tests/fixtures/gen_score.py (texts in English, numbers, CJK, mixed scripts, empty
// strings, unusual Unicode; corpora with one to three references per segment).
// Scores are compared for equality of the doubles: the C++ does sacrebleu's and rouge-score's
// floating-point operations in their order.
#include <cmath>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "score/bleu.h"
#include "score/porter.h"
#include "score/rouge.h"
#include "score/stats.h"
#include "score/unicode.h"

using nlohmann::json;
using namespace ciuic::score;

namespace {

const json& cases() {
  static const json j = [] {
    const std::string path = CIUIC_SOURCE_DIR + "/tests/fixtures/score/cases.json";
    std::ifstream in(path);
    if (!in)
      throw std::runtime_error("cannot read " + path + " (python3 tests/fixtures/gen_score.py)");
    std::stringstream ss;
    ss << in.rdbuf();
    return json::parse(ss.str());
  }();
  return j;
}

std::string show(const std::string& s) { return json(s).dump(); }

}  // namespace

TEST(ScoreFixtures, AreThere) {
  EXPECT_GE(cases()["tokenize"].size(), 200u);
  EXPECT_GE(cases()["corpora"].size(), 50u);
  EXPECT_GE(cases()["rouge"].size(), 300u);
}

TEST(Bleu, TokenizersEqualSacrebleus) {
  size_t n = 0;
  for (const auto& c : cases()["tokenize"]) {
    const std::string text = c["text"];
    for (const char* name : {"13a", "zh", "none"}) {
      const auto t = bleu_tokenize_from_name(name);
      ASSERT_TRUE(t);
      EXPECT_EQ(bleu_tokenize(text, *t), c[name].get<std::string>())
          << name << " of " << show(text);
      ++n;
    }
  }
  EXPECT_GE(n, 600u);
}

// The zh ranges of bleu.cpp are sacrebleu's as its comparison makes them: the generator derives
// them from TokenizerZh._is_chinese_char over all code points, and its texts hold each range's
// edges, in and out (checked above). Two of its quirks, spelled out:
TEST(Bleu, ZhRangesAreSacrebleusAsItsCodeHasThem) {
  EXPECT_GE(cases()["zh_ranges"].size(), 10u);
  EXPECT_EQ(bleu_tokenize("a\u2014b", BleuTokenize::kZh),
            "a \u2014 b");  // U+2014: inside U+2001..U+2A6D
  EXPECT_EQ(bleu_tokenize("a\U00020000b", BleuTokenize::kZh),
            "a\U00020000b");  // Ext. B is not in it
  EXPECT_EQ(bleu_tokenize("a\u4e2db", BleuTokenize::kZh), "a \u4e2d b");
}

TEST(Bleu, CorpusScoresEqualSacrebleus) {
  for (const auto& c : cases()["corpora"]) {
    const auto t = bleu_tokenize_from_name(c["tokenize"].get<std::string>());
    ASSERT_TRUE(t);
    const auto hyps = c["hyps"].get<std::vector<std::string>>();
    const auto refs = c["refs"].get<std::vector<std::vector<std::string>>>();
    const BleuScore s = corpus_bleu(hyps, refs, *t);
    const std::string what = std::string(bleu_tokenize_name(*t)) + ", " +
                             std::to_string(hyps.size()) + " segments, first " + show(hyps[0]);
    EXPECT_EQ(s.stats.sys_len, c["sys_len"].get<int64_t>()) << what;
    EXPECT_EQ(s.stats.ref_len, c["ref_len"].get<int64_t>()) << what;
    for (int n = 0; n < kBleuMaxOrder; ++n) {
      EXPECT_EQ(s.stats.correct[n], c["counts"][n].get<int64_t>()) << what << " order " << n + 1;
      EXPECT_EQ(s.stats.total[n], c["totals"][n].get<int64_t>()) << what << " order " << n + 1;
      EXPECT_EQ(s.precisions[n], c["precisions"][n].get<double>()) << what << " order " << n + 1;
    }
    EXPECT_EQ(s.bp, c["bp"].get<double>()) << what;
    EXPECT_EQ(s.score, c["score"].get<double>()) << what;
  }
}

// Ranks each score a share and sum the statistics: the same score as one process.
TEST(Bleu, SummedStatisticsGiveTheCorpusScore) {
  const auto& c = cases()["corpora"][0];
  const auto hyps = c["hyps"].get<std::vector<std::string>>();
  const auto refs = c["refs"].get<std::vector<std::vector<std::string>>>();
  BleuStats a, b;
  for (size_t i = 0; i < hyps.size(); ++i)
    (i % 2 ? a : b).add(bleu_segment(hyps[i], refs[i], BleuTokenize::k13a));
  a.add(b);
  EXPECT_EQ(bleu_from_stats(a).score, c["score"].get<double>());
}

TEST(Bleu, RefusesWhatItCannotScore) {
  EXPECT_THROW(corpus_bleu({"a", "b"}, {{"a"}}, BleuTokenize::k13a), std::invalid_argument);
  EXPECT_THROW(bleu_segment("a", {}, BleuTokenize::k13a), std::invalid_argument);
  EXPECT_FALSE(bleu_tokenize_from_name("intl"));
  EXPECT_FALSE(bleu_tokenize_from_name("13A"));
  EXPECT_EQ(corpus_bleu({}, {}, BleuTokenize::k13a).score, 0.0);  // nothing to score: 0, no throw
}

TEST(Rouge, TokenizerAndScoresEqualRougeScores) {
  for (const auto& c : cases()["rouge"]) {
    const std::string t = c["target"], p = c["prediction"];
    EXPECT_EQ(rouge_tokenize(t), c["tokens_target"].get<std::vector<std::string>>()) << show(t);
    const RougeScore s = rouge_l(t, p);
    EXPECT_EQ(s.precision, c["precision"].get<double>()) << show(t) << " vs " << show(p);
    EXPECT_EQ(s.recall, c["recall"].get<double>()) << show(t) << " vs " << show(p);
    EXPECT_EQ(s.fmeasure, c["fmeasure"].get<double>()) << show(t) << " vs " << show(p);
  }
}

TEST(Porter, StemsAsNltk) {
  size_t n = 0, bad = 0;
  for (const auto& c : cases()["porter"]) {
    const std::string w = c[0], want = c[1];
    const std::string got = porter_stem(w);
    if (got != want && ++bad <= 20) ADD_FAILURE() << w << ": " << got << ", NLTK " << want;
    ++n;
  }
  EXPECT_EQ(bad, 0u) << "of " << n;
  EXPECT_GE(n, 2000u);
}

TEST(Rouge, WithTheStemmerEqualsRougeScores) {
  for (const auto& c : cases()["rouge_stem"]) {
    const std::string t = c["target"], p = c["prediction"];
    EXPECT_EQ(rouge_tokenize(t, true), c["tokens_target"].get<std::vector<std::string>>())
        << show(t);
    const RougeScore s = rouge_l(t, p, true);
    EXPECT_EQ(s.precision, c["precision"].get<double>()) << show(t) << " vs " << show(p);
    EXPECT_EQ(s.recall, c["recall"].get<double>()) << show(t) << " vs " << show(p);
    EXPECT_EQ(s.fmeasure, c["fmeasure"].get<double>()) << show(t) << " vs " << show(p);
  }
}

TEST(Rouge, MeanOfPairs) {
  const auto& m = cases()["rouge_mean"];
  const RougeScore s = rouge_l_mean(m["targets"].get<std::vector<std::string>>(),
                                    m["predictions"].get<std::vector<std::string>>());
  EXPECT_EQ(s.precision, m["precision"].get<double>());
  EXPECT_EQ(s.recall, m["recall"].get<double>());
  EXPECT_EQ(s.fmeasure, m["fmeasure"].get<double>());
  EXPECT_THROW(rouge_l_mean({"a"}, {}), std::invalid_argument);
}

TEST(Percentile, EqualsNumpys) {
  for (const auto& c : cases()["percentiles"])
    EXPECT_EQ(percentile(c["values"].get<std::vector<double>>(), c["q"].get<double>()),
              c["result"].get<double>())
        << c["values"].size() << " values, q " << c["q"];
  EXPECT_TRUE(std::isnan(percentile({}, 50)));
}

TEST(Unicode, InvalidUtf8ReadsAsReplacementCharacters) {
  EXPECT_EQ(decode_utf8("a\xff"
                        "b"),
            U"a\uFFFDb");
  EXPECT_EQ(decode_utf8("\xe4\xb8"), U"\uFFFD");        // a truncated sequence: one U+FFFD
  EXPECT_EQ(decode_utf8("\xc0\xaf"), U"\uFFFD\uFFFD");  // overlong: each byte
  EXPECT_EQ(decode_utf8("\xed\xa0\x80"), U"\uFFFD\uFFFD\uFFFD");  // a surrogate
  EXPECT_EQ(encode_utf8(decode_utf8("h\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80")),
            "h\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80");
}
