// tokenizer/utf8.h — the few UTF-8 routines the tokenizer needs (header-only, no tables).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "jinja/text.h"

namespace ciuic::tok::utf8 {

// Length of the valid UTF-8 sequence starting at s[i] (1..4), or 0 if the bytes there are not
// a complete well-formed sequence (overlong forms, surrogates and code points > U+10FFFF are
// ill-formed). `*prefix` receives the length of the longest prefix that could still start a
// valid sequence (the "maximal subpart" of Unicode §3.9, at least 1), used for U+FFFD
// replacement exactly as Rust's String::from_utf8_lossy does it.
inline size_t sequence_length(std::string_view s, size_t i, size_t* prefix = nullptr) {
  auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char c = at(i);
  if (prefix) *prefix = 1;
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  size_t k = 1;
  for (; k < need; ++k) {
    if (i + k >= s.size()) break;
    unsigned char b = at(i + k);
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) break;
  }
  if (prefix) *prefix = k;
  return k == need ? need : 0;
}

// Offset of the first byte that is not part of well-formed UTF-8, or npos.
inline size_t find_invalid(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    // ASCII fast path, 8 bytes at a time.
    while (i + 8 <= s.size()) {
      uint64_t w;
      __builtin_memcpy(&w, s.data() + i, 8);
      if (w & 0x8080808080808080ULL) break;
      i += 8;
    }
    if (i >= s.size()) break;
    size_t n = sequence_length(s, i);
    if (n == 0) return i;
    i += n;
  }
  return std::string_view::npos;
}

// `bytes` as UTF-8 with every ill-formed maximal subpart replaced by U+FFFD (Rust's
// String::from_utf8_lossy, which HF's ByteLevel decoder uses).
inline std::string lossy(std::string_view bytes) {
  if (find_invalid(bytes) == std::string_view::npos) return std::string(bytes);
  std::string out;
  out.reserve(bytes.size() + 8);
  size_t i = 0;
  while (i < bytes.size()) {
    size_t prefix = 1;
    size_t n = sequence_length(bytes, i, &prefix);
    if (n) {
      out.append(bytes.substr(i, n));
      i += n;
    } else {
      out += "\xEF\xBF\xBD";
      i += prefix;
    }
  }
  return out;
}

// s[i] starts a complete well-formed sequence.
inline bool valid_at(std::string_view s, size_t i) {
  return i < s.size() && sequence_length(s, i) != 0;
}

// Decodes the code point at s[i] (s valid UTF-8); advances *len.
inline uint32_t decode(std::string_view s, size_t i, size_t* len) {
  auto at = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[k])); };
  uint32_t c = at(i);
  if (c < 0x80) {
    *len = 1;
    return c;
  }
  if (c < 0xE0) {
    *len = 2;
    return ((c & 0x1F) << 6) | (at(i + 1) & 0x3F);
  }
  if (c < 0xF0) {
    *len = 3;
    return ((c & 0x0F) << 12) | ((at(i + 1) & 0x3F) << 6) | (at(i + 2) & 0x3F);
  }
  *len = 4;
  return ((c & 0x07) << 18) | ((at(i + 1) & 0x3F) << 12) | ((at(i + 2) & 0x3F) << 6) |
         (at(i + 3) & 0x3F);
}

inline void append(std::string& out, uint32_t cp) { jinja::append_utf8(out, cp); }

// Rust's char::is_whitespace (the Unicode White_Space property), used by HF for added tokens'
// lstrip / rstrip.
inline bool is_white_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

}  // namespace ciuic::tok::utf8
