// NLTK's Porter stemmer, NLTK_EXTENSIONS mode (score/porter.h). The rule tables and their order
// are the algorithm's (Porter 1980) with NLTK's departures marked.
#include "score/porter.h"

#include <functional>
#include <string_view>
#include <utility>
#include <vector>

namespace ciuic::score {

namespace {

bool is_vowel(char c) { return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u'; }

// Consonant flags: a 'y' is a consonant at the start or after a vowel.
std::vector<bool> consonants(std::string_view w) {
  std::vector<bool> f(w.size());
  for (size_t i = 0; i < w.size(); ++i)
    f[i] = is_vowel(w[i]) ? false : w[i] == 'y' ? (i == 0 || !f[i - 1]) : true;
  return f;
}

bool consonant(std::string_view w, size_t i) { return consonants(w.substr(0, i + 1))[i]; }

// m of [C](VC){m}[V]: the number of vowel-to-consonant changes.
int measure(std::string_view stem) {
  const auto f = consonants(stem);
  int m = 0;
  for (size_t i = 1; i < f.size(); ++i) m += !f[i - 1] && f[i];
  return m;
}

bool contains_vowel(std::string_view stem) {
  for (bool c : consonants(stem))
    if (!c) return true;
  return false;
}

bool ends_double_consonant(std::string_view w) {
  return w.size() >= 2 && w[w.size() - 1] == w[w.size() - 2] && consonant(w, w.size() - 1);
}

// *o: ends consonant-vowel-consonant, the last not w, x or y; NLTK: also a two-letter
// vowel-consonant word.
bool ends_cvc(std::string_view w) {
  const size_t n = w.size();
  if (n >= 3 && consonant(w, n - 3) && !consonant(w, n - 2) && consonant(w, n - 1) &&
      w[n - 1] != 'w' && w[n - 1] != 'x' && w[n - 1] != 'y')
    return true;
  return n == 2 && !consonant(w, 0) && consonant(w, 1);
}

bool ends_with(std::string_view w, std::string_view s) {
  return w.size() >= s.size() && w.substr(w.size() - s.size()) == s;
}

struct Rule {
  std::string_view suffix, replacement;
  std::function<bool(std::string_view stem)> condition;  // empty = always
};

// The first rule whose suffix ends the word decides: its replacement when its condition holds,
// else the word unchanged (no later rule is tried).
std::string apply(const std::string& w, const std::vector<Rule>& rules) {
  for (const Rule& r : rules) {
    if (!ends_with(w, r.suffix)) continue;
    const std::string stem = w.substr(0, w.size() - r.suffix.size());
    if (!r.condition || r.condition(stem)) return stem + std::string(r.replacement);
    return w;
  }
  return w;
}

bool m_positive(std::string_view s) { return measure(s) > 0; }
bool m_above_1(std::string_view s) { return measure(s) > 1; }

std::string step1a(const std::string& w) {
  if (ends_with(w, "ies") && w.size() == 4) return w.substr(0, 1) + "ie";  // NLTK
  return apply(w, {{"sses", "ss", {}}, {"ies", "i", {}}, {"ss", "ss", {}}, {"s", "", {}}});
}

std::string step1b(const std::string& w) {
  if (ends_with(w, "ied")) return w.substr(0, w.size() - 3) + (w.size() == 4 ? "ie" : "i");  // NLTK
  if (ends_with(w, "eed")) {
    const std::string stem = w.substr(0, w.size() - 3);
    return measure(stem) > 0 ? stem + "ee" : w;
  }
  std::string mid;
  bool cut = false;
  for (std::string_view suffix : {std::string_view("ed"), std::string_view("ing")})
    if (ends_with(w, suffix)) {
      mid = w.substr(0, w.size() - suffix.size());
      if (contains_vowel(mid)) {
        cut = true;
        break;
      }
    }
  if (!cut) return w;
  if (ends_with(mid, "at")) return mid + "e";
  if (ends_with(mid, "bl")) return mid + "e";
  if (ends_with(mid, "iz")) return mid + "e";
  if (ends_double_consonant(mid)) {
    const char last = mid.back();
    return last != 'l' && last != 's' && last != 'z' ? mid.substr(0, mid.size() - 1) : mid;
  }
  return measure(mid) == 1 && ends_cvc(mid) ? mid + "e" : mid;
}

std::string step1c(const std::string& w) {
  // NLTK: y -> i after a consonant that is not the word's first letter.
  return apply(
      w,
      {{"y", "i", [](std::string_view s) { return s.size() > 1 && consonant(s, s.size() - 1); }}});
}

std::string step2(const std::string& w) {
  if (ends_with(w, "alli") && m_positive(std::string_view(w).substr(0, w.size() - 4)))  // NLTK
    return step2(w.substr(0, w.size() - 4) + "al");
  const std::string_view word = w;
  return apply(w, {{"ational", "ate", m_positive},
                   {"tional", "tion", m_positive},
                   {"enci", "ence", m_positive},
                   {"anci", "ance", m_positive},
                   {"izer", "ize", m_positive},
                   {"bli", "ble", m_positive},
                   {"alli", "al", m_positive},
                   {"entli", "ent", m_positive},
                   {"eli", "e", m_positive},
                   {"ousli", "ous", m_positive},
                   {"ization", "ize", m_positive},
                   {"ation", "ate", m_positive},
                   {"ator", "ate", m_positive},
                   {"alism", "al", m_positive},
                   {"iveness", "ive", m_positive},
                   {"fulness", "ful", m_positive},
                   {"ousness", "ous", m_positive},
                   {"aliti", "al", m_positive},
                   {"iviti", "ive", m_positive},
                   {"biliti", "ble", m_positive},
                   {"fulli", "ful", m_positive},
                   {"logi", "log", [word](std::string_view) {
                      return m_positive(word.substr(0, word.size() - 3));
                    }}});
}

std::string step3(const std::string& w) {
  return apply(w, {{"icate", "ic", m_positive},
                   {"ative", "", m_positive},
                   {"alize", "al", m_positive},
                   {"iciti", "ic", m_positive},
                   {"ical", "ic", m_positive},
                   {"ful", "", m_positive},
                   {"ness", "", m_positive}});
}

std::string step4(const std::string& w) {
  return apply(
      w, {{"al", "", m_above_1},
          {"ance", "", m_above_1},
          {"ence", "", m_above_1},
          {"er", "", m_above_1},
          {"ic", "", m_above_1},
          {"able", "", m_above_1},
          {"ible", "", m_above_1},
          {"ant", "", m_above_1},
          {"ement", "", m_above_1},
          {"ment", "", m_above_1},
          {"ent", "", m_above_1},
          {"ion", "",
           [](std::string_view s) { return m_above_1(s) && (s.back() == 's' || s.back() == 't'); }},
          {"ou", "", m_above_1},
          {"ism", "", m_above_1},
          {"ate", "", m_above_1},
          {"iti", "", m_above_1},
          {"ous", "", m_above_1},
          {"ive", "", m_above_1},
          {"ize", "", m_above_1}});
}

std::string step5a(const std::string& w) {
  if (!ends_with(w, "e")) return w;
  const std::string stem = w.substr(0, w.size() - 1);
  const int m = measure(stem);
  return m > 1 || (m == 1 && !ends_cvc(stem)) ? stem : w;
}

std::string step5b(const std::string& w) {
  return ends_with(w, "ll") && measure(std::string_view(w).substr(0, w.size() - 1)) > 1
             ? w.substr(0, w.size() - 1)
             : w;
}

}  // namespace

std::string porter_stem(std::string w) {
  // NLTK's irregular forms, then: words of at most two letters are kept.
  static const std::pair<std::string_view, std::string_view> kPool[] = {
      {"sky", "sky"},        {"skies", "sky"},        {"dying", "die"},
      {"lying", "lie"},      {"tying", "tie"},        {"news", "news"},
      {"innings", "inning"}, {"inning", "inning"},    {"outings", "outing"},
      {"outing", "outing"},  {"cannings", "canning"}, {"canning", "canning"},
      {"howe", "howe"},      {"proceed", "proceed"},  {"exceed", "exceed"},
      {"succeed", "succeed"}};
  for (const auto& [form, stem] : kPool)
    if (w == form) return std::string(stem);
  if (w.size() <= 2) return w;
  return step5b(step5a(step4(step3(step2(step1c(step1b(step1a(w))))))));
}

}  // namespace ciuic::score
