// tokenizer/regex.h — PCRE2 regular expressions with the semantics of HF tokenizers' Oniguruma.
//
// HF `tokenizers` compiles the `Split` patterns of tokenizer.json with Oniguruma (Ruby syntax,
// UTF-8, Unicode classes). Regex compiles the same pattern with PCRE2 (UTF + UCP, JIT) after a
// small translation of the constructs whose meaning differs between the two engines:
//
//   Oniguruma      meaning                         PCRE2 written as
//   \s  \S         Unicode space incl. U+0085      [\s\x{85}]  [^\s\x{85}]
//   \w  \W         letter, mark, number, Pc        [\p{L}\p{M}\p{N}\p{Pc}] and its negation
//   \h  \H         hexadecimal digit               [0-9a-fA-F] and its negation
//   ^  $           line anchors (Ruby semantics)   compiled with PCRE2_MULTILINE, newline = LF
//
// Inside a character class \s, \w and \h are expanded in place; their negations (\S \W \H)
// inside a class are left to PCRE2's meaning (differs only on U+0085 and on marks).
// Onig-only syntax (class intersection `&&`, `\p{^X}`) is not translated; PCRE2 rejects what it
// does not know, and the constructor reports that.
//
// Threading: a Regex is immutable after construction; for_each_match may be called from any
// number of threads at once (match data and JIT stacks are per thread).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

#include <ciuic/export.h>

namespace ciuic::tok {

// Per-thread PCRE2 match state (match data, match context, JIT stack). Fetch it once per unit of
// work with local() and pass it to Regex calls: a thread_local lookup per match is measurable.
// Not shareable between threads.
class CIUIC_API MatchScratch {
 public:
  static MatchScratch& local();
  MatchScratch();
  ~MatchScratch();
  MatchScratch(const MatchScratch&) = delete;
  MatchScratch& operator=(const MatchScratch&) = delete;

 private:
  friend class Regex;
  void* md_ = nullptr;         // pcre2_match_data_8*
  void* mctx_ = nullptr;       // pcre2_match_context_8*
  void* jit_stack_ = nullptr;  // pcre2_jit_stack_8*
};

class CIUIC_API Regex {
 public:
  // Compiles `onig_pattern` (Oniguruma syntax, as written in tokenizer.json). Throws ciuic::Error
  // "<where>: cannot compile regex ...: <PCRE2 message> at offset N" on failure.
  Regex(std::string_view onig_pattern, std::string where);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Calls fn(start, end) for every match in `text`, left to right, with the rules of the `onig`
  // crate's find_iter: the search restarts at the end of the previous match, and an empty match
  // right at the end of the previous match is skipped (the search moves one character on).
  // `text` must be valid UTF-8 (not re-checked). Throws ciuic::Error when PCRE2 gives up
  // (e.g. resource limits) — never silently skips text.
  template <class F>
  void for_each_match(std::string_view text, F&& fn,
                      MatchScratch& scratch = MatchScratch::local()) const {
    size_t last_end = 0;
    bool have_last = false;
    size_t last_match_end = 0;
    while (last_end <= text.size()) {
      size_t s, e;
      if (!search(text, last_end, &s, &e, scratch)) return;
      if (s == e && have_last && last_match_end == e) {
        last_end += next_char_len(text, last_end);
        continue;
      }
      last_end = e;
      have_last = true;
      last_match_end = e;
      fn(s, e);
    }
  }

  // One search from `start`; true and the match bounds when found.
  bool search(std::string_view text, size_t start, size_t* match_start, size_t* match_end,
              MatchScratch& scratch = MatchScratch::local()) const;

  // The PCRE2 pattern actually compiled (for error messages and tests).
  const std::string& pcre2_pattern() const { return translated_; }

  // The translation step alone (exposed for tests).
  static std::string translate_onig(std::string_view onig_pattern);
  // A PCRE2 pattern matching `literal` exactly (Split patterns given as {"String": ...}).
  static std::string escape_literal(std::string_view literal);

 private:
  static size_t next_char_len(std::string_view text, size_t pos);
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
  std::string where_;
  std::string translated_;
};

}  // namespace ciuic::tok
