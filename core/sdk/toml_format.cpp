// TOML value formatting and locations (sdk/toml_format.h).
#include "toml_format.h"

#include "printable.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <sstream>

namespace ciuic {

std::string format_number(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
  std::string s(buf, r.ptr);
  // "2e+08" -> "2e8", "1e-04" -> "1e-4" (still TOML floats: the exponent makes them so).
  if (size_t e = s.find('e'); e != std::string::npos) {
    std::string mant = s.substr(0, e), exp = s.substr(e + 1);
    bool neg = !exp.empty() && exp[0] == '-';
    if (!exp.empty() && (exp[0] == '-' || exp[0] == '+')) exp.erase(0, 1);
    while (exp.size() > 1 && exp[0] == '0') exp.erase(0, 1);
    s = mant + "e" + (neg ? "-" : "") + exp;
  }
  return s;
}

std::string float_literal(double v) {
  std::string s = format_number(v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";  // keep it a TOML float
  return s;
}

std::string toml_quote(std::string_view s) {
  std::string out = "\"";
  out.reserve(s.size() + 2);
  for (size_t i = 0; i < s.size();) {
    const char ch = s[i];
    switch (ch) {
      case '"':
        out += "\\\"";
        ++i;
        continue;
      case '\\':
        out += "\\\\";
        ++i;
        continue;
      case '\n':
        out += "\\n";
        ++i;
        continue;
      case '\t':
        out += "\\t";
        ++i;
        continue;
      case '\r':
        out += "\\r";
        ++i;
        continue;
      default: break;
    }
    const size_t n = utf8_sequence_length(s, i);
    if (n == 0) {  // not UTF-8, which a TOML string cannot hold (strings from toml++ never are)
      out += "\\ufffd";
      ++i;
      continue;
    }
    // Control characters are escapes; so is what printable_text() would not show as it is (C1
    // controls, line separators, bidirectional controls), so that the file shows on a terminal
    // as it reads. Both round-trip exactly.
    const char32_t cp = utf8_code_point(s, i, n);
    if (cp < 0x20 || cp == 0x7f || shown_as_escape(cp)) {
      char buf[16];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(cp));
      out += buf;
    } else {
      out.append(s, i, n);
    }
    i += n;
  }
  out += '"';
  return out;
}

std::string toml_comment(std::string_view s) {
  return "# " + printable_text(s, /*keep_lines=*/false);
}

bool is_bare_key(std::string_view key) {
  if (key.empty()) return false;
  for (char c : key)
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' ||
          c == '-'))
      return false;
  return true;
}

std::string toml_key(std::string_view key) {
  return is_bare_key(key) ? std::string(key) : toml_quote(key);
}

std::string format_value(const toml::node& node) {
  if (auto v = node.value_exact<std::string>()) return toml_quote(*v);
  if (auto v = node.value_exact<bool>()) return *v ? "true" : "false";
  if (auto v = node.value_exact<int64_t>()) return std::to_string(*v);
  if (auto v = node.value_exact<double>()) return float_literal(*v);
  if (const toml::array* a = node.as_array()) {
    std::string out = "[";
    for (size_t i = 0; i < a->size(); ++i) out += (i ? ", " : "") + format_value(*a->get(i));
    return out + "]";
  }
  if (const toml::table* t = node.as_table()) {
    std::string out = "{";
    bool first = true;
    for (auto&& [k, v] : *t) {
      out += (first ? " " : ", ") + std::string(k.str()) + " = " + format_value(v);
      first = false;
    }
    return out + (first ? "}" : " }");
  }
  std::ostringstream os;  // dates and times
  node.visit([&](auto&& v) {
    if constexpr (toml::is_value<decltype(v)>) os << *v;
  });
  return os.str();
}

std::string toml_location(const toml::node& node, const std::string& fallback) {
  const auto& src = node.source();
  if (!src.begin) return fallback;
  std::string file = src.path ? std::string(*src.path) : fallback;
  return file + ":" + std::to_string(src.begin.line) + ":" + std::to_string(src.begin.column);
}

}  // namespace ciuic
