#include "base/text.h"

#include <algorithm>
#include <cctype>
#include <cstdio>

namespace ciuic::text {

size_t edit_distance(std::string_view a, std::string_view b) {
  const size_t n = a.size(), m = b.size();
  // Three rolling rows: i-2, i-1, i.
  std::vector<size_t> pp(m + 1), p(m + 1), c(m + 1);
  for (size_t j = 0; j <= m; ++j) p[j] = j;
  for (size_t i = 1; i <= n; ++i) {
    c[0] = i;
    for (size_t j = 1; j <= m; ++j) {
      const size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
      c[j] = std::min({p[j] + 1, c[j - 1] + 1, p[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1])
        c[j] = std::min(c[j], pp[j - 2] + 1);
    }
    std::swap(pp, p);
    std::swap(p, c);
  }
  return p[m];
}

namespace {
std::string lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}
}  // namespace

std::string closest(std::string_view word, const std::vector<std::string>& candidates) {
  const size_t limit = std::max<size_t>(1, word.size() / 3);
  const std::string lw = lower(word);
  std::string best;
  size_t best_d = limit + 1;
  for (const auto& c : candidates) {
    size_t d = edit_distance(word, c);
    if (d > 0 && lower(c) == lw) d = 1;  // case-only difference: always a plausible typo
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  return best;
}

std::string join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i];
  }
  return out;
}

std::vector<std::string> split(std::string_view s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    size_t pos = s.find(sep, start);
    out.emplace_back(s.substr(start, pos == std::string_view::npos ? s.npos : pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return out;
}

}  // namespace ciuic::text
