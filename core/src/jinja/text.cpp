#include "jinja/text.h"

#include <string.h>

#include <algorithm>
#include <cctype>

namespace ciuic::jinja {

std::vector<size_t> cp_starts(std::string_view s) {  // byte offset of every code point, plus size
  std::vector<size_t> v;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) v.push_back(i);
  v.push_back(s.size());
  return v;
}

uint32_t decode_at(std::string_view s, size_t i, size_t* len) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *len = static_cast<size_t>(n);
  return cp;
}

bool py_isspace(uint32_t c) {  // Python's str.isspace()
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Python str.strip/lstrip/rstrip: `chars` empty = whitespace.
std::string py_strip(std::string_view s, bool left, bool right, const std::string* chars) {
  auto is_strip = [&](uint32_t cp) {
    if (!chars) return py_isspace(cp);
    std::string c;
    append_utf8(c, cp);
    return chars->find(c) != std::string::npos;
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t n;
      uint32_t cp = decode_at(s, b, &n);
      if (!is_strip(cp)) break;
      b += n;
    }
  }
  if (right) {
    while (e > b) {
      size_t k = e - 1;
      while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
      size_t n;
      uint32_t cp = decode_at(s, k, &n);
      if (!is_strip(cp)) break;
      e = k;
    }
  }
  return std::string(s.substr(b, e - b));
}

size_t cp_count(std::string_view s) {
  size_t n = 0;
  for (char ch : s) n += (static_cast<unsigned char>(ch) & 0xC0) != 0x80;
  return n;
}

size_t find_sub(std::string_view s, std::string_view x, size_t from) {
  if (from > s.size()) return std::string_view::npos;
  if (x.empty()) return from;
  const void* p = ::memmem(s.data() + from, s.size() - from, x.data(), x.size());
  return p ? static_cast<size_t>(static_cast<const char*>(p) - s.data()) : std::string_view::npos;
}

size_t rfind_sub(std::string_view s, std::string_view x) {
  if (x.size() > s.size()) return std::string_view::npos;
  if (x.empty()) return s.size();
  std::string rs(s.rbegin(), s.rend()), rx(x.rbegin(), x.rend());
  const size_t j = find_sub(rs, rx);
  return j == std::string_view::npos ? j : s.size() - j - x.size();
}

std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (!sep) {
    size_t i = 0;
    while (true) {
      while (i < s.size()) {
        size_t n;
        if (!py_isspace(decode_at(s, i, &n))) break;
        i += n;
      }
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        out.push_back(py_strip(s.substr(i), false, true, nullptr));
        break;
      }
      size_t j = i;
      while (j < s.size()) {
        size_t n;
        if (py_isspace(decode_at(s, j, &n))) break;
        j += n;
      }
      out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string& d = *sep;
  size_t i = 0;
  while (true) {
    size_t j = (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) ? std::string::npos
                                                                               : find_sub(s, d, i);
    if (j == std::string::npos) {
      out.push_back(s.substr(i));
      break;
    }
    out.push_back(s.substr(i, j - i));
    i = j + d.size();
  }
  return out;
}

// Simple case mapping: ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (Python maps all of
// Unicode; chat templates apply upper/lower/title to role names).
static uint32_t cp_case(uint32_t c, bool upper) {
  if (c < 0x80)
    return static_cast<uint32_t>(upper ? std::toupper(static_cast<int>(c))
                                       : std::tolower(static_cast<int>(c)));
  if (upper) {
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 0x20;
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
        c != 0x17F)
      return ((c >= 0x139 && c <= 0x148) || c >= 0x179) ? ((c % 2 == 0) ? c - 1 : c)
                                                        : (c % 2 == 1 ? c - 1 : c);
    if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 0x20;
    if (c >= 0x430 && c <= 0x44F) return c - 0x20;
    if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  } else {
    if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 0x20;
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 &&
        c != 0x17F)
      return ((c >= 0x139 && c <= 0x148) || c >= 0x179) ? ((c % 2 == 1) ? c + 1 : c)
                                                        : (c % 2 == 0 ? c + 1 : c);
    if (c >= 0x391 && c <= 0x3A9) return c + 0x20;
    if (c >= 0x410 && c <= 0x42F) return c + 0x20;
    if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  }
  return c;
}

std::string ascii_case(const std::string& s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n;
    uint32_t cp = decode_at(s, i, &n);
    if (n == 1 && static_cast<unsigned char>(s[i]) >= 0x80) {
      out += s[i];  // invalid UTF-8 byte: kept
    } else {
      append_utf8(out, cp_case(cp, upper));
    }
    i += n;
  }
  return out;
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char ch : s) {
    unsigned char u = static_cast<unsigned char>(ch);
    bool alpha = std::isalpha(u);
    out += static_cast<char>(alpha ? (prev_cased ? std::tolower(u) : std::toupper(u)) : u);
    prev_cased = alpha;
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::string out = ascii_case(s, false);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

}  // namespace ciuic::jinja
