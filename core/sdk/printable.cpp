// Text made safe to show (sdk/printable.h).
#include "printable.h"

namespace ciuic {

size_t utf8_sequence_length(std::string_view s, size_t i) {
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = at(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + n > s.size() || at(1) < lo || at(1) > hi) return 0;
  for (size_t k = 2; k < n; ++k)
    if (at(k) < 0x80 || at(k) > 0xBF) return 0;
  return n;
}

char32_t utf8_code_point(std::string_view s, size_t i, size_t n) {
  const auto b = [&](size_t k) {
    return static_cast<char32_t>(static_cast<unsigned char>(s[i + k]));
  };
  switch (n) {
    case 1: return b(0);
    case 2: return (b(0) & 0x1F) << 6 | (b(1) & 0x3F);
    case 3: return (b(0) & 0x0F) << 12 | (b(1) & 0x3F) << 6 | (b(2) & 0x3F);
    default: return (b(0) & 0x07) << 18 | (b(1) & 0x3F) << 12 | (b(2) & 0x3F) << 6 | (b(3) & 0x3F);
  }
}

bool shown_as_escape(char32_t c) {
  return (c >= 0x80 && c <= 0x9F) || c == 0x2028 || c == 0x2029 || (c >= 0x202A && c <= 0x202E) ||
         (c >= 0x2066 && c <= 0x2069);
}

namespace {
constexpr const char* kHex = "0123456789abcdef";
}  // namespace

std::string printable_text(std::string_view s, bool keep_lines) {
  // Fast path: most texts need nothing.
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7F) {
      ++i;
      continue;
    }
    if (keep_lines && (c == '\n' || c == '\t')) {
      ++i;
      continue;
    }
    if (c < 0x80) break;
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0 || shown_as_escape(utf8_code_point(s, i, n))) break;
    i += n;
  }
  if (i == s.size()) return std::string(s);
  std::string out(s.substr(0, i));
  out.reserve(s.size() + 16);
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    if ((c >= 0x20 && c < 0x7F) || (keep_lines && (c == '\n' || c == '\t'))) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    const size_t n = c < 0x80 ? 1 : utf8_sequence_length(s, i);
    if (n <= 1) {  // a control byte, or a byte that starts no well-formed sequence
      out += "\\x";
      out += kHex[c >> 4];
      out += kHex[c & 15];
      ++i;
      continue;
    }
    const char32_t cp = utf8_code_point(s, i, n);
    if (shown_as_escape(cp)) {
      out += "\\u";
      for (int shift = 12; shift >= 0; shift -= 4) out += kHex[(cp >> shift) & 15];
    } else {
      out.append(s, i, n);
    }
    i += n;
  }
  return out;
}

}  // namespace ciuic
