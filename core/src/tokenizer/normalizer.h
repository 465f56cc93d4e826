// tokenizer/normalizer.h — the "normalizer" of an HF tokenizer.json.
//
// Supported, with HF `tokenizers`' semantics: NFC, NFD, NFKC, NFKD (ICU's Normalizer2, Debian's
// libicu: no hand-written tables), Lowercase (per character, full Unicode lowercase mapping as
// Rust's char::to_lowercase: ICU's simple mapping plus U+0130 -> "i\u0307", the one unconditional
// multi-character lowercase), Strip (Unicode White_Space on the left / right), Prepend (only to a
// non-empty string), Replace (a {"String": ...} literal or an Oniguruma {"Regex": ...}, every
// non-overlapping match left to right, as HF's NormalizedString::replace), and Sequence of these.
// Anything else (BertNormalizer, Precompiled, StripAccents, ByteLevel, Nmt, ...) is refused at
// construction with its JSON path.
//
// HF normalizes every stretch of text between added tokens that are matched on the raw text
// (normalized: false) separately; the caller does the same. Offsets are not tracked.
//
// Threading: immutable after construction; normalize() may be called from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <ciuic/export.h>

#include "tokenizer/regex.h"

namespace ciuic::tok {

class CIUIC_API Normalizer {
 public:
  // Parses `j` (the value of "normalizer"; null = identity). `origin` names the file, `path` the
  // JSON path; errors are ciuic::Error "<origin>: <path>/...: <what>".
  Normalizer(const nlohmann::json& j, const std::string& origin, const std::string& path);
  ~Normalizer();
  Normalizer(const Normalizer&) = delete;
  Normalizer& operator=(const Normalizer&) = delete;

  bool identity() const { return ops_.empty(); }

  // The normalized form of `in` (valid UTF-8). Returns `in` itself when no step changes it, else
  // a view of `a` or `b` (two caller-owned buffers, reused between calls).
  std::string_view normalize(std::string_view in, std::string& a, std::string& b,
                             MatchScratch& scratch) const;
  // Convenience: the normalized text as a string.
  std::string normalize(std::string_view in) const;

  // [start, end) byte spans of the input, one per output byte.
  using Alignment = std::vector<std::pair<uint32_t, uint32_t>>;
  // normalize(), also giving for every byte of the result the input bytes it comes from: a
  // character produced by a normalizer maps to the character(s) it replaces (Prepend's prefix to
  // the first character, as HF aligns it). For token offsets (chat masks); slower than normalize().
  std::string normalize_aligned(std::string_view in, Alignment& align) const;

 private:
  enum class Kind {
    kNfc,
    kNfd,
    kNfkc,
    kNfkd,
    kLowercase,
    kStrip,
    kPrepend,
    kReplaceString,
    kReplaceRegex
  };
  struct Op {
    Kind kind;
    bool left = false, right = false;  // Strip
    std::string text;                  // Prepend: the prefix; Replace: the literal pattern
    std::string content;               // Replace: the replacement
    std::unique_ptr<Regex> re;         // Replace with a Regex pattern
    const void* icu = nullptr;         // icu::Normalizer2* for the NF* forms (ICU-owned singleton)
  };
  void parse(const nlohmann::json& j, const std::string& origin, const std::string& path);
  // Applies `op` to `in`; false when it leaves `in` unchanged (then `out` is unspecified).
  bool apply(const Op& op, std::string_view in, std::string& out, MatchScratch& scratch) const;
  // The NF* forms through ICU; false when `in` is already normalized. `edits`: icu::Edits* or null.
  bool icu_normalize(const Op& op, std::string_view in, std::string& out, void* edits) const;
  // The alignment of one stretch ICU changed (`old_text` at input offset `base` -> `new_text`).
  void align_changed(const Op& op, std::string_view old_text, uint32_t base,
                     std::string_view new_text, Alignment& map) const;
  // apply() with `map`: for every output byte, the [start, end) input bytes it comes from.
  bool apply_aligned(const Op& op, std::string_view in, std::string& out, Alignment& map) const;

  std::vector<Op> ops_;
  std::string origin_;
};

}  // namespace ciuic::tok
