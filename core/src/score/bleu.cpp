// Corpus BLEU as sacrebleu computes it (score/bleu.h).
#include "score/bleu.h"

#include <cmath>
#include <cstdlib>
#include <stdexcept>
#include <unordered_map>

#include "score/unicode.h"

namespace ciuic::score {

namespace {

bool is_digit(char32_t c) { return c >= U'0' && c <= U'9'; }

// sacrebleu's TokenizerRegexp, rule by rule. Each rule is a one- or two-character pattern that
// re.sub applies left to right without overlaps: a match consumes both characters.
std::u32string regexp_rules(std::u32string s) {
  std::u32string o;
  o.reserve(s.size() * 2);
  // 1. ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> " \1 "
  for (char32_t c : s) {
    const bool p = (c >= U'{' && c <= U'~') || (c >= U'[' && c <= U'`') ||
                   (c >= U' ' && c <= U'&') || (c >= U'(' && c <= U'+') ||
                   (c >= U':' && c <= U'@') || c == U'/';
    if (p)
      o += U' ', o += c, o += U' ';
    else
      o += c;
  }
  auto pairs = [](const std::u32string& in, auto match, auto emit) {
    std::u32string out;
    out.reserve(in.size() + in.size() / 2);
    size_t i = 0;
    while (i < in.size()) {
      if (i + 1 < in.size() && match(in[i], in[i + 1])) {
        emit(out, in[i], in[i + 1]);
        i += 2;
      } else {
        out += in[i++];
      }
    }
    return out;
  };
  const auto dot = [](char32_t c) { return c == U'.' || c == U','; };
  // 2. ([^0-9])([\.,]) -> "\1 \2 "
  s = pairs(
      o, [&](char32_t a, char32_t b) { return !is_digit(a) && dot(b); },
      [](std::u32string& out, char32_t a, char32_t b) {
        out += a, out += U' ', out += b, out += U' ';
      });
  // 3. ([\.,])([^0-9]) -> " \1 \2"
  s = pairs(
      s, [&](char32_t a, char32_t b) { return dot(a) && !is_digit(b); },
      [](std::u32string& out, char32_t a, char32_t b) {
        out += U' ', out += a, out += U' ', out += b;
      });
  // 4. ([0-9])(-) -> "\1 \2 "
  s = pairs(
      s, [&](char32_t a, char32_t b) { return is_digit(a) && b == U'-'; },
      [](std::u32string& out, char32_t a, char32_t b) {
        out += a, out += U' ', out += b, out += U' ';
      });
  return s;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  std::string out;
  size_t i = 0;
  for (size_t at; (at = s.find(from, i)) != std::string::npos; i = at + from.size()) {
    out.append(s, i, at - i);
    out.append(to);
  }
  if (i == 0) return;
  out.append(s, i, std::string::npos);
  s = std::move(out);
}

// sacrebleu's tokenizer_zh ranges as its code tests them: it compares one character with
// strings such as '\u20000' (two characters, U+2000 and '0'), which makes U+2001..U+2A6D and
// U+2F81..U+2FA1 of the supplementary ranges it meant. Overlapping ranges merged.
bool is_zh_char(char32_t c) {
  static constexpr char32_t kRanges[][2] = {
      {0x2001, 0x2A6D}, {0x2E80, 0x2FDF}, {0x2FF0, 0x303F}, {0x3100, 0x312F}, {0x31A0, 0x31EF},
      {0x3200, 0x4DB5}, {0x4E00, 0x9FBB}, {0xF900, 0xFA2D}, {0xFA30, 0xFA6A}, {0xFA70, 0xFAD9},
      {0xFE10, 0xFE1F}, {0xFE30, 0xFE4F}, {0xFF00, 0xFFEF}};
  for (const auto& r : kRanges)
    if (c >= r[0] && c <= r[1]) return true;
  return false;
}

std::vector<std::u32string> tokens_of(std::string_view text, BleuTokenize t) {
  const std::u32string all = decode_utf8(text);
  const std::u32string_view line = rstrip_python(all);
  switch (t) {
    case BleuTokenize::kNone: return split_python(line);
    case BleuTokenize::k13a: {
      std::string s = encode_utf8(line);
      replace_all(s, "<skipped>", "");
      replace_all(s, "-\n", "");
      replace_all(s, "\n", " ");
      if (s.find('&') != std::string::npos) {
        replace_all(s, "&quot;", "\"");
        replace_all(s, "&amp;", "&");
        replace_all(s, "&lt;", "<");
        replace_all(s, "&gt;", ">");
      }
      return split_python(regexp_rules(U" " + decode_utf8(s) + U" "));
    }
    case BleuTokenize::kZh: {
      std::u32string s;
      for (char32_t c : strip_python(line)) {
        if (is_zh_char(c))
          s += U' ', s += c, s += U' ';
        else
          s += c;
      }
      return split_python(regexp_rules(std::move(s)));
    }
  }
  return {};
}

// All n-grams of order 1..4 as their tokens joined by ' ' (tokens hold no white space).
using NgramCounts = std::unordered_map<std::string, int64_t>;

NgramCounts ngrams(const std::vector<std::string>& tok) {
  NgramCounts c;
  for (size_t i = 0; i < tok.size(); ++i) {
    std::string g;
    for (size_t n = 0; n < static_cast<size_t>(kBleuMaxOrder) && i + n < tok.size(); ++n) {
      if (n) g += ' ';
      g += tok[i + n];
      // The order rides in front so that equal strings of different orders cannot meet.
      ++c[std::string(1, static_cast<char>('0' + n)) + g];
    }
  }
  return c;
}

std::vector<std::string> encoded_tokens(std::string_view text, BleuTokenize t) {
  std::vector<std::string> out;
  for (const auto& w : tokens_of(text, t)) out.push_back(encode_utf8(w));
  return out;
}

}  // namespace

std::optional<BleuTokenize> bleu_tokenize_from_name(std::string_view name) {
  if (name == "13a") return BleuTokenize::k13a;
  if (name == "zh") return BleuTokenize::kZh;
  if (name == "none") return BleuTokenize::kNone;
  return std::nullopt;
}

const char* bleu_tokenize_name(BleuTokenize t) {
  switch (t) {
    case BleuTokenize::k13a: return "13a";
    case BleuTokenize::kZh: return "zh";
    case BleuTokenize::kNone: return "none";
  }
  return "?";
}

std::string bleu_tokenize(std::string_view text, BleuTokenize t) {
  std::string out;
  for (const auto& w : encoded_tokens(text, t)) {
    if (!out.empty()) out += ' ';
    out += w;
  }
  return out;
}

void BleuStats::add(const BleuStats& o) {
  sys_len += o.sys_len;
  ref_len += o.ref_len;
  for (int n = 0; n < kBleuMaxOrder; ++n) correct[n] += o.correct[n], total[n] += o.total[n];
}

BleuStats bleu_segment(std::string_view hypothesis, const std::vector<std::string>& references,
                       BleuTokenize t) {
  if (references.empty()) throw std::invalid_argument("BLEU: a segment without a reference");
  NgramCounts ref;
  std::vector<int64_t> ref_lens;
  for (const std::string& r : references) {
    const auto tok = encoded_tokens(r, t);
    ref_lens.push_back(static_cast<int64_t>(tok.size()));
    for (const auto& [g, n] : ngrams(tok)) ref[g] = std::max(ref[g], n);
  }
  const auto hyp_tok = encoded_tokens(hypothesis, t);
  BleuStats s;
  s.sys_len = static_cast<int64_t>(hyp_tok.size());
  // The closest reference length; the shorter one on a tie.
  int64_t best_diff = -1;
  for (int64_t len : ref_lens) {
    const int64_t d = std::llabs(s.sys_len - len);
    if (best_diff < 0 || d < best_diff)
      best_diff = d, s.ref_len = len;
    else if (d == best_diff && len < s.ref_len)
      s.ref_len = len;
  }
  for (const auto& [g, n] : ngrams(hyp_tok)) {
    const int order = g[0] - '0';
    s.total[order] += n;
    if (auto it = ref.find(g); it != ref.end()) s.correct[order] += std::min(n, it->second);
  }
  return s;
}

BleuScore bleu_from_stats(const BleuStats& s) {
  // The same operations in the same order as sacrebleu's compute_bleu, so the doubles agree.
  BleuScore r;
  r.stats = s;
  r.bp = 1.0;
  if (s.sys_len < s.ref_len)
    r.bp = s.sys_len > 0
               ? std::exp(1 - static_cast<double>(s.ref_len) / static_cast<double>(s.sys_len))
               : 0.0;
  bool any = false;
  for (int64_t c : s.correct) any = any || c != 0;
  if (!any) return r;  // score 0, precisions 0 (sacrebleu's early stop)
  double smooth = 1.0;
  for (int n = 0; n < kBleuMaxOrder; ++n) {
    if (s.total[n] == 0) break;
    if (s.correct[n] == 0) {
      smooth *= 2;
      r.precisions[n] = 100. / (smooth * static_cast<double>(s.total[n]));
    } else {
      r.precisions[n] = 100. * static_cast<double>(s.correct[n]) / static_cast<double>(s.total[n]);
    }
  }
  double sum = 0;
  for (double p : r.precisions)
    sum += p == 0.0 ? -9999999999.0 : std::log(p);  // sacrebleu's my_log
  r.score = r.bp * std::exp(sum / kBleuMaxOrder);
  return r;
}

BleuScore corpus_bleu(const std::vector<std::string>& hypotheses,
                      const std::vector<std::vector<std::string>>& references, BleuTokenize t) {
  if (hypotheses.size() != references.size())
    throw std::invalid_argument("BLEU: " + std::to_string(hypotheses.size()) + " hypotheses but " +
                                std::to_string(references.size()) + " reference lists");
  BleuStats all;
  for (size_t i = 0; i < hypotheses.size(); ++i)
    all.add(bleu_segment(hypotheses[i], references[i], t));
  return bleu_from_stats(all);
}

}  // namespace ciuic::score
