// The Jinja subset of HF chat templates (see jinja.h). Layout: values (Python semantics), lexer
// (whitespace control as jinja2 with trim_blocks + lstrip_blocks), parser (jinja2's grammar and
// precedence), evaluator (scopes as jinja2: a for body and a macro have their own, `if` has not),
// filters, tests and methods.
#include "tokenizer/jinja.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <ctime>
#include <functional>
#include <limits>
#include <map>
#include <unordered_map>

#include "tokenizer/utf8.h"

namespace ciuic::jinja {

namespace {

using json = nlohmann::ordered_json;

// ---- errors --------------------------------------------------------------------------------
struct Pos {
  int line = 1, col = 1;
};

[[noreturn]] void fail_at(const std::string& origin, Pos p, const std::string& msg) {
  throw TemplateError(origin + ":" + std::to_string(p.line) + ":" + std::to_string(p.col) + ": " + msg, msg,
                      false);
}

std::string excerpt(std::string_view s, size_t max = 60) {
  if (s.size() <= max) return std::string(s);
  return std::string(s.substr(0, max)) + "...";
}

// ---- UTF-8 helpers -------------------------------------------------------------------------
std::vector<size_t> cp_starts(std::string_view s) {  // byte offset of every code point, plus size
  std::vector<size_t> v;
  for (size_t i = 0; i < s.size(); ++i)
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) v.push_back(i);
  v.push_back(s.size());
  return v;
}

uint32_t decode_at(std::string_view s, size_t i, size_t* len) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
  if (i + n > s.size()) n = 1;
  uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  *len = static_cast<size_t>(n);
  return cp;
}

void append_utf8(std::string& out, uint32_t cp) { tok::utf8::append(out, cp); }

bool py_isspace(uint32_t c) {  // Python's str.isspace()
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// Python str.strip/lstrip/rstrip: `chars` empty = whitespace.
std::string py_strip(std::string_view s, bool left, bool right, const std::string* chars) {
  auto is_strip = [&](uint32_t cp) {
    if (!chars) return py_isspace(cp);
    std::string c;
    append_utf8(c, cp);
    return chars->find(c) != std::string::npos;
  };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t n;
      uint32_t cp = decode_at(s, b, &n);
      if (!is_strip(cp)) break;
      b += n;
    }
  }
  if (right) {
    while (e > b) {
      size_t k = e - 1;
      while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
      size_t n;
      uint32_t cp = decode_at(s, k, &n);
      if (!is_strip(cp)) break;
      e = k;
    }
  }
  return std::string(s.substr(b, e - b));
}

// ---- values --------------------------------------------------------------------------------
struct Value;
using List = std::vector<Value>;
struct Dict;
struct Func;
struct Ctx;

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

struct Value {
  enum class K : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunc };
  K k = K::kUndefined;
  bool b = false;
  bool tuple = false;  // a list printed as a Python tuple (tuple literals, dict items)
  int64_t i = 0;
  double f = 0;
  std::string s;  // string value, or the name of an undefined value (for messages)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Func> func;

  static Value undefined(std::string name = "") {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value none() {
    Value v;
    v.k = K::kNone;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.k = K::kBool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.k = K::kInt;
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v;
    v.k = K::kFloat;
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v;
    v.k = K::kString;
    v.s = std::move(x);
    return v;
  }
  static Value make_list(List items = {}) {
    Value v;
    v.k = K::kList;
    v.list = std::make_shared<List>(std::move(items));
    return v;
  }
  static Value make_dict(bool ns = false);
  static Value function(std::string name, std::function<Value(CallArgs&, Ctx&)> fn);

  bool is_undefined() const { return k == K::kUndefined; }
  bool is_none() const { return k == K::kNone; }
  bool is_number() const { return k == K::kInt || k == K::kFloat || k == K::kBool; }
  bool is_string() const { return k == K::kString; }
  double as_double() const { return k == K::kFloat ? f : k == K::kBool ? (b ? 1 : 0) : static_cast<double>(i); }
  int64_t as_int() const { return k == K::kBool ? (b ? 1 : 0) : k == K::kFloat ? static_cast<int64_t>(f) : i; }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  bool ns = false;  // a namespace(): attributes may be assigned with {% set ns.x = ... %}
  const Value* find(std::string_view key) const {
    for (const auto& kv : items)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
  void set(const std::string& key, Value v) {
    for (auto& kv : items)
      if (kv.first == key) {
        kv.second = std::move(v);
        return;
      }
    items.emplace_back(key, std::move(v));
  }
};

struct Func {
  std::string name;
  std::function<Value(CallArgs&, Ctx&)> fn;
};

Value Value::make_dict(bool ns) {
  Value v;
  v.k = K::kDict;
  v.dict = std::make_shared<Dict>();
  v.dict->ns = ns;
  return v;
}

Value Value::function(std::string name, std::function<Value(CallArgs&, Ctx&)> fn) {
  Value v;
  v.k = K::kFunc;
  v.func = std::make_shared<Func>(Func{std::move(name), std::move(fn)});
  return v;
}

Value from_json(const json& j) {
  switch (j.type()) {
    case json::value_t::null: return Value::none();
    case json::value_t::boolean: return Value::boolean(j.get<bool>());
    case json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case json::value_t::number_unsigned: return Value::integer(static_cast<int64_t>(j.get<uint64_t>()));
    case json::value_t::number_float: return Value::number(j.get<double>());
    case json::value_t::string: return Value::string(j.get<std::string>());
    case json::value_t::array: {
      Value v = Value::make_list();
      for (const auto& e : j) v.list->push_back(from_json(e));
      return v;
    }
    case json::value_t::object: {
      Value v = Value::make_dict();
      for (auto it = j.begin(); it != j.end(); ++it) v.dict->items.emplace_back(it.key(), from_json(it.value()));
      return v;
    }
    default: return Value::none();
  }
}

const char* type_name(const Value& v) {
  switch (v.k) {
    case Value::K::kUndefined: return "undefined";
    case Value::K::kNone: return "NoneType";
    case Value::K::kBool: return "bool";
    case Value::K::kInt: return "int";
    case Value::K::kFloat: return "float";
    case Value::K::kString: return "str";
    case Value::K::kList: return "list";
    case Value::K::kDict: return v.dict->ns ? "Namespace" : "dict";
    case Value::K::kFunc: return "function";
  }
  return "?";
}

// Python's repr(float): shortest round trip, fixed notation for exponents in [-4, 16).
std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // d[.ddd]e[+-]XX
  size_t e = sci.find('e');
  std::string mant = sci.substr(0, e);
  int exp = std::stoi(sci.substr(e + 1));
  bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp >= -5 && exp < 16) {
    int point = exp + 1;  // digits before the decimal point
    if (point <= 0) {
      out = "0." + std::string(static_cast<size_t>(-point), '0') + digits;
    } else if (static_cast<size_t>(point) >= digits.size()) {
      out = digits + std::string(static_cast<size_t>(point) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, static_cast<size_t>(point)) + "." + digits.substr(static_cast<size_t>(point));
    }
    if (exp == -5) {  // Python switches to scientific below 1e-4
      out.clear();
    }
  }
  if (out.empty()) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

std::string py_repr_str(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (unsigned char c : s) {
    if (c == static_cast<unsigned char>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7F) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", c);
      out += b;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + q;
}

std::string repr(const Value& v);

// Python's str(): what {{ x }} prints.
std::string to_str(const Value& v) {
  switch (v.k) {
    case Value::K::kUndefined: return "";
    case Value::K::kNone: return "None";
    case Value::K::kBool: return v.b ? "True" : "False";
    case Value::K::kInt: return std::to_string(v.i);
    case Value::K::kFloat: return py_float(v.f);
    case Value::K::kString: return v.s;
    default: return repr(v);
  }
}

std::string repr(const Value& v) {
  switch (v.k) {
    case Value::K::kString: return py_repr_str(v.s);
    case Value::K::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) out += (i ? ", " : "") + repr((*v.list)[i]);
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::K::kDict: {
      if (v.dict->ns) {
        std::string out = "<Namespace {";
        bool first = true;
        for (const auto& kv : v.dict->items) {
          out += (first ? "" : ", ") + py_repr_str(kv.first) + ": " + repr(kv.second);
          first = false;
        }
        return out + "}>";
      }
      std::string out = "{";
      bool first = true;
      for (const auto& kv : v.dict->items) {
        out += (first ? "" : ", ") + py_repr_str(kv.first) + ": " + repr(kv.second);
        first = false;
      }
      return out + "}";
    }
    case Value::K::kFunc: return "<function " + v.func->name + ">";
    default: return to_str(v);
  }
}

bool truthy(const Value& v) {
  switch (v.k) {
    case Value::K::kUndefined:
    case Value::K::kNone: return false;
    case Value::K::kBool: return v.b;
    case Value::K::kInt: return v.i != 0;
    case Value::K::kFloat: return v.f != 0;
    case Value::K::kString: return !v.s.empty();
    case Value::K::kList: return !v.list->empty();
    case Value::K::kDict: return v.dict->ns || !v.dict->items.empty();
    case Value::K::kFunc: return true;
  }
  return false;
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.k == Value::K::kFloat || b.k == Value::K::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.k != b.k) return false;
  switch (a.k) {
    case Value::K::kUndefined:
    case Value::K::kNone: return true;
    case Value::K::kString: return a.s == b.s;
    case Value::K::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equal((*a.list)[i], (*b.list)[i])) return false;
      return true;
    case Value::K::kDict:
      if (a.dict == b.dict) return true;
      if (a.dict->ns || b.dict->ns) return false;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& kv : a.dict->items) {
        const Value* o = b.dict->find(kv.first);
        if (!o || !equal(kv.second, *o)) return false;
      }
      return true;
    case Value::K::kFunc: return a.func == b.func;
    default: return false;
  }
}

// ---- tojson (transformers' filter: json.dumps(x, ensure_ascii=False, indent, separators)) ----
void json_str(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

struct JsonFormat {
  int indent = -1;  // -1: None
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};

void to_json(std::string& out, const Value& v, const JsonFormat& f, int depth) {
  auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<size_t>(f.indent * d), ' ');
  };
  switch (v.k) {
    case Value::K::kUndefined: throw std::runtime_error("Object of type Undefined is not JSON serializable");
    case Value::K::kNone: out += "null"; return;
    case Value::K::kBool: out += v.b ? "true" : "false"; return;
    case Value::K::kInt: out += std::to_string(v.i); return;
    case Value::K::kFloat: {
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += py_float(v.f);
      return;
    }
    case Value::K::kString: json_str(out, v.s); return;
    case Value::K::kList: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += f.item_sep;
        if (f.indent >= 0) newline(depth + 1);
        to_json(out, (*v.list)[i], f, depth + 1);
      }
      if (f.indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case Value::K::kDict: {
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (f.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += f.item_sep;
        first = false;
        if (f.indent >= 0) newline(depth + 1);
        json_str(out, kv->first);
        out += f.key_sep;
        to_json(out, kv->second, f, depth + 1);
      }
      if (f.indent >= 0) newline(depth);
      out += '}';
      return;
    }
    case Value::K::kFunc: throw std::runtime_error("Object of type function is not JSON serializable");
  }
}

// ---- lexer ---------------------------------------------------------------------------------
enum class T : uint8_t { kText, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  T type;
  std::string text;  // text, name, string value, number literal, operator
  Pos pos;
};

class Lexer {
 public:
  Lexer(std::string_view src, const std::string& origin) : src_(src), origin_(origin) {}

  std::vector<Token> run() {
    size_t p = 0;
    bool strip_next = false;     // the previous tag ended with '-'
    bool line_starting = true;   // the previous token ended with a newline (or template start)
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
            for (size_t i = lpos; i < text.size(); ++i) only = only && (text[i] == ' ' || text[i] == '\t');
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
        if (close == std::string_view::npos) fail_at(origin_, pos_of(open), "unclosed comment '{#'");
        bool minus = close > q && src_[close - 1] == '-';
        bool plus = close > q && src_[close - 1] == '+';
        p = close + 2;
        if (minus) {
          strip_next = true;
        } else if (!plus && p < src_.size() && src_[p] == '\n') {
          ++p;
          line_starting = true;
        } else if (!plus && p + 1 < src_.size() && src_[p] == '\r' && src_[p + 1] == '\n') {
          p += 2;
          line_starting = true;
        }
        continue;
      }
      const bool block = kind == '%';
      out_.push_back(Token{block ? T::kBlockBegin : T::kVarBegin, "", pos_of(open)});
      // raw blocks: the text up to {% endraw %} is literal
      size_t after = lex_tag(open, q, block, &strip_next);
      if (block && out_.size() >= 3 && out_[out_.size() - 2].type == T::kName && out_[out_.size() - 2].text == "raw" &&
          out_[out_.size() - 3].type == T::kBlockBegin) {
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
        } else if (p + 1 < src_.size() && src_[p] == '\r' && src_[p + 1] == '\n') {
          p += 2;
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
      if (p >= src_.size()) fail_at(origin_, pos_of(open), std::string("unclosed tag '") + (block ? "{%" : "{{") + "'");
      // close, optionally with '-' or '+'
      if (depth == 0) {
        size_t c = p;
        char m = 0;
        if ((src_[c] == '-' || src_[c] == '+') && c + 2 < src_.size() + 1 && src_.substr(c + 1, 2) == std::string{close0, '}'}) {
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
        while (e < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        out_.push_back(Token{T::kName, std::string(src_.substr(p, e - p)), at});
        p = e;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t e = p;
        bool is_float = false;
        while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
        if (e + 1 < src_.size() && src_[e] == '.' && std::isdigit(static_cast<unsigned char>(src_[e + 1]))) {
          is_float = true;
          ++e;
          while (e < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[e])) || src_[e] == '_')) ++e;
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
        v = v * 16 + static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h)) ? h - '0' : (std::tolower(h) - 'a' + 10));
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
      case 'U': append_utf8(val, hex(e + 2, 8)); return e + 10;
      default: val += '\\'; val += n; return e + 2;
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

// ---- AST -----------------------------------------------------------------------------------
struct Expr;
struct Node;
using ExprP = std::unique_ptr<Expr>;
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;

struct Ctx {
  const std::string& origin;
  std::string* out;
  std::vector<std::pair<size_t, size_t>>* gen;
  std::vector<std::unordered_map<std::string, Value>> frames;  // [0] = globals + template top level
  int depth = 0;
};

enum class Flow { kNormal, kBreak, kContinue };

struct Expr {
  Pos pos;
  virtual ~Expr() = default;
  virtual Value eval(Ctx& c) const = 0;
};

struct Node {
  Pos pos;
  virtual ~Node() = default;
  virtual Flow exec(Ctx& c) const = 0;
};

[[noreturn]] void rt_fail(const Ctx& c, Pos p, const std::string& msg) { fail_at(c.origin, p, msg); }

Value lookup(const Ctx& c, const std::string& name) {
  for (auto it = c.frames.rbegin(); it != c.frames.rend(); ++it) {
    auto f = it->find(name);
    if (f != it->end()) return f->second;
  }
  return Value::undefined(name);
}

std::string undefined_msg(const Value& v) {
  return v.s.empty() ? std::string("value is undefined") : "'" + v.s + "' is undefined";
}

Flow exec_body(const Body& body, Ctx& c) {
  for (const auto& n : body) {
    Flow f = n->exec(c);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

// --- value operations that need positions for errors ---
Value get_attr(Ctx& c, Pos p, const Value& obj, const std::string& name);
Value get_item(Ctx& c, Pos p, const Value& obj, const Value& key);
Value call_value(Ctx& c, Pos p, const Value& fn, CallArgs& args);
Value apply_filter(Ctx& c, Pos p, const std::string& name, const Value& v, CallArgs& args);
bool apply_test(Ctx& c, Pos p, const std::string& name, const Value& v, CallArgs& args);

std::vector<Value> iterate(Ctx& c, Pos p, const Value& v) {
  switch (v.k) {
    case Value::K::kUndefined: return {};
    case Value::K::kList: return *v.list;
    case Value::K::kDict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(Value::string(kv.first));
      return keys;
    }
    case Value::K::kString: {
      std::vector<Value> chars;
      auto st = cp_starts(v.s);
      for (size_t i = 0; i + 1 < st.size(); ++i) chars.push_back(Value::string(v.s.substr(st[i], st[i + 1] - st[i])));
      return chars;
    }
    default: rt_fail(c, p, std::string("'") + type_name(v) + "' object is not iterable");
  }
}

int64_t py_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

Value binary(Ctx& c, Pos p, const std::string& op, const Value& a, const Value& b) {
  auto undefined_check = [&] {
    if (a.is_undefined()) rt_fail(c, p, undefined_msg(a));
    if (b.is_undefined()) rt_fail(c, p, undefined_msg(b));
  };
  auto unsupported = [&]() -> Value {
    rt_fail(c, p, "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  if (op == "~") return Value::string(to_str(a) + to_str(b));
  undefined_check();
  const bool nums = a.is_number() && b.is_number();
  const bool floats = nums && (a.k == Value::K::kFloat || b.k == Value::K::kFloat);
  if (op == "+") {
    if (nums) return floats ? Value::number(a.as_double() + b.as_double()) : Value::integer(a.as_int() + b.as_int());
    if (a.is_string() && b.is_string()) return Value::string(a.s + b.s);
    if (a.k == Value::K::kList && b.k == Value::K::kList) {
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(l));
    }
    if (a.is_string() || b.is_string())
      rt_fail(c, p, std::string("can only concatenate str (not \"") + type_name(a.is_string() ? b : a) +
                        "\") to str; use ~ to join a string with another value");
    return unsupported();
  }
  if (op == "-") {
    if (nums) return floats ? Value::number(a.as_double() - b.as_double()) : Value::integer(a.as_int() - b.as_int());
    return unsupported();
  }
  if (op == "*") {
    if (nums) return floats ? Value::number(a.as_double() * b.as_double()) : Value::integer(a.as_int() * b.as_int());
    auto repeat = [&](const Value& s, const Value& n) -> Value {
      int64_t k = std::max<int64_t>(0, n.as_int());
      if (s.is_string()) {
        std::string out;
        for (int64_t i = 0; i < k; ++i) out += s.s;
        return Value::string(out);
      }
      List l;
      for (int64_t i = 0; i < k; ++i) l.insert(l.end(), s.list->begin(), s.list->end());
      return Value::make_list(std::move(l));
    };
    if ((a.is_string() || a.k == Value::K::kList) && (b.k == Value::K::kInt || b.k == Value::K::kBool)) return repeat(a, b);
    if ((b.is_string() || b.k == Value::K::kList) && (a.k == Value::K::kInt || a.k == Value::K::kBool)) return repeat(b, a);
    return unsupported();
  }
  if (op == "/") {
    if (!nums) return unsupported();
    if (b.as_double() == 0) rt_fail(c, p, "division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//") {
    if (!nums) return unsupported();
    if (b.as_double() == 0) rt_fail(c, p, "integer division or modulo by zero");
    if (floats) return Value::number(std::floor(a.as_double() / b.as_double()));
    return Value::integer(py_floordiv(a.as_int(), b.as_int()));
  }
  if (op == "%") {
    if (!nums) return unsupported();
    if (b.as_double() == 0) rt_fail(c, p, "integer division or modulo by zero");
    if (floats) {
      double r = std::fmod(a.as_double(), b.as_double());
      if (r != 0 && ((r < 0) != (b.as_double() < 0))) r += b.as_double();
      return Value::number(r);
    }
    int64_t r = a.as_int() % b.as_int();
    if (r != 0 && ((r < 0) != (b.as_int() < 0))) r += b.as_int();
    return Value::integer(r);
  }
  if (op == "**") {
    if (!nums) return unsupported();
    if (!floats && b.as_int() >= 0) {
      int64_t r = 1;
      for (int64_t i = 0; i < b.as_int(); ++i) r *= a.as_int();
      return Value::integer(r);
    }
    return Value::number(std::pow(a.as_double(), b.as_double()));
  }
  return unsupported();
}

int compare(Ctx& c, Pos p, const Value& a, const Value& b, const std::string& op) {
  if (a.is_number() && b.is_number()) {
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.k == Value::K::kList && b.k == Value::K::kList) {
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t i = 0; i < n; ++i) {
      if (equal((*a.list)[i], (*b.list)[i])) continue;
      return compare(c, p, (*a.list)[i], (*b.list)[i], op);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  if (a.is_undefined()) rt_fail(c, p, undefined_msg(a));
  if (b.is_undefined()) rt_fail(c, p, undefined_msg(b));
  rt_fail(c, p, "'" + op + "' not supported between instances of '" + type_name(a) + "' and '" + type_name(b) + "'");
}

bool contains(Ctx& c, Pos p, const Value& container, const Value& item) {
  switch (container.k) {
    case Value::K::kString:
      if (!item.is_string())
        rt_fail(c, p, std::string("'in <string>' requires string as left operand, not ") + type_name(item));
      return container.s.find(item.s) != std::string::npos;
    case Value::K::kList:
      for (const auto& e : *container.list)
        if (equal(e, item)) return true;
      return false;
    case Value::K::kDict: return item.is_string() && container.dict->find(item.s) != nullptr;
    case Value::K::kUndefined: return false;  // jinja2's Undefined iterates as empty
    default: rt_fail(c, p, std::string("argument of type '") + type_name(container) + "' is not iterable");
  }
}

// ---- expressions ---------------------------------------------------------------------------
struct Literal : Expr {
  Value v;
  Value eval(Ctx&) const override { return v; }
};

struct Name : Expr {
  std::string name;
  Value eval(Ctx& c) const override { return lookup(c, name); }
};

struct ListExpr : Expr {
  std::vector<ExprP> items;
  bool tuple = false;
  Value eval(Ctx& c) const override {
    Value v = Value::make_list();
    v.tuple = tuple;
    for (const auto& e : items) v.list->push_back(e->eval(c));
    return v;
  }
};

struct DictExpr : Expr {
  std::vector<std::pair<ExprP, ExprP>> items;
  Value eval(Ctx& c) const override {
    Value v = Value::make_dict();
    for (const auto& kv : items) {
      Value k = kv.first->eval(c);
      if (!k.is_string()) rt_fail(c, kv.first->pos, "dictionary keys must be strings here");
      v.dict->set(k.s, kv.second->eval(c));
    }
    return v;
  }
};

struct Unary : Expr {
  std::string op;  // "not", "-", "+"
  ExprP e;
  Value eval(Ctx& c) const override {
    Value v = e->eval(c);
    if (op == "not") return Value::boolean(!truthy(v));
    if (!v.is_number()) rt_fail(c, pos, "bad operand type for unary " + op + ": '" + type_name(v) + "'");
    if (op == "-") return v.k == Value::K::kFloat ? Value::number(-v.f) : Value::integer(-v.as_int());
    return v.k == Value::K::kFloat ? v : Value::integer(v.as_int());
  }
};

struct Binary : Expr {
  std::string op;
  ExprP a, b;
  Value eval(Ctx& c) const override {
    if (op == "and") {
      Value x = a->eval(c);
      return truthy(x) ? b->eval(c) : x;
    }
    if (op == "or") {
      Value x = a->eval(c);
      return truthy(x) ? x : b->eval(c);
    }
    Value x = a->eval(c), y = b->eval(c);
    if (op == "==") return Value::boolean(equal(x, y));
    if (op == "!=") return Value::boolean(!equal(x, y));
    if (op == "<") return Value::boolean(compare(c, pos, x, y, op) < 0);
    if (op == "<=") return Value::boolean(compare(c, pos, x, y, op) <= 0);
    if (op == ">") return Value::boolean(compare(c, pos, x, y, op) > 0);
    if (op == ">=") return Value::boolean(compare(c, pos, x, y, op) >= 0);
    if (op == "in") return Value::boolean(contains(c, pos, y, x));
    if (op == "not in") return Value::boolean(!contains(c, pos, y, x));
    return binary(c, pos, op, x, y);
  }
};

struct CondExpr : Expr {
  ExprP cond, yes, no;  // no may be null (undefined)
  Value eval(Ctx& c) const override {
    if (truthy(cond->eval(c))) return yes->eval(c);
    return no ? no->eval(c) : Value::undefined();
  }
};

struct Attr : Expr {
  ExprP obj;
  std::string name;
  Value eval(Ctx& c) const override { return get_attr(c, pos, obj->eval(c), name); }
};

struct Item : Expr {
  ExprP obj, key;
  Value eval(Ctx& c) const override { return get_item(c, pos, obj->eval(c), key->eval(c)); }
};

struct SliceExpr : Expr {
  ExprP obj, start, stop, step;
  Value eval(Ctx& c) const override;
};

struct Args {
  std::vector<ExprP> pos;
  std::vector<std::pair<std::string, ExprP>> kw;
  CallArgs eval(Ctx& c) const {
    CallArgs a;
    for (const auto& e : pos) a.pos.push_back(e->eval(c));
    for (const auto& kv : kw) a.kw.emplace_back(kv.first, kv.second->eval(c));
    return a;
  }
};

struct Call : Expr {
  ExprP fn;
  Args args;
  Value eval(Ctx& c) const override {
    Value f = fn->eval(c);
    CallArgs a = args.eval(c);
    return call_value(c, pos, f, a);
  }
};

struct FilterExpr : Expr {
  ExprP e;
  std::string name;
  Args args;
  Value eval(Ctx& c) const override {
    Value v = e->eval(c);
    CallArgs a = args.eval(c);
    return apply_filter(c, pos, name, v, a);
  }
};

struct TestExpr : Expr {
  ExprP e;
  std::string name;
  Args args;
  bool negate = false;
  Value eval(Ctx& c) const override {
    Value v = e->eval(c);
    CallArgs a = args.eval(c);
    return Value::boolean(apply_test(c, pos, name, v, a) != negate);
  }
};

// Python slice of n elements: the selected indices.
std::vector<int64_t> slice_indices(Ctx& c, Pos p, int64_t n, const Value& start, const Value& stop, const Value& step) {
  auto opt = [&](const Value& v) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (v.k != Value::K::kInt && v.k != Value::K::kBool) rt_fail(c, p, "slice indices must be integers or None");
    return v.as_int();
  };
  int64_t st = opt(step).value_or(1);
  if (st == 0) rt_fail(c, p, "slice step cannot be zero");
  auto norm = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t v = *x;
    if (v < 0) v += n;
    if (st > 0) return std::clamp<int64_t>(v, 0, n);
    return std::clamp<int64_t>(v, -1, n - 1);
  };
  int64_t b = norm(opt(start), st > 0 ? 0 : n - 1);
  int64_t e = norm(opt(stop), st > 0 ? n : -1);
  std::vector<int64_t> idx;
  if (st > 0)
    for (int64_t i = b; i < e; i += st) idx.push_back(i);
  else
    for (int64_t i = b; i > e; i += st) idx.push_back(i);
  return idx;
}

Value SliceExpr::eval(Ctx& c) const {
  Value o = obj->eval(c);
  Value s0 = start ? start->eval(c) : Value::none(), s1 = stop ? stop->eval(c) : Value::none(),
        s2 = step ? step->eval(c) : Value::none();
  if (o.is_string()) {
    auto st = cp_starts(o.s);
    auto idx = slice_indices(c, pos, static_cast<int64_t>(st.size() - 1), s0, s1, s2);
    std::string out;
    for (int64_t i : idx) out += o.s.substr(st[static_cast<size_t>(i)], st[static_cast<size_t>(i) + 1] - st[static_cast<size_t>(i)]);
    return Value::string(out);
  }
  if (o.k == Value::K::kList) {
    auto idx = slice_indices(c, pos, static_cast<int64_t>(o.list->size()), s0, s1, s2);
    List l;
    for (int64_t i : idx) l.push_back((*o.list)[static_cast<size_t>(i)]);
    return Value::make_list(std::move(l));
  }
  if (o.is_undefined()) rt_fail(c, pos, undefined_msg(o));
  rt_fail(c, pos, std::string("'") + type_name(o) + "' object is not subscriptable");
}

// ---- statements ----------------------------------------------------------------------------
struct Output : Node {
  std::string text;
  Flow exec(Ctx& c) const override {
    *c.out += text;
    return Flow::kNormal;
  }
};

struct Print : Node {
  ExprP e;
  Flow exec(Ctx& c) const override {
    *c.out += to_str(e->eval(c));
    return Flow::kNormal;
  }
};

struct If : Node {
  std::vector<std::pair<ExprP, Body>> branches;  // cond null = else
  Flow exec(Ctx& c) const override {
    for (const auto& [cond, body] : branches)
      if (!cond || truthy(cond->eval(c))) return exec_body(body, c);
    return Flow::kNormal;
  }
};

// Assignment target: a name, ns.attr, or a tuple of names.
struct Target {
  std::vector<std::string> names;  // several = tuple unpacking
  std::string attr;                // names[0].attr
  Pos pos;
};

void assign(Ctx& c, const Target& t, const Value& v) {
  if (!t.attr.empty()) {
    Value obj = lookup(c, t.names[0]);
    if (obj.k != Value::K::kDict || !obj.dict->ns)
      rt_fail(c, t.pos, "cannot assign attribute on non-namespace object '" + t.names[0] + "'");
    obj.dict->set(t.attr, v);
    return;
  }
  if (t.names.size() == 1) {
    c.frames.back()[t.names[0]] = v;
    return;
  }
  std::vector<Value> items = iterate(c, t.pos, v);
  if (items.size() != t.names.size())
    rt_fail(c, t.pos, "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(t.names.size()));
  for (size_t i = 0; i < items.size(); ++i) c.frames.back()[t.names[i]] = items[i];
}

struct Set : Node {
  Target target;
  ExprP value;  // null: block set
  Body body;
  std::vector<std::pair<std::string, Args>> filters;  // block set filters
  Flow exec(Ctx& c) const override {
    Value v;
    if (value) {
      v = value->eval(c);
    } else {
      std::string buf;
      std::string* saved = c.out;
      c.out = &buf;
      exec_body(body, c);
      c.out = saved;
      v = Value::string(buf);
      for (const auto& [name, args] : filters) {
        CallArgs a = args.eval(c);
        v = apply_filter(c, pos, name, v, a);
      }
    }
    assign(c, target, v);
    return Flow::kNormal;
  }
};

struct For : Node {
  Target target;
  ExprP iter;
  ExprP filter;  // `for x in xs if cond`
  Body body, else_body;
  Flow exec(Ctx& c) const override {
    Value seq = iter->eval(c);
    std::vector<Value> all = iterate(c, iter->pos, seq);
    std::vector<Value> items;
    if (filter) {
      for (const auto& v : all) {
        c.frames.emplace_back();
        assign(c, target, v);
        bool keep = truthy(filter->eval(c));
        c.frames.pop_back();
        if (keep) items.push_back(v);
      }
    } else {
      items = std::move(all);
    }
    if (items.empty()) return exec_body(else_body, c);
    const int64_t n = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < n; ++i) {
      c.frames.emplace_back();
      Value loop = Value::make_dict();
      Dict& d = *loop.dict;
      d.set("index0", Value::integer(i));
      d.set("index", Value::integer(i + 1));
      d.set("revindex0", Value::integer(n - i - 1));
      d.set("revindex", Value::integer(n - i));
      d.set("first", Value::boolean(i == 0));
      d.set("last", Value::boolean(i == n - 1));
      d.set("length", Value::integer(n));
      d.set("depth", Value::integer(1));
      d.set("depth0", Value::integer(0));
      d.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined("loop.previtem"));
      d.set("nextitem", i + 1 < n ? items[static_cast<size_t>(i + 1)] : Value::undefined("loop.nextitem"));
      d.set("cycle", Value::function("loop.cycle", [i](CallArgs& a, Ctx&) -> Value {
              if (a.pos.empty()) return Value::undefined();
              return a.pos[static_cast<size_t>(i) % a.pos.size()];
            }));
      c.frames.back()["loop"] = loop;
      assign(c, target, items[static_cast<size_t>(i)]);
      Flow f = exec_body(body, c);
      c.frames.pop_back();
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }
};

struct LoopControl : Node {
  Flow flow;
  Flow exec(Ctx&) const override { return flow; }
};

struct Generation : Node {
  Body body;
  Flow exec(Ctx& c) const override {
    size_t b = c.out->size();
    Flow f = exec_body(body, c);
    if (c.gen && c.out->size() > b) c.gen->emplace_back(b, c.out->size());
    return f;
  }
};

struct Macro : Node {
  std::string name;
  std::vector<std::pair<std::string, ExprP>> params;  // default may be null
  Body body;
  Flow exec(Ctx& c) const override;
};

Value call_macro(const Macro& m, CallArgs& a, Ctx& c, Pos p) {
  if (++c.depth > 100) rt_fail(c, p, "macro recursion deeper than 100");
  std::unordered_map<std::string, Value> frame;
  if (a.pos.size() > m.params.size())
    rt_fail(c, p, "macro '" + m.name + "' takes " + std::to_string(m.params.size()) + " arguments, " +
                      std::to_string(a.pos.size()) + " given");
  for (size_t i = 0; i < m.params.size(); ++i) {
    if (i < a.pos.size()) frame[m.params[i].first] = a.pos[i];
  }
  for (auto& [k, v] : a.kw) {
    if (k == "caller") {  // {% call %} passes the caller to any macro
      frame[k] = v;
      continue;
    }
    bool known = false;
    for (const auto& prm : m.params) known = known || prm.first == k;
    if (!known) rt_fail(c, p, "macro '" + m.name + "' has no argument '" + k + "'");
    frame[k] = v;
  }
  std::vector<std::unordered_map<std::string, Value>> saved_frames;
  saved_frames.swap(c.frames);
  c.frames.push_back(saved_frames.front());  // globals and top-level assignments
  c.frames.push_back(std::move(frame));
  for (const auto& prm : m.params)
    if (!c.frames.back().count(prm.first))
      c.frames.back()[prm.first] = prm.second ? prm.second->eval(c) : Value::undefined(prm.first);
  std::string buf;
  std::string* saved_out = c.out;
  auto* saved_gen = c.gen;
  c.out = &buf;
  c.gen = nullptr;
  exec_body(m.body, c);
  c.out = saved_out;
  c.gen = saved_gen;
  c.frames.swap(saved_frames);
  --c.depth;
  return Value::string(buf);
}

Flow Macro::exec(Ctx& c) const {
  const Macro* self = this;
  Pos p = pos;
  c.frames.back()[name] = Value::function(name, [self, p](CallArgs& a, Ctx& cc) { return call_macro(*self, a, cc, p); });
  return Flow::kNormal;
}

struct CallBlock : Node {  // {% call m(args) %}body{% endcall %}: caller() renders body
  ExprP call;              // a Call expression
  Body body;
  Flow exec(Ctx& c) const override {
    const Body* b = &body;
    Value caller = Value::function("caller", [b](CallArgs&, Ctx& cc) {
      std::string buf;
      std::string* saved = cc.out;
      cc.out = &buf;
      exec_body(*b, cc);
      cc.out = saved;
      return Value::string(buf);
    });
    c.frames.emplace_back();
    c.frames.back()["caller"] = caller;
    const Call* call_expr = static_cast<const Call*>(call.get());
    Value f = call_expr->fn->eval(c);
    CallArgs a = call_expr->args.eval(c);
    a.kw.emplace_back("caller", caller);
    Value r = call_value(c, pos, f, a);
    c.frames.pop_back();
    *c.out += to_str(r);
    return Flow::kNormal;
  }
};

// ---- parser --------------------------------------------------------------------------------
class Parser {
 public:
  Parser(std::vector<Token> toks, const std::string& origin) : t_(std::move(toks)), origin_(origin) {}

  Body parse_template(bool* has_generation) {
    Body b = parse_body({});
    if (peek().type != T::kEof) fail("unexpected '" + describe(peek()) + "'");
    *has_generation = has_generation_;
    return b;
  }

 private:
  const Token& peek(size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(i_++, t_.size() - 1)]; }
  bool is_op(const char* op, size_t k = 0) const { return peek(k).type == T::kOp && peek(k).text == op; }
  bool is_name(const char* n, size_t k = 0) const { return peek(k).type == T::kName && peek(k).text == n; }
  [[noreturn]] void fail(const std::string& msg) const { fail_at(origin_, peek().pos, msg); }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case T::kText: return excerpt(t.text, 20);
      case T::kVarBegin: return "{{";
      case T::kVarEnd: return "}}";
      case T::kBlockBegin: return "{%";
      case T::kBlockEnd: return "%}";
      case T::kEof: return "end of template";
      case T::kString: return "'" + excerpt(t.text, 20) + "'";
      default: return t.text;
    }
  }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(std::string("expected '") + op + "', found '" + describe(peek()) + "'");
    ++i_;
  }
  std::string expect_name() {
    if (peek().type != T::kName) fail("expected a name, found '" + describe(peek()) + "'");
    return next().text;
  }
  void expect_block_end() {
    if (peek().type != T::kBlockEnd) fail("expected '%}', found '" + describe(peek()) + "'");
    ++i_;
  }

  // Parses nodes until a {% <one of ends> %} (left unconsumed: i_ points at its name).
  Body parse_body(const std::vector<std::string>& ends) {
    Body body;
    while (true) {
      const Token& tk = peek();
      if (tk.type == T::kEof) {
        if (!ends.empty()) fail("missing {% " + ends.back() + " %}");  // the closing tag (not an else)
        return body;
      }
      if (tk.type == T::kText) {
        auto n = std::make_unique<Output>();
        n->pos = tk.pos;
        n->text = tk.text;
        body.push_back(std::move(n));
        ++i_;
        continue;
      }
      if (tk.type == T::kVarBegin) {
        ++i_;
        auto n = std::make_unique<Print>();
        n->pos = tk.pos;
        n->e = parse_expr();
        if (peek().type != T::kVarEnd) fail("expected '}}', found '" + describe(peek()) + "'");
        ++i_;
        body.push_back(std::move(n));
        continue;
      }
      if (tk.type == T::kBlockBegin) {
        const Token& kw = peek(1);
        if (kw.type != T::kName) fail_at(origin_, kw.pos, "expected a statement name after '{%'");
        for (const auto& e : ends)
          if (kw.text == e) {
            ++i_;  // at the name
            return body;
          }
        ++i_;
        body.push_back(parse_statement());
        continue;
      }
      fail("unexpected '" + describe(tk) + "'");
    }
  }

  NodeP parse_statement() {
    const Token kw = next();
    const std::string& k = kw.text;
    NodeP n;
    if (k == "if") n = parse_if();
    else if (k == "for") n = parse_for();
    else if (k == "set") n = parse_set();
    else if (k == "macro") n = parse_macro();
    else if (k == "call") n = parse_call_block();
    else if (k == "generation") {
      expect_block_end();
      auto g = std::make_unique<Generation>();
      g->body = parse_body({"endgeneration"});
      ++i_;
      expect_block_end();
      has_generation_ = true;
      n = std::move(g);
    } else if (k == "break" || k == "continue") {
      if (loop_depth_ == 0) fail_at(origin_, kw.pos, "'" + k + "' outside of a for loop");
      expect_block_end();
      auto l = std::make_unique<LoopControl>();
      l->flow = k == "break" ? Flow::kBreak : Flow::kContinue;
      n = std::move(l);
    } else if (k == "elif" || k == "else" || k.rfind("end", 0) == 0) {
      fail_at(origin_, kw.pos, "unexpected '{% " + k + " %}' (no open block it could close)");
    } else {
      fail_at(origin_, kw.pos,
              "unsupported statement '{% " + k + " %}' (chat templates support if, for, set, macro, call, "
              "break, continue, generation, raw)");
    }
    n->pos = kw.pos;
    return n;
  }

  NodeP parse_if() {
    auto n = std::make_unique<If>();
    ExprP cond = parse_expr();
    expect_block_end();
    while (true) {
      Body body = parse_body({"elif", "else", "endif"});
      n->branches.emplace_back(std::move(cond), std::move(body));
      const std::string which = next().text;
      if (which == "endif") {
        expect_block_end();
        break;
      }
      if (which == "elif") {
        cond = parse_expr();
        expect_block_end();
        continue;
      }
      expect_block_end();  // else
      Body eb = parse_body({"endif"});
      ++i_;
      expect_block_end();
      n->branches.emplace_back(nullptr, std::move(eb));
      break;
    }
    return n;
  }

  Target parse_target() {
    Target t;
    t.pos = peek().pos;
    t.names.push_back(expect_name());
    if (is_op(".")) {
      ++i_;
      t.attr = expect_name();
      return t;
    }
    while (is_op(",")) {
      ++i_;
      t.names.push_back(expect_name());
    }
    return t;
  }

  NodeP parse_for() {
    auto n = std::make_unique<For>();
    n->target = parse_target();
    if (!n->target.attr.empty()) fail("a for loop cannot assign to an attribute");
    if (!is_name("in")) fail("expected 'in' in the for statement, found '" + describe(peek()) + "'");
    ++i_;
    n->iter = parse_expr(false);
    if (is_name("if")) {
      ++i_;
      n->filter = parse_expr(false);
    }
    if (is_name("recursive")) fail("recursive for loops are not supported");
    expect_block_end();
    ++loop_depth_;
    n->body = parse_body({"else", "endfor"});
    --loop_depth_;
    if (next().text == "else") {
      expect_block_end();
      n->else_body = parse_body({"endfor"});
      ++i_;
    }
    expect_block_end();
    return n;
  }

  NodeP parse_set() {
    auto n = std::make_unique<Set>();
    n->target = parse_target();
    if (is_op("=")) {
      ++i_;
      n->value = parse_tuple_or_expr();
      expect_block_end();
      return n;
    }
    while (is_op("|")) {
      ++i_;
      std::string name = expect_name();
      Args a;
      if (is_op("(")) a = parse_call_args();
      n->filters.emplace_back(name, std::move(a));
    }
    expect_block_end();
    n->body = parse_body({"endset"});
    ++i_;
    expect_block_end();
    return n;
  }

  NodeP parse_macro() {
    auto n = std::make_unique<Macro>();
    n->name = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      std::string p = expect_name();
      ExprP d;
      if (is_op("=")) {
        ++i_;
        d = parse_expr();
      }
      n->params.emplace_back(p, std::move(d));
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
    expect_block_end();
    int saved = loop_depth_;
    loop_depth_ = 0;
    n->body = parse_body({"endmacro"});
    loop_depth_ = saved;
    ++i_;
    expect_block_end();
    return n;
  }

  NodeP parse_call_block() {
    auto n = std::make_unique<CallBlock>();
    ExprP e = parse_expr();
    if (!dynamic_cast<Call*>(e.get())) fail("{% call %} needs a macro call");
    n->call = std::move(e);
    expect_block_end();
    n->body = parse_body({"endcall"});
    ++i_;
    expect_block_end();
    return n;
  }

  // Expressions -------------------------------------------------------------------------------
  ExprP parse_tuple_or_expr() {
    Pos p = peek().pos;
    ExprP first = parse_expr();
    if (!is_op(",")) return first;
    auto l = std::make_unique<ListExpr>();
    l->pos = p;
    l->tuple = true;
    l->items.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (peek().type == T::kBlockEnd || peek().type == T::kVarEnd) break;
      l->items.push_back(parse_expr());
    }
    return l;
  }

  ExprP parse_expr(bool with_condexpr = true) {
    Pos p = peek().pos;
    ExprP e = parse_or();
    while (with_condexpr && is_name("if")) {
      ++i_;
      auto c = std::make_unique<CondExpr>();
      c->pos = p;
      c->yes = std::move(e);
      c->cond = parse_or();
      if (is_name("else")) {
        ++i_;
        c->no = parse_expr();
      }
      e = std::move(c);
    }
    return e;
  }

  ExprP bin(std::string op, ExprP a, ExprP b, Pos p) {
    auto n = std::make_unique<Binary>();
    n->pos = p;
    n->op = std::move(op);
    n->a = std::move(a);
    n->b = std::move(b);
    return n;
  }

  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) {
      Pos p = next().pos;
      e = bin("or", std::move(e), parse_and(), p);
    }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) {
      Pos p = next().pos;
      e = bin("and", std::move(e), parse_not(), p);
    }
    return e;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      auto n = std::make_unique<Unary>();
      n->pos = next().pos;
      n->op = "not";
      n->e = parse_not();
      return n;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    while (true) {
      Pos p = peek().pos;
      std::string op;
      if (peek().type == T::kOp && (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
                                    peek().text == "<=" || peek().text == ">" || peek().text == ">=")) {
        op = next().text;
      } else if (is_name("in")) {
        ++i_;
        op = "in";
      } else if (is_name("not") && is_name("in", 1)) {
        i_ += 2;
        op = "not in";
      } else {
        return e;
      }
      e = bin(op, std::move(e), parse_math1(), p);
    }
  }
  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& t = next();
      e = bin(t.text, std::move(e), parse_concat(), t.pos);
    }
    return e;
  }
  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (is_op("~")) {
      Pos p = next().pos;
      e = bin("~", std::move(e), parse_math2(), p);
    }
    return e;
  }
  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& t = next();
      e = bin(t.text, std::move(e), parse_pow(), t.pos);
    }
    return e;
  }
  ExprP parse_pow() {
    ExprP e = parse_unary();
    while (is_op("**")) {
      Pos p = next().pos;
      e = bin("**", std::move(e), parse_unary(), p);
    }
    return e;
  }
  ExprP parse_unary(bool with_filter = true) {
    if (is_op("-") || is_op("+")) {
      auto n = std::make_unique<Unary>();
      const Token& t = next();
      n->pos = t.pos;
      n->op = t.text;
      n->e = parse_unary(false);
      ExprP e = std::move(n);
      return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
    }
    ExprP e = parse_postfix(parse_primary());
    return with_filter ? parse_filter_expr(std::move(e)) : std::move(e);
  }

  ExprP parse_primary() {
    const Token& t = peek();
    switch (t.type) {
      case T::kName: {
        ++i_;
        auto lit = [&](Value v) {
          auto l = std::make_unique<Literal>();
          l->pos = t.pos;
          l->v = std::move(v);
          return l;
        };
        if (t.text == "true" || t.text == "True") return lit(Value::boolean(true));
        if (t.text == "false" || t.text == "False") return lit(Value::boolean(false));
        if (t.text == "none" || t.text == "None") return lit(Value::none());
        auto n = std::make_unique<Name>();
        n->pos = t.pos;
        n->name = t.text;
        return n;
      }
      case T::kString: {
        ++i_;
        auto l = std::make_unique<Literal>();
        l->pos = t.pos;
        l->v = Value::string(t.text);
        return l;
      }
      case T::kInt: {
        ++i_;
        auto l = std::make_unique<Literal>();
        l->pos = t.pos;
        int64_t v = 0;
        auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) fail_at(origin_, t.pos, "integer literal out of range: " + t.text);
        l->v = Value::integer(v);
        return l;
      }
      case T::kFloat: {
        ++i_;
        auto l = std::make_unique<Literal>();
        l->pos = t.pos;
        l->v = Value::number(std::strtod(t.text.c_str(), nullptr));
        return l;
      }
      case T::kOp:
        if (t.text == "(") {
          ++i_;
          if (is_op(")")) {  // empty tuple
            ++i_;
            auto l = std::make_unique<ListExpr>();
            l->pos = t.pos;
            l->tuple = true;
            return l;
          }
          ExprP e = parse_tuple_or_expr_in_parens();
          expect_op(")");
          return e;
        }
        if (t.text == "[") {
          ++i_;
          auto l = std::make_unique<ListExpr>();
          l->pos = t.pos;
          while (!is_op("]")) {
            l->items.push_back(parse_expr());
            if (!is_op(",")) break;
            ++i_;
          }
          expect_op("]");
          return l;
        }
        if (t.text == "{") {
          ++i_;
          auto d = std::make_unique<DictExpr>();
          d->pos = t.pos;
          while (!is_op("}")) {
            ExprP k = parse_expr();
            expect_op(":");
            ExprP v = parse_expr();
            d->items.emplace_back(std::move(k), std::move(v));
            if (!is_op(",")) break;
            ++i_;
          }
          expect_op("}");
          return d;
        }
        break;
      default: break;
    }
    fail("unexpected '" + describe(t) + "' in an expression");
  }

  ExprP parse_tuple_or_expr_in_parens() {
    Pos p = peek().pos;
    ExprP first = parse_expr();
    if (!is_op(",")) return first;
    auto l = std::make_unique<ListExpr>();
    l->pos = p;
    l->tuple = true;
    l->items.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (is_op(")")) break;
      l->items.push_back(parse_expr());
    }
    return l;
  }

  Args parse_call_args() {
    expect_op("(");
    Args a;
    while (!is_op(")")) {
      if (peek().type == T::kName && is_op("=", 1)) {
        std::string k = next().text;
        ++i_;
        a.kw.emplace_back(k, parse_expr());
      } else {
        if (!a.kw.empty()) fail("positional argument after a keyword argument");
        a.pos.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
    return a;
  }

  ExprP parse_postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        Pos p = next().pos;
        auto n = std::make_unique<Attr>();
        n->pos = p;
        n->obj = std::move(e);
        if (peek().type == T::kInt) {  // x.0 = x[0]
          auto it = std::make_unique<Item>();
          it->pos = p;
          it->obj = std::move(n->obj);
          auto l = std::make_unique<Literal>();
          const Token& t = next();
          int64_t index = 0;
          auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), index);
          if (r.ec != std::errc()) fail_at(origin_, t.pos, "integer literal out of range: " + t.text);
          l->v = Value::integer(index);
          it->key = std::move(l);
          e = std::move(it);
          continue;
        }
        n->name = expect_name();
        e = std::move(n);
      } else if (is_op("[")) {
        Pos p = next().pos;
        ExprP a, b, s;
        bool slice = false;
        if (!is_op(":")) a = parse_expr();
        if (is_op(":")) {
          slice = true;
          ++i_;
          if (!is_op("]") && !is_op(":")) b = parse_expr();
          if (is_op(":")) {
            ++i_;
            if (!is_op("]")) s = parse_expr();
          }
        }
        expect_op("]");
        if (slice) {
          auto n = std::make_unique<SliceExpr>();
          n->pos = p;
          n->obj = std::move(e);
          n->start = std::move(a);
          n->stop = std::move(b);
          n->step = std::move(s);
          e = std::move(n);
        } else {
          auto n = std::make_unique<Item>();
          n->pos = p;
          n->obj = std::move(e);
          n->key = std::move(a);
          e = std::move(n);
        }
      } else if (is_op("(")) {
        Pos p = peek().pos;
        auto n = std::make_unique<Call>();
        n->pos = p;
        n->fn = std::move(e);
        n->args = parse_call_args();
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  ExprP parse_filter_expr(ExprP e) {
    while (true) {
      if (is_op("|")) {
        Pos p = next().pos;
        auto n = std::make_unique<FilterExpr>();
        n->pos = p;
        n->e = std::move(e);
        n->name = expect_name();
        while (is_op(".")) {
          ++i_;
          n->name += "." + expect_name();
        }
        if (is_op("(")) n->args = parse_call_args();
        e = std::move(n);
      } else if (is_name("is")) {
        Pos p = next().pos;
        auto n = std::make_unique<TestExpr>();
        n->pos = p;
        n->e = std::move(e);
        if (is_name("not")) {
          ++i_;
          n->negate = true;
        }
        n->name = expect_name();
        if (is_op("(")) {
          n->args = parse_call_args();
        } else if (peek().type == T::kString || peek().type == T::kInt || peek().type == T::kFloat || is_op("[") ||
                   is_op("{") ||
                   (peek().type == T::kName && !is_name("else") && !is_name("and") && !is_name("or") &&
                    !is_name("if") && !is_name("is") && !is_name("in") && !is_name("not"))) {
          n->args.pos.push_back(parse_postfix(parse_primary()));
        }
        e = std::move(n);
      } else if (is_op("(")) {
        Pos p = peek().pos;
        auto n = std::make_unique<Call>();
        n->pos = p;
        n->fn = std::move(e);
        n->args = parse_call_args();
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  const std::string& origin_;
  int loop_depth_ = 0;
  bool has_generation_ = false;
};

// ---- attribute and item access, calls ------------------------------------------------------
Value call_method(Ctx& c, Pos p, const Value& obj, const std::string& name, CallArgs& a);

bool is_method(const Value& obj, const std::string& name) {
  static const char* kStr[] = {"strip", "lstrip", "rstrip", "split", "rsplit", "startswith", "endswith", "upper",
                               "lower", "title", "capitalize", "replace", "find", "rfind", "count", "join",
                               "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "isupper", "islower",
                               "index"};
  static const char* kDict[] = {"items", "keys", "values", "get"};
  static const char* kList[] = {"index", "count"};
  if (obj.is_string()) {
    for (const char* m : kStr)
      if (name == m) return true;
  } else if (obj.k == Value::K::kDict && !obj.dict->ns) {
    for (const char* m : kDict)
      if (name == m) return true;
  } else if (obj.k == Value::K::kList) {
    for (const char* m : kList)
      if (name == m) return true;
  }
  return false;
}

Value bound_method(const Value& obj, const std::string& name, Pos p) {
  Value self = obj;
  return Value::function(name, [self, name, p](CallArgs& a, Ctx& c) { return call_method(c, p, self, name, a); });
}

Value get_attr(Ctx& c, Pos p, const Value& obj, const std::string& name) {
  if (obj.is_undefined()) rt_fail(c, p, undefined_msg(obj) + " (reading ." + name + ")");
  if (obj.k == Value::K::kDict) {
    if (obj.dict->ns) {
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined(name);
    }
    if (is_method(obj, name)) return bound_method(obj, name, p);
    if (const Value* v = obj.dict->find(name)) return *v;
    return Value::undefined(name);
  }
  if (is_method(obj, name)) return bound_method(obj, name, p);
  return Value::undefined(name);
}

Value get_item(Ctx& c, Pos p, const Value& obj, const Value& key) {
  if (obj.is_undefined()) rt_fail(c, p, undefined_msg(obj) + " (reading [" + excerpt(repr(key), 30) + "])");
  if (obj.k == Value::K::kDict) {
    if (key.is_string()) {
      if (const Value* v = obj.dict->find(key.s)) return *v;
      if (!obj.dict->ns && is_method(obj, key.s)) return bound_method(obj, key.s, p);
      return Value::undefined(key.s);
    }
    return Value::undefined(to_str(key));
  }
  if ((obj.k == Value::K::kList || obj.is_string()) && (key.k == Value::K::kInt || key.k == Value::K::kBool)) {
    if (obj.k == Value::K::kList) {
      int64_t n = static_cast<int64_t>(obj.list->size()), i = key.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return Value::undefined("[" + std::to_string(key.as_int()) + "]");
      return (*obj.list)[static_cast<size_t>(i)];
    }
    auto st = cp_starts(obj.s);
    int64_t n = static_cast<int64_t>(st.size()) - 1, i = key.as_int();
    if (i < 0) i += n;
    if (i < 0 || i >= n) return Value::undefined("[" + std::to_string(key.as_int()) + "]");
    return Value::string(obj.s.substr(st[static_cast<size_t>(i)], st[static_cast<size_t>(i) + 1] - st[static_cast<size_t>(i)]));
  }
  if (key.is_string()) return get_attr(c, p, obj, key.s);
  return Value::undefined();
}

Value call_value(Ctx& c, Pos p, const Value& fn, CallArgs& a) {
  if (fn.k == Value::K::kFunc) return fn.func->fn(a, c);
  if (fn.is_undefined()) rt_fail(c, p, undefined_msg(fn) + " (called as a function)");
  rt_fail(c, p, std::string("'") + type_name(fn) + "' object is not callable");
}

const Value* kwarg(CallArgs& a, const char* name) {
  for (auto& kv : a.kw)
    if (kv.first == name) return &kv.second;
  return nullptr;
}

// Positional argument i, or keyword `name`, or null.
const Value* arg(CallArgs& a, size_t i, const char* name) {
  if (i < a.pos.size()) return &a.pos[i];
  return name ? kwarg(a, name) : nullptr;
}

std::string need_str(Ctx& c, Pos p, const Value* v, const char* what) {
  if (!v || !v->is_string()) rt_fail(c, p, std::string(what) + " expects a string argument");
  return v->s;
}

std::vector<std::string> py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (!sep || sep->is_none()) {
    size_t i = 0;
    while (true) {
      while (i < s.size()) {
        size_t n;
        if (!py_isspace(decode_at(s, i, &n))) break;
        i += n;
      }
      if (i >= s.size()) break;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        out.push_back(py_strip(s.substr(i), false, true, nullptr));
        break;
      }
      size_t j = i;
      while (j < s.size()) {
        size_t n;
        if (py_isspace(decode_at(s, j, &n))) break;
        j += n;
      }
      out.push_back(s.substr(i, j - i));
      i = j;
    }
    return out;
  }
  const std::string& d = sep->s;
  size_t i = 0;
  while (true) {
    size_t j = (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) ? std::string::npos : s.find(d, i);
    if (j == std::string::npos) {
      out.push_back(s.substr(i));
      break;
    }
    out.push_back(s.substr(i, j - i));
    i = j + d.size();
  }
  return out;
}

// Simple case mapping: ASCII, Latin-1, Latin Extended-A, Greek and Cyrillic (Python maps all of
// Unicode; chat templates apply upper/lower/title to role names).
uint32_t cp_case(uint32_t c, bool upper) {
  if (c < 0x80) return static_cast<uint32_t>(upper ? std::toupper(static_cast<int>(c)) : std::tolower(static_cast<int>(c)));
  if (upper) {
    if ((c >= 0xE0 && c <= 0xFE && c != 0xF7)) return c - 0x20;
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F)
      return ((c >= 0x139 && c <= 0x148) || c >= 0x179) ? ((c % 2 == 0) ? c - 1 : c) : (c % 2 == 1 ? c - 1 : c);
    if (c >= 0x3B1 && c <= 0x3C9 && c != 0x3C2) return c - 0x20;
    if (c >= 0x430 && c <= 0x44F) return c - 0x20;
    if (c >= 0x450 && c <= 0x45F) return c - 0x50;
  } else {
    if ((c >= 0xC0 && c <= 0xDE && c != 0xD7)) return c + 0x20;
    if (c >= 0x100 && c <= 0x17F && c != 0x130 && c != 0x131 && c != 0x138 && c != 0x149 && c != 0x17F)
      return ((c >= 0x139 && c <= 0x148) || c >= 0x179) ? ((c % 2 == 1) ? c + 1 : c) : (c % 2 == 0 ? c + 1 : c);
    if (c >= 0x391 && c <= 0x3A9) return c + 0x20;
    if (c >= 0x410 && c <= 0x42F) return c + 0x20;
    if (c >= 0x400 && c <= 0x40F) return c + 0x50;
  }
  return c;
}

std::string ascii_case(const std::string& s, bool upper) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    size_t n;
    uint32_t cp = decode_at(s, i, &n);
    if (n == 1 && static_cast<unsigned char>(s[i]) >= 0x80) {
      out += s[i];  // invalid UTF-8 byte: kept
    } else {
      append_utf8(out, cp_case(cp, upper));
    }
    i += n;
  }
  return out;
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  for (char ch : s) {
    unsigned char u = static_cast<unsigned char>(ch);
    bool alpha = std::isalpha(u);
    out += static_cast<char>(alpha ? (prev_cased ? std::tolower(u) : std::toupper(u)) : u);
    prev_cased = alpha;
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  std::string out = ascii_case(s, false);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

Value str_list(const std::vector<std::string>& v) {
  Value l = Value::make_list();
  for (const auto& s : v) l.list->push_back(Value::string(s));
  return l;
}

Value call_method(Ctx& c, Pos p, const Value& obj, const std::string& name, CallArgs& a) {
  if (obj.is_string()) {
    const std::string& s = obj.s;
    auto chars_arg = [&]() -> const std::string* {
      const Value* v = arg(a, 0, "chars");
      return (v && v->is_string()) ? &v->s : nullptr;
    };
    if (name == "strip") return Value::string(py_strip(s, true, true, chars_arg()));
    if (name == "lstrip") return Value::string(py_strip(s, true, false, chars_arg()));
    if (name == "rstrip") return Value::string(py_strip(s, false, true, chars_arg()));
    if (name == "split" || name == "rsplit") {
      const Value* sep = arg(a, 0, "sep");
      const Value* m = arg(a, 1, "maxsplit");
      int64_t maxsplit = m ? m->as_int() : -1;
      if (sep && sep->is_string() && sep->s.empty()) rt_fail(c, p, "empty separator");
      if (name == "rsplit" && maxsplit >= 0) {
        // split from the right: reverse trick on the whole list
        std::vector<std::string> all = py_split(s, sep, -1);
        if (static_cast<int64_t>(all.size()) <= maxsplit + 1) return str_list(all);
        if (!sep || sep->is_none()) return str_list(all);  // whitespace rsplit with maxsplit: rare
        size_t keep = all.size() - static_cast<size_t>(maxsplit);
        std::string head;
        for (size_t i = 0; i < keep; ++i) head += (i ? sep->s : "") + all[i];
        std::vector<std::string> out{head};
        out.insert(out.end(), all.begin() + static_cast<long>(keep), all.end());
        return str_list(out);
      }
      return str_list(py_split(s, sep, maxsplit));
    }
    if (name == "startswith" || name == "endswith") {
      const Value* x = arg(a, 0, nullptr);
      std::vector<std::string> cands;
      if (x && x->k == Value::K::kList) {
        for (const auto& e : *x->list) cands.push_back(need_str(c, p, &e, name.c_str()));
      } else {
        cands.push_back(need_str(c, p, x, name.c_str()));
      }
      for (const auto& cand : cands) {
        if (name == "startswith" ? s.compare(0, cand.size(), cand) == 0
                                 : (s.size() >= cand.size() && s.compare(s.size() - cand.size(), cand.size(), cand) == 0))
          return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (name == "upper") return Value::string(ascii_case(s, true));
    if (name == "lower") return Value::string(ascii_case(s, false));
    if (name == "title") return Value::string(py_title(s));
    if (name == "capitalize") return Value::string(py_capitalize(s));
    if (name == "replace") {
      std::string from = need_str(c, p, arg(a, 0, "old"), "replace"), to = need_str(c, p, arg(a, 1, "new"), "replace");
      const Value* cnt = arg(a, 2, "count");
      int64_t n = cnt ? cnt->as_int() : -1;
      std::string out;
      size_t i = 0;
      if (from.empty()) return Value::string(s);
      while (n != 0) {
        size_t j = s.find(from, i);
        if (j == std::string::npos) break;
        out += s.substr(i, j - i) + to;
        i = j + from.size();
        if (n > 0) --n;
      }
      return Value::string(out + s.substr(i));
    }
    if (name == "find" || name == "rfind" || name == "index") {
      std::string x = need_str(c, p, arg(a, 0, nullptr), name.c_str());
      size_t j = name == "rfind" ? s.rfind(x) : s.find(x);
      if (j == std::string::npos) {
        if (name == "index") rt_fail(c, p, "substring not found");
        return Value::integer(-1);
      }
      return Value::integer(static_cast<int64_t>(cp_starts(s.substr(0, j)).size() - 1));
    }
    if (name == "count") {
      std::string x = need_str(c, p, arg(a, 0, nullptr), "count");
      if (x.empty()) return Value::integer(static_cast<int64_t>(cp_starts(s).size()));
      int64_t n = 0;
      for (size_t j = s.find(x); j != std::string::npos; j = s.find(x, j + x.size())) ++n;
      return Value::integer(n);
    }
    if (name == "join") {
      const Value* x = arg(a, 0, nullptr);
      if (!x) rt_fail(c, p, "join expects an argument");
      std::string out;
      bool first = true;
      for (const auto& e : iterate(c, p, *x)) {
        if (!e.is_string()) rt_fail(c, p, std::string("sequence item: expected str instance, ") + type_name(e) + " found");
        out += (first ? "" : s) + e.s;
        first = false;
      }
      return Value::string(out);
    }
    if (name == "splitlines") {
      std::vector<std::string> out;
      size_t i = 0;
      while (i < s.size()) {
        size_t j = s.find_first_of("\r\n", i);
        if (j == std::string::npos) {
          out.push_back(s.substr(i));
          break;
        }
        out.push_back(s.substr(i, j - i));
        i = j + ((s[j] == '\r' && j + 1 < s.size() && s[j + 1] == '\n') ? 2 : 1);
      }
      return str_list(out);
    }
    auto all_of = [&](auto pred) {
      if (s.empty()) return Value::boolean(false);
      for (char ch : s)
        if (!pred(static_cast<unsigned char>(ch))) return Value::boolean(false);
      return Value::boolean(true);
    };
    if (name == "isdigit") return all_of([](unsigned char ch) { return std::isdigit(ch) != 0; });
    if (name == "isalpha") return all_of([](unsigned char ch) { return std::isalpha(ch) != 0 || ch >= 0x80; });
    if (name == "isalnum") return all_of([](unsigned char ch) { return std::isalnum(ch) != 0 || ch >= 0x80; });
    if (name == "isspace") return all_of([](unsigned char ch) { return std::isspace(ch) != 0; });
    if (name == "isupper") return Value::boolean(s != ascii_case(s, false) && s == ascii_case(s, true));
    if (name == "islower") return Value::boolean(s != ascii_case(s, true) && s == ascii_case(s, false));
  }
  if (obj.k == Value::K::kDict) {
    if (name == "items") {
      Value l = Value::make_list();
      for (const auto& kv : obj.dict->items) {
        Value pair = Value::make_list({Value::string(kv.first), kv.second});
        pair.tuple = true;
        l.list->push_back(pair);
      }
      return l;
    }
    if (name == "keys") {
      Value l = Value::make_list();
      for (const auto& kv : obj.dict->items) l.list->push_back(Value::string(kv.first));
      return l;
    }
    if (name == "values") {
      Value l = Value::make_list();
      for (const auto& kv : obj.dict->items) l.list->push_back(kv.second);
      return l;
    }
    if (name == "get") {
      const Value* k = arg(a, 0, nullptr);
      const Value* d = arg(a, 1, "default");
      if (k && k->is_string())
        if (const Value* v = obj.dict->find(k->s)) return *v;
      return d ? *d : Value::none();
    }
  }
  if (obj.k == Value::K::kList) {
    const Value* x = arg(a, 0, nullptr);
    if (!x) rt_fail(c, p, name + " expects an argument");
    if (name == "count") {
      int64_t n = 0;
      for (const auto& e : *obj.list) n += equal(e, *x) ? 1 : 0;
      return Value::integer(n);
    }
    for (size_t i = 0; i < obj.list->size(); ++i)
      if (equal((*obj.list)[i], *x)) return Value::integer(static_cast<int64_t>(i));
    rt_fail(c, p, excerpt(repr(*x), 30) + " is not in list");
  }
  rt_fail(c, p, std::string("'") + type_name(obj) + "' object has no method '" + name + "'");
}

// ---- filters and tests ---------------------------------------------------------------------
int64_t length_of(Ctx& c, Pos p, const Value& v) {
  switch (v.k) {
    case Value::K::kUndefined: return 0;
    case Value::K::kString: return static_cast<int64_t>(cp_starts(v.s).size() - 1);
    case Value::K::kList: return static_cast<int64_t>(v.list->size());
    case Value::K::kDict: return static_cast<int64_t>(v.dict->items.size());
    default: rt_fail(c, p, std::string("object of type '") + type_name(v) + "' has no len()");
  }
}

// Jinja's attribute lookup for filters like map/selectattr: dotted paths, integer parts index.
Value attr_path(Ctx& c, Pos p, const Value& v, const std::string& path) {
  Value cur = v;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('.', i);
    if (j == std::string::npos) j = path.size();
    std::string part = path.substr(i, j - i);
    if (cur.is_undefined()) return cur;
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char ch) { return std::isdigit(static_cast<unsigned char>(ch)) != 0; });
    int64_t index = 0;
    if (digits && std::from_chars(part.data(), part.data() + part.size(), index).ec != std::errc())
      rt_fail(c, p, "index out of range: " + part);
    cur = digits ? get_item(c, p, cur, Value::integer(index)) : get_item(c, p, cur, Value::string(part));
    i = j + 1;
  }
  return cur;
}

Value sorted(Ctx& c, Pos p, std::vector<Value> items, bool reverse, bool case_sensitive, const std::string& attribute) {
  auto key = [&](const Value& v) {
    Value k = attribute.empty() ? v : attr_path(c, p, v, attribute);
    if (!case_sensitive && k.is_string()) k.s = ascii_case(k.s, false);
    return k;
  };
  std::vector<std::pair<Value, Value>> kv;
  for (auto& v : items) kv.emplace_back(key(v), v);
  std::stable_sort(kv.begin(), kv.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(c, p, y.first, x.first, "<") < 0 : compare(c, p, x.first, y.first, "<") < 0;
  });
  Value out = Value::make_list();
  for (auto& e : kv) out.list->push_back(e.second);
  return out;
}

bool apply_test(Ctx& c, Pos p, const std::string& name, const Value& v, CallArgs& a) {
  const Value* x = arg(a, 0, nullptr);
  auto need = [&]() -> const Value& {
    if (!x) rt_fail(c, p, "test '" + name + "' needs an argument");
    return *x;
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.k == Value::K::kInt || v.k == Value::K::kFloat;
  if (name == "integer") return v.k == Value::K::kInt;
  if (name == "float") return v.k == Value::K::kFloat;
  if (name == "boolean") return v.k == Value::K::kBool;
  if (name == "true") return v.k == Value::K::kBool && v.b;
  if (name == "false") return v.k == Value::K::kBool && !v.b;
  if (name == "mapping") return v.k == Value::K::kDict;
  if (name == "sequence") return v.k == Value::K::kList || v.is_string() || (v.k == Value::K::kDict && !v.dict->ns);
  if (name == "iterable") return v.k == Value::K::kList || v.is_string() || v.k == Value::K::kDict;
  if (name == "callable") return v.k == Value::K::kFunc;
  if (name == "odd" || name == "even") {
    if (v.k != Value::K::kInt && v.k != Value::K::kBool) rt_fail(c, p, "test '" + name + "' needs an integer");
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") return need().as_int() != 0 && v.as_int() % need().as_int() == 0;
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, need());
  if (name == "ne" || name == "!=") return !equal(v, need());
  if (name == "lt" || name == "lessthan" || name == "<") return compare(c, p, v, need(), "<") < 0;
  if (name == "le" || name == "<=") return compare(c, p, v, need(), "<=") <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return compare(c, p, v, need(), ">") > 0;
  if (name == "ge" || name == ">=") return compare(c, p, v, need(), ">=") >= 0;
  if (name == "in") return contains(c, p, need(), v);
  if (name == "sameas") {
    const Value& o = need();
    if (v.k != o.k) return false;
    if (v.k == Value::K::kList) return v.list == o.list;
    if (v.k == Value::K::kDict) return v.dict == o.dict;
    return equal(v, o);
  }
  if (name == "lower") return v.is_string() && v.s == ascii_case(v.s, false);
  if (name == "upper") return v.is_string() && v.s == ascii_case(v.s, true);
  rt_fail(c, p, "unknown test '" + name + "'");
}

Value select_like(Ctx& c, Pos p, const std::string& name, const Value& v, CallArgs& a) {
  const bool by_attr = name == "selectattr" || name == "rejectattr";
  const bool keep_true = name == "select" || name == "selectattr";
  size_t k = 0;
  std::string attribute;
  if (by_attr) {
    if (a.pos.empty() || !a.pos[0].is_string()) rt_fail(c, p, name + " needs an attribute name");
    attribute = a.pos[0].s;
    k = 1;
  }
  std::string test;
  CallArgs targs;
  if (a.pos.size() > k) {
    if (!a.pos[k].is_string()) rt_fail(c, p, name + ": the test name must be a string");
    test = a.pos[k].s;
    targs.pos.assign(a.pos.begin() + static_cast<long>(k + 1), a.pos.end());
  }
  Value out = Value::make_list();
  for (const auto& e : iterate(c, p, v)) {
    Value x = by_attr ? attr_path(c, p, e, attribute) : e;
    bool r = test.empty() ? truthy(x) : apply_test(c, p, test, x, targs);
    if (r == keep_true) out.list->push_back(e);
  }
  return out;
}

Value apply_filter(Ctx& c, Pos p, const std::string& name, const Value& v, CallArgs& a) {
  auto undefined_error = [&] {
    if (v.is_undefined()) rt_fail(c, p, undefined_msg(v) + " (filter '" + name + "')");
  };
  if (name == "trim") {
    const Value* chars = arg(a, 0, "chars");
    return Value::string(py_strip(to_str(v), true, true, (chars && chars->is_string()) ? &chars->s : nullptr));
  }
  if (name == "upper") return Value::string(ascii_case(to_str(v), true));
  if (name == "lower") return Value::string(ascii_case(to_str(v), false));
  if (name == "title") return Value::string(py_title(to_str(v)));
  if (name == "capitalize") return Value::string(py_capitalize(to_str(v)));
  if (name == "length" || name == "count") return Value::integer(length_of(c, p, v));
  if (name == "string") return v.is_string() ? v : Value::string(to_str(v));
  if (name == "safe" || name == "e" || name == "escape" || name == "forceescape") {
    if (name == "safe") return v;
    std::string s = to_str(v), out;
    for (char ch : s) {
      switch (ch) {
        case '&': out += "&amp;"; break;
        case '<': out += "&lt;"; break;
        case '>': out += "&gt;"; break;
        case '"': out += "&#34;"; break;
        case '\'': out += "&#39;"; break;
        default: out += ch;
      }
    }
    return Value::string(out);
  }
  if (name == "tojson") {
    JsonFormat f;
    const Value* ind = arg(a, 0, "indent");
    if (ind && !ind->is_none()) {
      f.indent = static_cast<int>(ind->as_int());
      f.item_sep = ",";
    }
    if (const Value* sep = kwarg(a, "separators"); sep && sep->k == Value::K::kList && sep->list->size() == 2) {
      f.item_sep = (*sep->list)[0].s;
      f.key_sep = (*sep->list)[1].s;
    }
    if (const Value* sk = kwarg(a, "sort_keys")) f.sort_keys = truthy(*sk);
    undefined_error();
    std::string out;
    try {
      to_json(out, v, f, 0);
    } catch (const std::runtime_error& e) {
      rt_fail(c, p, e.what());
    }
    return Value::string(out);
  }
  if (name == "default" || name == "d") {
    const Value* dflt = arg(a, 0, "default_value");
    const Value* boolean = arg(a, 1, "boolean");
    bool use = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
    return use ? (dflt ? *dflt : Value::string("")) : v;
  }
  if (name == "first" || name == "last") {
    auto items = iterate(c, p, v);
    if (items.empty()) return Value::undefined("first item");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::make_list(iterate(c, p, v));
  if (name == "join") {
    const Value* sep = arg(a, 0, "d");
    const Value* attribute = arg(a, 1, "attribute");
    std::string out;
    bool first = true;
    for (const auto& e : iterate(c, p, v)) {
      out += (first ? "" : (sep ? to_str(*sep) : "")) + to_str(attribute ? attr_path(c, p, e, to_str(*attribute)) : e);
      first = false;
    }
    return Value::string(out);
  }
  if (name == "replace") {
    CallArgs ra;
    ra.pos = a.pos;
    return call_method(c, p, Value::string(to_str(v)), "replace", ra);
  }
  if (name == "int") {
    if (v.is_number()) return Value::integer(v.as_int());
    if (v.is_string()) {
      std::string s = py_strip(v.s, true, true, nullptr);
      int64_t x = 0;
      auto r = std::from_chars(s.data(), s.data() + s.size(), x);
      if (r.ec == std::errc() && r.ptr == s.data() + s.size()) return Value::integer(x);
      char* end = nullptr;
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) return Value::integer(static_cast<int64_t>(d));
    }
    const Value* d = arg(a, 0, "default");
    return d ? *d : Value::integer(0);
  }
  if (name == "float") {
    if (v.is_number()) return Value::number(v.as_double());
    if (v.is_string()) {
      char* end = nullptr;
      std::string s = py_strip(v.s, true, true, nullptr);
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) return Value::number(d);
    }
    const Value* d = arg(a, 0, "default");
    return d ? *d : Value::number(0.0);
  }
  if (name == "abs") {
    if (!v.is_number()) rt_fail(c, p, std::string("bad operand type for abs(): '") + type_name(v) + "'");
    return v.k == Value::K::kFloat ? Value::number(std::fabs(v.f)) : Value::integer(std::llabs(v.as_int()));
  }
  if (name == "round") {
    const Value* prec = arg(a, 0, "precision");
    const Value* method = arg(a, 1, "method");
    double m = std::pow(10.0, prec ? static_cast<double>(prec->as_int()) : 0.0);
    std::string how = method ? to_str(*method) : "common";
    double x = v.as_double() * m;
    double r = how == "ceil" ? std::ceil(x) : how == "floor" ? std::floor(x) : std::nearbyint(x);  // Python: half to even
    return Value::number(r / m);
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto st = cp_starts(v.s);
      std::string out;
      for (size_t i = st.size() - 1; i > 0; --i) out += v.s.substr(st[i - 1], st[i] - st[i - 1]);
      return Value::string(out);
    }
    auto items = iterate(c, p, v);
    std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (name == "items") {
    if (v.is_undefined()) return Value::make_list();
    if (v.k != Value::K::kDict) rt_fail(c, p, "filter 'items' needs a mapping");
    CallArgs none;
    return call_method(c, p, v, "items", none);
  }
  if (name == "dictsort") {
    if (v.k != Value::K::kDict) rt_fail(c, p, "filter 'dictsort' needs a mapping");
    const Value* cs = arg(a, 0, "case_sensitive");
    const Value* by = arg(a, 1, "by");
    const Value* rev = arg(a, 2, "reverse");
    CallArgs none;
    Value items = call_method(c, p, v, "items", none);
    return sorted(c, p, *items.list, rev && truthy(*rev), cs && truthy(*cs), (by && to_str(*by) == "value") ? "1" : "0");
  }
  if (name == "sort") {
    const Value* rev = arg(a, 0, "reverse");
    const Value* cs = arg(a, 1, "case_sensitive");
    const Value* at = arg(a, 2, "attribute");
    return sorted(c, p, iterate(c, p, v), rev && truthy(*rev), cs && truthy(*cs), at ? to_str(*at) : "");
  }
  if (name == "unique") {
    Value out = Value::make_list();
    const Value* at = kwarg(a, "attribute");
    std::vector<Value> seen;
    for (const auto& e : iterate(c, p, v)) {
      Value k = at ? attr_path(c, p, e, to_str(*at)) : e;
      if (k.is_string()) k.s = ascii_case(k.s, false);
      bool dup = false;
      for (const auto& s : seen) dup = dup || equal(s, k);
      if (!dup) {
        seen.push_back(k);
        out.list->push_back(e);
      }
    }
    return out;
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") return select_like(c, p, name, v, a);
  if (name == "map") {
    Value out = Value::make_list();
    const Value* at = kwarg(a, "attribute");
    const Value* dflt = kwarg(a, "default");
    for (const auto& e : iterate(c, p, v)) {
      if (at) {
        Value x = attr_path(c, p, e, to_str(*at));
        out.list->push_back((x.is_undefined() && dflt) ? *dflt : x);
      } else {
        if (a.pos.empty() || !a.pos[0].is_string()) rt_fail(c, p, "map needs a filter name or attribute=");
        CallArgs fa;
        fa.pos.assign(a.pos.begin() + 1, a.pos.end());
        fa.kw = a.kw;
        out.list->push_back(apply_filter(c, p, a.pos[0].s, e, fa));
      }
    }
    return out;
  }
  if (name == "attr") {
    const Value* n = arg(a, 0, "name");
    return get_attr(c, p, v, need_str(c, p, n, "attr"));
  }
  if (name == "sum") {
    const Value* at = arg(a, 0, "attribute");
    const Value* start = arg(a, 1, "start");
    Value total = start ? *start : Value::integer(0);
    for (const auto& e : iterate(c, p, v)) total = binary(c, p, "+", total, at ? attr_path(c, p, e, to_str(*at)) : e);
    return total;
  }
  if (name == "min" || name == "max") {
    auto items = iterate(c, p, v);
    if (items.empty()) return Value::undefined(name + " of an empty sequence");
    const Value* at = kwarg(a, "attribute");
    Value best = items[0];
    for (const auto& e : items) {
      Value ka = at ? attr_path(c, p, e, to_str(*at)) : e, kb = at ? attr_path(c, p, best, to_str(*at)) : best;
      int cmp = compare(c, p, ka, kb, "<");
      if (name == "min" ? cmp < 0 : cmp > 0) best = e;
    }
    return best;
  }
  if (name == "indent") {
    const Value* w = arg(a, 0, "width");
    const Value* first = arg(a, 1, "first");
    const Value* blank = arg(a, 2, "blank");
    std::string pad = (w && w->is_string()) ? w->s : std::string(static_cast<size_t>(w ? w->as_int() : 4), ' ');
    std::string s = to_str(v), out;
    size_t i = 0;
    bool first_line = true;
    while (i <= s.size()) {
      size_t j = s.find('\n', i);
      std::string line = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
      bool add = first_line ? (first && truthy(*first)) : (!line.empty() || (blank && truthy(*blank)));
      if (add) out += pad;
      out += line;
      if (j == std::string::npos) break;
      out += '\n';
      i = j + 1;
      first_line = false;
    }
    return Value::string(out);
  }
  if (name == "wordcount") return Value::integer(static_cast<int64_t>(py_split(to_str(v), nullptr, -1).size()));
  rt_fail(c, p, "unknown filter '" + name + "'");
}

// ---- globals -------------------------------------------------------------------------------
void add_globals(std::unordered_map<std::string, Value>& g) {
  g["raise_exception"] = Value::function("raise_exception", [](CallArgs& a, Ctx&) -> Value {
    std::string msg = a.pos.empty() ? "" : to_str(a.pos[0]);
    throw TemplateError("chat template raised an exception: " + msg, msg, true);
  });
  g["range"] = Value::function("range", [](CallArgs& a, Ctx& c) -> Value {
    int64_t start = 0, stop = 0, step = 1;
    if (a.pos.size() == 1) {
      stop = a.pos[0].as_int();
    } else if (a.pos.size() >= 2) {
      start = a.pos[0].as_int();
      stop = a.pos[1].as_int();
      if (a.pos.size() >= 3) step = a.pos[2].as_int();
    }
    if (step == 0) rt_fail(c, Pos{}, "range() arg 3 must not be zero");
    Value l = Value::make_list();
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
      l.list->push_back(Value::integer(i));
      if (l.list->size() > 1000000) rt_fail(c, Pos{}, "range() longer than 1,000,000 items");
    }
    return l;
  });
  g["namespace"] = Value::function("namespace", [](CallArgs& a, Ctx&) -> Value {
    Value ns = Value::make_dict(true);
    for (const auto& v : a.pos)
      if (v.k == Value::K::kDict)
        for (const auto& kv : v.dict->items) ns.dict->set(kv.first, kv.second);
    for (const auto& kv : a.kw) ns.dict->set(kv.first, kv.second);
    return ns;
  });
  g["dict"] = Value::function("dict", [](CallArgs& a, Ctx&) -> Value {
    Value d = Value::make_dict();
    for (const auto& v : a.pos)
      if (v.k == Value::K::kDict)
        for (const auto& kv : v.dict->items) d.dict->set(kv.first, kv.second);
    for (const auto& kv : a.kw) d.dict->set(kv.first, kv.second);
    return d;
  });
  g["strftime_now"] = Value::function("strftime_now", [](CallArgs& a, Ctx&) -> Value {
    std::string fmt = a.pos.empty() ? "" : to_str(a.pos[0]);
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return Value::string(std::string(buf, n));
  });
}

}  // namespace

struct Template::Impl {
  std::string origin;
  Body body;
  bool has_generation = false;
};

Template::Template(std::string_view source, std::string origin) : impl_(std::make_unique<Impl>()) {
  impl_->origin = std::move(origin);
  Lexer lx(source, impl_->origin);
  Parser ps(lx.run(), impl_->origin);
  impl_->body = ps.parse_template(&impl_->has_generation);
}

Template::~Template() = default;

bool Template::has_generation_blocks() const { return impl_->has_generation; }
const std::string& Template::origin() const { return impl_->origin; }

Rendered Template::render(const nlohmann::ordered_json& variables) const {
  Rendered r;
  Ctx c{impl_->origin, &r.text, &r.generation, {}, 0};
  c.frames.emplace_back();
  add_globals(c.frames[0]);
  if (variables.is_object())
    for (auto it = variables.begin(); it != variables.end(); ++it) c.frames[0][it.key()] = from_json(it.value());
  exec_body(impl_->body, c);
  return r;
}

}  // namespace ciuic::jinja
