#include "jinja/lexer.h"

#include <cctype>

#include "jinja/text.h"

namespace ciuic::jinja {

namespace {

class Lexer {
 public:
  Lexer(std::string_view src, const std::string& origin) : src_(src), origin_(origin) {}

  std::vector<Token> run() {
    size_t p = 0;
    bool strip_next = false;    // the previous tag ended with '-'
    bool line_starting = true;  // the previous token ended with a newline (or template start)
    while (p <= src_.size()) {
      size_t open = find_open(p);
      std::string text(src_.substr(p, open - p));
      if (strip_next) text = lstrip_ws(text);
      bool at_end = open >= src_.size();
      char kind = at_end ? 0 : src_[open + 1];  // '{', '%', '#'
      char mod = (!at_end && open + 2 < src_.size()) ? src_[open + 2] : 0;
      if (!at_end) {
        if (mod == '-') {
          text = rstrip_ws(text);
        } else if (mod != '+' && (kind == '%' || kind == '#')) {
          size_t l = text.rfind('\n');
          size_t lpos = l == std::string::npos ? 0 : l + 1;
          if (lpos > 0 || line_starting) {
            bool only = true;
            for (size_t i = lpos; i < text.size(); ++i)
              only = only && (text[i] == ' ' || text[i] == '\t');
            if (only) text.resize(lpos);
          }
        }
      }
      if (!text.empty()) out_.push_back(Token{T::kText, text, pos_of(p)});
      if (at_end) break;
      size_t q = open + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      strip_next = false;
      line_starting = false;
      if (kind == '#') {
        size_t close = src_.find("#}", q);
        if (close == std::string_view::npos)
          fail_at(origin_, pos_of(open), "unclosed comment '{#'");
        bool minus = close > q && src_[close - 1] == '-';
        bool plus = close > q && src_[close - 1] == '+';
        p = close + 2;
        if (minus) {
          strip_next = true;
        } else if (!plus && p < src_.size() && src_[p] == '\n') {
          ++p;
          line_starting = true;
        }
        continue;
      }
      const bool block = kind == '%';
      out_.push_back(Token{block ? T::kBlockBegin : T::kVarBegin, "", pos_of(open)});
      // raw blocks: the text up to {% endraw %} is literal
      size_t after = lex_tag(open, q, block, &strip_next);
      if (block && out_.size() >= 3 && out_[out_.size() - 2].type == T::kName &&
          out_[out_.size() - 2].text == "raw" && out_[out_.size() - 3].type == T::kBlockBegin) {
        out_.resize(out_.size() - 3);
        size_t s = after;
        if (!strip_next && s < src_.size() && src_[s] == '\n') ++s;
        size_t e = find_endraw(s, &after);
        std::string raw(src_.substr(s, e - s));
        if (!raw.empty()) out_.push_back(Token{T::kText, raw, pos_of(s)});
        p = after;
        continue;
      }
      p = after;
      if (block && !strip_next && !last_plus_) {
        if (p < src_.size() && src_[p] == '\n') {
          ++p;
          line_starting = true;
        }
      }
    }
    out_.push_back(Token{T::kEof, "", pos_of(src_.size())});
    return std::move(out_);
  }

 private:
  static std::string lstrip_ws(const std::string& s) {
    size_t b = 0;
    while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
    return s.substr(b);
  }
  static std::string rstrip_ws(const std::string& s) {
    size_t e = s.size();
    while (e > 0 && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
    return s.substr(0, e);
  }

  size_t find_open(size_t p) const {
    while (true) {
      size_t o = src_.find('{', p);
      if (o == std::string_view::npos || o + 1 >= src_.size()) return src_.size();
      char c = src_[o + 1];
      if (c == '{' || c == '%' || c == '#') return o;
      p = o + 1;
    }
  }

  size_t find_endraw(size_t s, size_t* after) {
    size_t p = s;
    while (true) {
      size_t o = src_.find("{%", p);
      if (o == std::string_view::npos) fail_at(origin_, pos_of(s), "missing {% endraw %}");
      size_t q = o + 2;
      bool minus = q < src_.size() && src_[q] == '-';
      if (minus || (q < src_.size() && src_[q] == '+')) ++q;
      while (q < src_.size() && std::isspace(static_cast<unsigned char>(src_[q]))) ++q;
      if (src_.substr(q, 6) == "endraw") {
        size_t c = src_.find("%}", q);
        if (c == std::string_view::npos) fail_at(origin_, pos_of(o), "unclosed {% endraw");
        *after = c + 2;
        size_t e = o;
        if (minus)
          while (e > s && std::isspace(static_cast<unsigned char>(src_[e - 1]))) --e;
        return e;
      }
      p = o + 2;
    }
  }

  // Lexes the inside of a {{ }} or {% %} tag (opened at `open`) from q; returns the position
  // after the close.
  size_t lex_tag(size_t open, size_t q, bool block, bool* strip_next) {
    const char close0 = block ? '%' : '}';
    int depth = 0;
    last_plus_ = false;
    size_t p = q;
    while (true) {
      while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
      if (p >= src_.size())
        fail_at(origin_, pos_of(open), std::string("unclosed tag '") + (block ? "{%" : "{{") + "'");
      // close, optionally with '-' or '+'
      if (depth == 0) {
        size_t c = p;
        char m = 0;
        if ((src_[c] == '-' || src_[c] == '+') && c + 2 < src_.size() + 1 &&
            src_.substr(c + 1, 2) == std::string{close0, '}'}) {
          m = src_[c];
          ++c;
        }
        if (src_.substr(c, 2) == std::string{close0, '}'}) {
          out_.push_back(Token{block ? T::kBlockEnd : T::kVarEnd, "", pos_of(p)});
          *strip_next = m == '-';
          last_plus_ = m == '+';
          size_t after = c + 2;
          if (m == '-') {
            // '-%}' strips the whitespace that follows (done by the caller through strip_next)
          }
          return after;
        }
      }
      char c = src_[p];
      Pos at = pos_of(p);
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = p;
        while (e < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
          ++e;
        out_.push_back(Token{T::kName, std::string(src_.substr(p, e - p)), at});
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = p;
        bool is_float = false;
        while (e < src_.size() &&
               (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
          ++e;
        if (e + 1 < src_.size() && src_[e] == '.' &&
            std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() &&
                 (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_'))
            ++e;
        }
        if (e < src_.size() && (src_[e] == 'e' || src_[e] == 'E')) {
          size_t x = e + 1;
          if (x < src_.size() && (src_[x] == '+' || src_[x] == '-')) ++x;
          if (x < src_.size() && std::isdigit(static_cast<unsigned char>(src_[x]))) {
            is_float = true;
            e = x;
            while (e < src_.size() && std::isdigit(static_cast<unsigned char>(src_[e]))) ++e;
          }
        }
        std::string lit;
        for (size_t i = p; i < e; ++i)
          if (src_[i] != '_') lit += src_[i];
        out_.push_back(Token{is_float ? T::kFloat : T::kInt, lit, at});
        p = e;
      } else if (c == '\'' || c == '"') {
        std::string val;
        size_t e = p + 1;
        while (true) {
          if (e >= src_.size()) fail_at(origin_, at, "unterminated string literal");
          char d = src_[e];
          if (d == c) break;
          if (d == '\\' && e + 1 < src_.size()) {
            e = unescape(e, val);
            continue;
          }
          val += d;
          ++e;
        }
        // adjacent string literals concatenate (as in Python)
        if (!out_.empty() && out_.back().type == T::kString && last_was_string_end_ == p) {
          out_.back().text += val;
        } else {
          out_.push_back(Token{T::kString, val, at});
        }
        p = e + 1;
        size_t w = p;
        while (w < src_.size() && std::isspace(static_cast<unsigned char>(src_[w]))) ++w;
        last_was_string_end_ = w;
      } else {
        static const char* kOps2[] = {"==", "!=", "<=", ">=", "//", "**"};
        std::string op;
        for (const char* o : kOps2)
          if (src_.substr(p, 2) == o) op = o;
        if (op.empty()) {
          if (std::string_view("+-*/%~<>=.,:|()[]{}").find(c) == std::string_view::npos)
            fail_at(origin_, at, std::string("unexpected character '") + c + "'");
          op = std::string(1, c);
        }
        if (op == "(" || op == "[" || op == "{") ++depth;
        if (op == ")" || op == "]" || op == "}") --depth;
        out_.push_back(Token{T::kOp, op, at});
        p += op.size();
      }
    }
  }

  // Python string escapes (jinja2 decodes literals with "unicode-escape").
  size_t unescape(size_t e, std::string& val) {
    char n = src_[e + 1];
    auto hex = [&](size_t start, int count) -> uint32_t {
      uint32_t v = 0;
      for (int k = 0; k < count; ++k) {
        if (start + k >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[start + k])))
          fail_at(origin_, pos_of(e), "malformed \\x/\\u escape in a string literal");
        char h = src_[start + k];
        v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                               ? h - '0'
                                               : (std::tolower(h) - 'a' + 10));
      }
      return v;
    };
    switch (n) {
      case 'n': val += '\n'; return e + 2;
      case 't': val += '\t'; return e + 2;
      case 'r': val += '\r'; return e + 2;
      case '\\': val += '\\'; return e + 2;
      case '\'': val += '\''; return e + 2;
      case '"': val += '"'; return e + 2;
      case 'a': val += '\a'; return e + 2;
      case 'b': val += '\b'; return e + 2;
      case 'f': val += '\f'; return e + 2;
      case 'v': val += '\v'; return e + 2;
      case '0': val += '\0'; return e + 2;
      case '\n': return e + 2;
      case 'x': append_utf8(val, hex(e + 2, 2)); return e + 4;
      case 'u': append_utf8(val, hex(e + 2, 4)); return e + 6;
      case 'U': {
        const uint32_t cp = hex(e + 2, 8);
        if (cp > 0x10FFFF) fail_at(origin_, pos_of(e), "illegal Unicode character in a \\U escape");
        append_utf8(val, cp);
        return e + 10;
      }
      default:
        val += '\\';
        val += n;
        return e + 2;
    }
  }

  Pos pos_of(size_t off) {
    // incremental line/column (offsets only grow within one run, except for rare look-backs)
    if (off < pos_off_) {
      pos_off_ = 0;
      pos_ = Pos{};
    }
    for (; pos_off_ < off && pos_off_ < src_.size(); ++pos_off_) {
      if (src_[pos_off_] == '\n') {
        ++pos_.line;
        pos_.col = 1;
      } else {
        ++pos_.col;
      }
    }
    return pos_;
  }

  std::string_view src_;
  const std::string& origin_;
  std::vector<Token> out_;
  size_t pos_off_ = 0;
  Pos pos_;
  size_t last_was_string_end_ = std::string::npos;
  bool last_plus_ = false;
};

}  // namespace

std::string normalize_newlines(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
  return out;
}

std::vector<Token> lex(std::string_view src, const std::string& origin) {
  const std::string text = normalize_newlines(src);
  return Lexer(text, origin).run();
}

}  // namespace ciuic::jinja
