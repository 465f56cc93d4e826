// UTF-8 and Python str helpers of the Jinja engine (jinja.h): code points, str.strip/split, the
// case mapping chat templates need, and linear-time substring search. Pure functions of their
// arguments; no budget is charged here (the callers charge what they scan or make).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ciuic::jinja {

// Byte offset of every code point of `s`, then s.size() (a continuation byte never starts one).
std::vector<size_t> cp_starts(std::string_view s);
// Number of code points (bytes that are not UTF-8 continuation bytes).
size_t cp_count(std::string_view s);
// The code point at s[i] and its length in *len (an ill-formed byte is one code point).
uint32_t decode_at(std::string_view s, size_t i, size_t* len);
// Appends the UTF-8 bytes of `cp` (also the tokenizer's: tokenizer/utf8.h).
inline void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | ((cp >> 18) & 0x07));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

bool py_isspace(uint32_t c);  // Python's str.isspace() for one code point
// str.strip/lstrip/rstrip: `chars` null = whitespace.
std::string py_strip(std::string_view s, bool left, bool right, const std::string* chars);
// str.split(sep, maxsplit): sep null = runs of whitespace; maxsplit < 0 = no limit. sep is not
// empty.
std::vector<std::string> py_split(const std::string& s, const std::string* sep, int64_t maxsplit);
// Simple case mapping (ASCII, Latin-1, Latin Extended-A, Greek, Cyrillic); invalid bytes kept.
std::string ascii_case(const std::string& s, bool upper);
std::string py_title(const std::string& s);
std::string py_capitalize(const std::string& s);

// First (last) occurrence of `x` in `s` at or after `from` (glibc's two-way memmem: linear, so a
// template cannot make a search quadratic), npos when none.
size_t find_sub(std::string_view s, std::string_view x, size_t from = 0);
size_t rfind_sub(std::string_view s, std::string_view x);

}  // namespace ciuic::jinja
