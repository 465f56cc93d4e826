// score/unicode.h — the bits of Python's str semantics the text metrics need (no LibTorch).
//
// sacrebleu and rouge-score work on Python strings (code points), split on str.isspace() and
// lowercase with str.lower(); these helpers do the same on UTF-8 text, so that the metrics of
// score/ give their numbers. Invalid UTF-8 is read as U+FFFD, one per maximal invalid subpart,
// as Python's bytes.decode("utf-8", errors="replace") does.
//
// Threading: pure functions, reentrant. Failure: none (every byte string decodes).
#pragma once

#include <ciuic/export.h>

#include <string>
#include <string_view>
#include <vector>

namespace ciuic::score {

CIUIC_API std::u32string decode_utf8(std::string_view s);
CIUIC_API void append_utf8(std::string& out, char32_t c);
CIUIC_API std::string encode_utf8(std::u32string_view s);

// Python's str.isspace() for one code point (Unicode White_Space as CPython defines it: bidi
// classes WS, B, S and category Zs).
CIUIC_API bool is_python_space(char32_t c);

// Python's str.split() with no argument: runs of white space separate, none at either end.
CIUIC_API std::vector<std::u32string> split_python(std::u32string_view s);
// Python's str.strip() / str.rstrip() with no argument.
CIUIC_API std::u32string_view strip_python(std::u32string_view s);
CIUIC_API std::u32string_view rstrip_python(std::u32string_view s);

}  // namespace ciuic::score
