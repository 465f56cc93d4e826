// Python str semantics on UTF-8 (score/unicode.h).
#include "score/unicode.h"

#include <cstdint>

namespace ciuic::score {

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char b = p[i];
    if (b < 0x80) {
      out.push_back(b);
      ++i;
      continue;
    }
    // Length and the allowed range of the second byte (Unicode table 3-7: no overlongs, no
    // surrogates, nothing above U+10FFFF); a lead byte outside C2..F4 is invalid on its own.
    int len = 0;
    unsigned char lo = 0x80, hi = 0xBF;
    char32_t c = 0;
    if (b >= 0xC2 && b <= 0xDF)
      len = 2, c = b & 0x1F;
    else if (b >= 0xE0 && b <= 0xEF)
      len = 3, c = b & 0x0F, lo = b == 0xE0 ? 0xA0 : 0x80, hi = b == 0xED ? 0x9F : 0xBF;
    else if (b >= 0xF0 && b <= 0xF4)
      len = 4, c = b & 0x07, lo = b == 0xF0 ? 0x90 : 0x80, hi = b == 0xF4 ? 0x8F : 0xBF;
    if (len == 0) {
      out.push_back(0xFFFD);
      ++i;
      continue;
    }
    // A maximal subpart: the bytes that could still begin a valid sequence become one U+FFFD.
    size_t j = i + 1;
    bool ok = true;
    for (int k = 1; k < len; ++k, ++j) {
      const unsigned char lo_k = k == 1 ? lo : 0x80, hi_k = k == 1 ? hi : 0xBF;
      if (j >= n || p[j] < lo_k || p[j] > hi_k) {
        ok = false;
        break;
      }
      c = (c << 6) | (p[j] & 0x3F);
    }
    out.push_back(ok ? c : 0xFFFD);
    i = j;
  }
  return out;
}

void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out.push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (c >> 6)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (c >> 12)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (c >> 18)));
    out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

bool is_python_space(char32_t c) {
  if (c <= 0x20) return c == 0x20 || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F);
  if (c < 0x85) return false;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

std::vector<std::u32string> split_python(std::u32string_view s) {
  std::vector<std::u32string> out;
  size_t i = 0;
  while (i < s.size()) {
    while (i < s.size() && is_python_space(s[i])) ++i;
    const size_t b = i;
    while (i < s.size() && !is_python_space(s[i])) ++i;
    if (i > b) out.emplace_back(s.substr(b, i - b));
  }
  return out;
}

std::u32string_view rstrip_python(std::u32string_view s) {
  size_t e = s.size();
  while (e > 0 && is_python_space(s[e - 1])) --e;
  return s.substr(0, e);
}

std::u32string_view strip_python(std::u32string_view s) {
  s = rstrip_python(s);
  size_t b = 0;
  while (b < s.size() && is_python_space(s[b])) ++b;
  return s.substr(b);
}

}  // namespace ciuic::score
