// score/bleu.h — corpus BLEU, the numbers of sacrebleu's `BLEU().corpus_score` (sacrebleu 2.x).
//
// sacrebleu's defaults: n-grams of order 1..4, the "exp" smoothing (mteval-v13a's: the k-th order
// without a match counts 1 / (2^k * total)), no effective order, case kept, brevity penalty
// against the closest reference length (the shorter on a tie), reference n-gram counts merged
// by max over a segment's references. Tokenizers: "13a" (sacrebleu's default, mteval-v13a:
// <skipped>, "-\n" and the four HTML entities, then punctuation split off, "." and "," kept
// inside numbers, "-" split after a digit), "zh" (sacrebleu's tokenizer_zh: each character of
// its ranges on its own, then the 13a punctuation rules — the ranges as sacrebleu's code
// really has them, e.g. U+2001..U+2A6D where it meant U+20000..U+2A6D6; docs/metrics.md) and
// "none" (split on white space). Each segment is rstripped first, as sacrebleu does.
// Not offered: lowercase, the other smoothings, other orders, the intl/char/mecab/spm
// tokenizers.
//
//   std::vector<std::string> hyps = {"The cat sat.", ...};
//   std::vector<std::vector<std::string>> refs = {{"The cat sat on the mat."}, ...};  // per
//   segment BleuScore s = corpus_bleu(hyps, refs, BleuTokenize::k13a);   // s.score in 0..100
//
// Statistics are additive (BleuStats::add), so ranks that each score a share of the segments
// sum their statistics and compute one score (bleu_from_stats), equal to one process's.
// Text is UTF-8 (invalid bytes read as U+FFFD, score/unicode.h).
// Threading: pure functions, reentrant. Failure: corpus_bleu throws std::invalid_argument when
// hypotheses and references differ in number or a segment has no reference.
#pragma once

#include <ciuic/export.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ciuic::score {

enum class BleuTokenize { k13a, kZh, kNone };

// "13a" | "zh" | "none" -> the tokenizer; nullopt for any other name.
CIUIC_API std::optional<BleuTokenize> bleu_tokenize_from_name(std::string_view name);
CIUIC_API const char* bleu_tokenize_name(BleuTokenize t);

// One segment as BLEU sees it: rstripped and tokenized, the tokens joined by one space (what
// sacrebleu's tokenizer returns).
CIUIC_API std::string bleu_tokenize(std::string_view text, BleuTokenize t);

constexpr int kBleuMaxOrder = 4;

struct BleuStats {
  int64_t sys_len = 0, ref_len = 0;
  std::array<int64_t, kBleuMaxOrder> correct{}, total{};
  CIUIC_API void add(const BleuStats& o);
};

struct BleuScore {
  double score = 0;                                // 0..100, sacrebleu's BLEUScore.score
  double bp = 0;                                   // brevity penalty
  std::array<double, kBleuMaxOrder> precisions{};  // percent, smoothed as sacrebleu's
  BleuStats stats;
};

// One segment's statistics against its references (at least one).
CIUIC_API BleuStats bleu_segment(std::string_view hypothesis,
                                 const std::vector<std::string>& references, BleuTokenize t);
// The score of summed statistics (sacrebleu's BLEU.compute_bleu with smooth_method "exp").
CIUIC_API BleuScore bleu_from_stats(const BleuStats& s);
// references[i]: the references of hypotheses[i].
CIUIC_API BleuScore corpus_bleu(const std::vector<std::string>& hypotheses,
                                const std::vector<std::vector<std::string>>& references,
                                BleuTokenize t);

}  // namespace ciuic::score
