// score/rouge.h — ROUGE-L as rouge-score computes it (Google's `rouge_score`,
// RougeScorer(["rougeL"]) with its default tokenizer, and its Porter stemmer when asked).
//
// Tokenizer (rouge_score.tokenize): the text lowercased as Python's str.lower() does, every run
// of characters other than a-z and 0-9 a separator (so only ASCII letters and digits make
// tokens: "naïve" is "na", "ve"; CJK text has no tokens; U+0130 and the Kelvin sign lowercase to
// ASCII "i" and "k" and count). ROUGE-L of one pair: the longest common subsequence of the
// token lists, precision = LCS / prediction tokens, recall = LCS / target tokens, F = 2PR/(P+R);
// all three 0 when either side has no token.
// With use_stemmer (rouge-score's use_stemmer=True), tokens longer than three characters are
// stemmed by NLTK's Porter stemmer (score/porter.h) before the comparison.
// Corpus figure: rouge_l_mean averages the pairs' scores (what `evaluate`'s "rouge" reports
// with use_aggregator=False, then a mean; rouge-score itself scores pairs only).
//
// Threading: pure functions, reentrant. Failure: none.
#pragma once

#include <ciuic/export.h>

#include <string>
#include <string_view>
#include <vector>

namespace ciuic::score {

struct RougeScore {
  double precision = 0, recall = 0, fmeasure = 0;
};

CIUIC_API std::vector<std::string> rouge_tokenize(std::string_view text, bool use_stemmer = false);
CIUIC_API RougeScore rouge_l(std::string_view target, std::string_view prediction,
                             bool use_stemmer = false);
// targets[i] against predictions[i]; the mean of each field (0s for no pair). Throws
// std::invalid_argument when the two differ in number.
CIUIC_API RougeScore rouge_l_mean(const std::vector<std::string>& targets,
                                  const std::vector<std::string>& predictions,
                                  bool use_stemmer = false);

}  // namespace ciuic::score
