// PCRE2-backed Regex with Oniguruma semantics: see regex.h.
#define PCRE2_CODE_UNIT_WIDTH 8
#include "tokenizer/regex.h"

#include <pcre2.h>

#include <ciuic/error.h>

namespace ciuic::tok {
namespace {

constexpr const char* kWordClass = "\\p{L}\\p{M}\\p{N}\\p{Pc}";
constexpr const char* kHexClass = "0-9a-fA-F";

}  // namespace

// An ovector of one pair is enough (only group 0 is read; PCRE2 then returns rc 0 for "ovector
// too small", still a match). The JIT stack is large enough for \s+(?!\S) on long runs.
MatchScratch::MatchScratch() {
  auto* md = pcre2_match_data_create(1, nullptr);
  auto* mctx = pcre2_match_context_create(nullptr);
  auto* js = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, nullptr);
  md_ = md;
  mctx_ = mctx;
  jit_stack_ = js;
  if (!md || !mctx || !js) {
    this->~MatchScratch();
    throw Error("tokenizer: out of memory creating PCRE2 match data");
  }
  pcre2_jit_stack_assign(mctx, nullptr, js);
}

MatchScratch::~MatchScratch() {
  pcre2_jit_stack_free(static_cast<pcre2_jit_stack*>(jit_stack_));
  pcre2_match_context_free(static_cast<pcre2_match_context*>(mctx_));
  pcre2_match_data_free(static_cast<pcre2_match_data*>(md_));
  jit_stack_ = mctx_ = md_ = nullptr;
}

MatchScratch& MatchScratch::local() {
  static thread_local MatchScratch scratch;
  return scratch;
}

std::string Regex::translate_onig(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 16);
  bool in_class = false;
  size_t class_start = 0;  // index in p just after '[' or '[^'
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char n = p[i + 1];
      ++i;
      switch (n) {
        case 's': out += in_class ? "\\s\\x{85}" : "[\\s\\x{85}]"; continue;
        case 'S': out += in_class ? "\\S" : "[^\\s\\x{85}]"; continue;
        case 'w':
          out += in_class ? std::string(kWordClass) : "[" + std::string(kWordClass) + "]";
          continue;
        case 'W':
          out += in_class ? std::string("\\W") : "[^" + std::string(kWordClass) + "]";
          continue;
        case 'h':
          out += in_class ? std::string(kHexClass) : "[" + std::string(kHexClass) + "]";
          continue;
        case 'H':
          out += in_class ? std::string("\\H") : "[^" + std::string(kHexClass) + "]";
          continue;
        default:
          out += '\\';
          out += n;
          // Escapes with a braced argument (\p{..}, \x{..}, \o{..}, \k<..> ...) are copied as
          // is by the main loop: their characters are not special.
          continue;
      }
    }
    if (!in_class) {
      if (c == '[') {
        in_class = true;
        out += c;
        if (i + 1 < p.size() && p[i + 1] == '^') {
          out += '^';
          ++i;
        }
        class_start = i + 1;
        continue;
      }
      out += c;
      continue;
    }
    // Inside a class.
    if (c == '[' && i + 1 < p.size() && p[i + 1] == ':') {
      // POSIX class [:alpha:] — copy through the closing ":]".
      size_t end = p.find(":]", i + 2);
      if (end != std::string_view::npos) {
        out.append(p.substr(i, end + 2 - i));
        i = end + 1;
        continue;
      }
    }
    if (c == ']' && i != class_start) {
      in_class = false;
    }
    out += c;
  }
  return out;
}

std::string Regex::escape_literal(std::string_view literal) {
  std::string out;
  out.reserve(literal.size() * 2);
  for (char c : literal) {
    unsigned char u = static_cast<unsigned char>(c);
    bool plain =
        (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || u >= 0x80;
    if (!plain) out += '\\';
    out += c;
  }
  return out;
}

Regex::Regex(std::string_view onig_pattern, std::string where)
    : where_(std::move(where)), translated_(translate_onig(onig_pattern)) {
  pcre2_compile_context* cctx = pcre2_compile_context_create(nullptr);
  pcre2_set_newline(cctx, PCRE2_NEWLINE_LF);
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated_.data()), translated_.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MULTILINE, &err, &err_off, cctx);
  pcre2_compile_context_free(cctx);
  if (!code) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(err, buf, sizeof buf);
    throw Error(where_ + ": cannot compile regex \"" + std::string(onig_pattern) +
                "\" (as PCRE2 \"" + translated_ + "\"): " + reinterpret_cast<const char*>(buf) +
                " at offset " + std::to_string(err_off));
  }
  code_ = code;
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Regex::~Regex() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

size_t Regex::next_char_len(std::string_view text, size_t pos) {
  if (pos >= text.size()) return 1;
  unsigned char c = static_cast<unsigned char>(text[pos]);
  size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
  return n;
}

bool Regex::search(std::string_view text, size_t start, size_t* match_start, size_t* match_end,
                   MatchScratch& scratch) const {
  auto* code = static_cast<pcre2_code*>(code_);
  auto* md = static_cast<pcre2_match_data*>(scratch.md_);
  auto* mctx = static_cast<pcre2_match_context*>(scratch.mctx_);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), start, 0, md, mctx)
                : pcre2_match(code, subject, text.size(), start, PCRE2_NO_UTF_CHECK, md, mctx);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0) {
    PCRE2_UCHAR buf[256];
    pcre2_get_error_message(rc, buf, sizeof buf);
    throw Error(where_ + ": regex match failed on a text of " + std::to_string(text.size()) +
                " bytes: " + reinterpret_cast<const char*>(buf));
  }
  const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
  *match_start = ov[0];
  *match_end = ov[1];
  return true;
}

}  // namespace ciuic::tok
