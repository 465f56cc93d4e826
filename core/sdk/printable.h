// SDK-internal (not installed): text made safe to show on a terminal, in a log line or in a TOML
// comment. Exported from libciuic_sdk for the engine (included as "sdk/printable.h"): ciuic::Error,
// ciuic::log, the app's last-resort printer and the DeepSpeed importer use the same rule.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <ciuic/export.h>

namespace ciuic {

// Length of the well-formed UTF-8 sequence starting at s[i] (RFC 3629: no overlongs, no
// surrogates, at most U+10FFFF); 0 when the bytes there are not one. Requires i < s.size().
CIUIC_API size_t utf8_sequence_length(std::string_view s, size_t i);
// The code point of the well-formed sequence of `n` = utf8_sequence_length(s, i) > 0 bytes at s[i].
CIUIC_API char32_t utf8_code_point(std::string_view s, size_t i, size_t n);
// Whether printable_text() writes the (non-ASCII) code point `cp` as \uXXXX: the C1 controls, the
// line and paragraph separators and the bidirectional controls listed below.
CIUIC_API bool shown_as_escape(char32_t cp);

// `text` with everything a terminal would act on, or a reader could not see, written visibly:
//   * control bytes (U+0000..U+001F, U+007F) as \xNN — ESC is "\x1b", NUL "\x00" (it no longer
//     ends the text), CR "\x0d" — except '\n' and '\t' when `keep_lines` (our own messages have
//     several lines; a quoted file's content is one line with its newlines escaped by its quoter);
//   * bytes that are not part of well-formed UTF-8 as \xNN;
//   * the C1 controls (U+0080..U+009F: a terminal may take U+009B as CSI), the line and paragraph
//     separators (U+2028, U+2029) and the bidirectional embedding, override and isolate controls
//     (U+202A..U+202E, U+2066..U+2069: they reorder what is shown) as \uXXXX.
// Everything else (other valid UTF-8, backslashes) is kept, so the function is idempotent and a
// clean text comes back unchanged. The result is valid UTF-8. With `keep_lines` false it holds no
// byte below 0x20: it fits in one line of a terminal, a log line or a TOML comment. Thread-safe.
CIUIC_API std::string printable_text(std::string_view text, bool keep_lines = true);

}  // namespace ciuic
