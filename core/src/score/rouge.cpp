// ROUGE-L as rouge-score computes it (score/rouge.h).
#include "score/rouge.h"

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <unordered_map>

#include "score/porter.h"
#include "score/unicode.h"

namespace ciuic::score {

std::vector<std::string> rouge_tokenize(std::string_view text, bool use_stemmer) {
  std::vector<std::string> out;
  std::string cur;
  auto cut = [&] {
    if (cur.empty()) return;
    out.push_back(use_stemmer && cur.size() > 3 ? porter_stem(std::move(cur)) : std::move(cur));
    cur.clear();
  };
  for (char32_t c : decode_utf8(text)) {
    // str.lower() then [^a-z0-9]+ -> " ": only these code points lowercase to an ASCII letter or
    // digit (checked over all of Unicode by tests/score/gen_score_fixtures.py).
    if ((c >= U'a' && c <= U'z') || (c >= U'0' && c <= U'9'))
      cur += static_cast<char>(c);
    else if (c >= U'A' && c <= U'Z')
      cur += static_cast<char>(c - U'A' + U'a');
    else if (c == 0x212A)
      cur += 'k';  // KELVIN SIGN -> "k"
    else if (c == 0x130)
      cur += 'i', cut();  // LATIN CAPITAL I WITH DOT ABOVE -> "i" U+0307
    else
      cut();
  }
  cut();
  return out;
}

RougeScore rouge_l(std::string_view target, std::string_view prediction, bool use_stemmer) {
  const auto t = rouge_tokenize(target, use_stemmer), p = rouge_tokenize(prediction, use_stemmer);
  RougeScore r;
  if (t.empty() || p.empty()) return r;
  // Tokens as ids, then the LCS length with two rows of the table.
  std::unordered_map<std::string, int32_t> id;
  auto ids = [&](const std::vector<std::string>& v) {
    std::vector<int32_t> o;
    for (const auto& w : v)
      o.push_back(id.emplace(w, static_cast<int32_t>(id.size())).first->second);
    return o;
  };
  const auto a = ids(t), b = ids(p);
  std::vector<int64_t> prev(b.size() + 1, 0), row(b.size() + 1, 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j)
      row[j] = a[i - 1] == b[j - 1] ? prev[j - 1] + 1 : std::max(prev[j], row[j - 1]);
    std::swap(prev, row);
  }
  const double lcs = static_cast<double>(prev[b.size()]);
  r.precision = lcs / static_cast<double>(p.size());
  r.recall = lcs / static_cast<double>(t.size());
  // rouge_score.scoring.fmeasure, operation for operation.
  r.fmeasure =
      r.precision + r.recall > 0 ? 2 * r.precision * r.recall / (r.precision + r.recall) : 0.0;
  return r;
}

RougeScore rouge_l_mean(const std::vector<std::string>& targets,
                        const std::vector<std::string>& predictions, bool use_stemmer) {
  if (targets.size() != predictions.size())
    throw std::invalid_argument("ROUGE-L: " + std::to_string(targets.size()) + " targets but " +
                                std::to_string(predictions.size()) + " predictions");
  RougeScore m;
  if (targets.empty()) return m;
  for (size_t i = 0; i < targets.size(); ++i) {
    const RougeScore s = rouge_l(targets[i], predictions[i], use_stemmer);
    m.precision += s.precision, m.recall += s.recall, m.fmeasure += s.fmeasure;
  }
  const double n = static_cast<double>(targets.size());
  m.precision /= n, m.recall /= n, m.fmeasure /= n;
  return m;
}

}  // namespace ciuic::score
