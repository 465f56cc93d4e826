// Python's string formatting for the Jinja engine: `fmt % args` (printf-style, str.__mod__, also
// the `format` filter) and str.format() with the format mini-language, as chat templates use
// them ('%s', '%d', '%.2f', '%(name)s', '{}', '{0}', '{name}', '{:>8}', '{:.2f}', '{:,}').
// Errors are Python's messages. Every piece is sized against Limits::max_string_bytes before it
// is made (a width of 10**9 is an error, not a gigabyte).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <optional>

#include "jinja/builtins.h"
#include "jinja/text.h"

namespace ciuic::jinja {

namespace {

// One replacement's format: printf flags or the mini-language's fields.
struct Spec {
  char fill = ' ';
  char align = 0;   // '<', '>', '^', '=' (0: the type's default)
  char sign = '-';  // '+', ' ', '-'
  bool alt = false;
  bool zero = false;
  bool comma = false;
  int64_t width = -1;
  int64_t precision = -1;
  char type = 0;  // 0: the value's default
};

std::string with_commas(const std::string& digits) {
  std::string out;
  const size_t n = digits.size();
  for (size_t i = 0; i < n; ++i) {
    if (i > 0 && (n - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// Pads `body` (its sign/prefix `head` kept in front for '=' alignment) to spec.width.
std::string pad(Ctx& c, const std::string& head, const std::string& body, const Spec& s,
                char default_align) {
  const size_t len = cp_count(head) + cp_count(body);
  const size_t width = s.width > 0 ? static_cast<size_t>(s.width) : 0;
  if (width <= len) return head + body;
  c.budget.check_length(width + head.size() + body.size(), "a formatted value");
  const size_t n = width - len;
  const char align = s.align ? s.align : default_align;
  const std::string fill(1, s.fill);
  auto rep = [&](size_t k) {
    std::string r;
    for (size_t i = 0; i < k; ++i) r += fill;
    return r;
  };
  switch (align) {
    case '<': return head + body + rep(n);
    case '^': return rep(n / 2) + head + body + rep(n - n / 2);
    case '=': return head + rep(n) + body;
    default: return rep(n) + head + body;
  }
}

[[noreturn]] void type_error(Ctx& c, Pos p, const std::string& msg) { rt_fail(c, p, msg); }

// A number formatted with type d/x/X/o/b (integers) or e/E/f/F/g/G/% (floats).
std::string format_number(Ctx& c, Pos p, const Value& v, Spec s, bool percent_style) {
  const char t = s.type;
  std::string head, body;
  bool negative = false;
  if (t == 'd' || t == 'i' || t == 'u' || t == 'x' || t == 'X' || t == 'o' || t == 'b' ||
      t == 'n') {
    int64_t x = 0;
    if (v.k == Value::K::kFloat) {
      if (!percent_style || t == 'x' || t == 'X' || t == 'o')
        type_error(c, p,
                   percent_style
                       ? std::string("%") + t + " format: an integer is required, not float"
                       : std::string("Unknown format code '") + t + "' for object of type 'float'");
      if (!std::isfinite(v.f))
        type_error(c, p, "cannot convert float " + py_float(v.f) + " to integer");
      if (!(std::fabs(v.f) < 9.2e18))
        rt_fail(c, p,
                "integer overflow: int(" + py_float(v.f) +
                    ") is past 64 bits (ciuic's templates compute with "
                    "64-bit integers where Python's grow)");
      x = static_cast<int64_t>(v.f);
    } else {
      x = v.as_int();
    }
    negative = x < 0;
    const uint64_t u = negative ? 0 - static_cast<uint64_t>(x) : static_cast<uint64_t>(x);
    char buf[80];
    const char* fmt = (t == 'x') ? "%llx" : (t == 'X') ? "%llX" : (t == 'o') ? "%llo" : "%llu";
    if (t == 'b') {
      std::string bits;
      for (uint64_t k = u; k; k >>= 1) bits.insert(bits.begin(), static_cast<char>('0' + (k & 1)));
      body = bits.empty() ? "0" : bits;
    } else {
      std::snprintf(buf, sizeof buf, fmt, static_cast<unsigned long long>(u));
      body = buf;
    }
    if (s.comma && (t == 'd' || t == 'n')) body = with_commas(body);
    if (s.alt)
      head = (t == 'x') ? "0x" : (t == 'X') ? "0X" : (t == 'o') ? "0o" : (t == 'b') ? "0b" : "";
  } else {
    double x = v.as_double();
    negative = std::signbit(x) && !std::isnan(x);
    x = std::fabs(x);
    const int prec = static_cast<int>(s.precision < 0 ? 6 : std::min<int64_t>(s.precision, 300));
    char spec[16];
    char buf[700];
    const char ct = t == '%' ? 'f' : t;
    std::snprintf(spec, sizeof spec, s.alt ? "%%#.%d%c" : "%%.%d%c", prec, ct);
    if (std::isinf(x) || std::isnan(x)) {
      body = std::isnan(x) ? "nan" : "inf";
      if (t == 'E' || t == 'F' || t == 'G') body = std::isnan(x) ? "NAN" : "INF";
    } else if (x >= 1e300 && (ct == 'f' || ct == 'F')) {
      rt_fail(c, p, "a formatted float would be too long (ciuic's limit)");
    } else {
      std::snprintf(buf, sizeof buf, spec, t == '%' ? x * 100 : x);
      body = buf;
    }
    if (s.comma) {
      const size_t dot = body.find_first_of(".eE");
      body = with_commas(body.substr(0, dot)) + (dot == std::string::npos ? "" : body.substr(dot));
    }
    if (t == '%') body += '%';
  }
  const std::string sign = negative ? "-" : s.sign == '+' ? "+" : s.sign == ' ' ? " " : "";
  Spec z = s;
  if (s.zero && !s.align) {
    z.fill = '0';
    z.align = '=';
  }
  return pad(c, sign + head, body, z, '>');
}

// str(v) / repr(v), or a number, formatted as `s` says (type 0: the value's default form).
std::string format_one(Ctx& c, Pos p, const Value& v, Spec s, bool percent_style, bool escape) {
  char t = s.type;
  if (t == 0)
    t = (v.is_number() && v.k != Value::K::kBool && !percent_style)
            ? (v.k == Value::K::kFloat ? 'G' : 'd')
            : 's';
  if (t == 'G' && s.type == 0) {  // format(1.5) = str(1.5); with a precision, general format
    if (s.precision < 0) {
      const bool negative = std::signbit(v.f) && !std::isnan(v.f);
      const std::string sign = negative ? "-" : s.sign == '+' ? "+" : s.sign == ' ' ? " " : "";
      Spec z = s;
      if (s.zero && !s.align) {
        z.fill = '0';
        z.align = '=';
      }
      return pad(c, sign, py_float(std::fabs(v.f)), z, '>');
    }
    t = 'g';
  }
  if (t == 's' || t == 'r' || t == 'a') {
    if (!percent_style && t == 's' && v.is_number() && v.k != Value::K::kBool && s.type == 's')
      type_error(c, p,
                 std::string("Unknown format code 's' for object of type '") + type_name(v) + "'");
    std::string text = t == 's' ? to_str(v) : repr(v);
    if (escape && !(t == 's' && v.is_string() && v.markup)) text = html_escape(text);
    if (s.precision >= 0) {
      const auto st = cp_starts(text);
      if (static_cast<size_t>(s.precision) < st.size() - 1)
        text = text.substr(0, st[static_cast<size_t>(s.precision)]);
    }
    return pad(c, "", text, s,
               (percent_style || !v.is_number()) ? (percent_style ? '>' : '<') : '>');
  }
  if (t == 'c') {
    std::string ch;
    if (v.is_string() && cp_count(v.s) == 1) {
      ch = v.s;
    } else if (v.is_int() && v.as_int() >= 0 && v.as_int() <= 0x10FFFF) {
      append_utf8(ch, static_cast<uint32_t>(v.as_int()));
    } else {
      type_error(c, p,
                 percent_style
                     ? "%c requires an int or a unicode character, not " + std::string(type_name(v))
                     : "%c arg not in range(0x110000)");
    }
    return pad(c, "", ch, s, percent_style ? '>' : '<');
  }
  if (std::string_view("diuxXobneEfFgG%").find(t) == std::string_view::npos)
    type_error(
        c, p,
        std::string("Unknown format code '") + t + "' for object of type '" + type_name(v) + "'");
  if (!v.is_number()) {
    if (percent_style)
      type_error(c, p,
                 std::string("%") + t + " format: " +
                     ((t == 'x' || t == 'X' || t == 'o') ? "an integer is required, not "
                                                         : "a real number is required, not ") +
                     type_name(v));
    type_error(
        c, p,
        std::string("Unknown format code '") + t + "' for object of type '" + type_name(v) + "'");
  }
  s.type = t;
  return format_number(c, p, v, s, percent_style);
}

int64_t digits_at(const std::string& f, size_t& i) {
  int64_t n = 0;
  while (i < f.size() && f[i] >= '0' && f[i] <= '9') {
    n = std::min<int64_t>(n * 10 + (f[i] - '0'), int64_t{1} << 40);
    ++i;
  }
  return n;
}

// The mini-language: [[fill]align][sign][#][0][width][,][.precision][type].
Spec parse_spec(Ctx& c, Pos p, const std::string& f) {
  Spec s;
  size_t i = 0;
  auto is_align = [](char ch) { return ch == '<' || ch == '>' || ch == '^' || ch == '='; };
  if (f.size() >= 2 && is_align(f[1]) && (static_cast<unsigned char>(f[0]) < 0x80)) {
    s.fill = f[0];
    s.align = f[1];
    i = 2;
  } else if (!f.empty() && is_align(f[0])) {
    s.align = f[0];
    i = 1;
  }
  if (i < f.size() && (f[i] == '+' || f[i] == '-' || f[i] == ' ')) s.sign = f[i++];
  if (i < f.size() && f[i] == '#') {
    s.alt = true;
    ++i;
  }
  if (i < f.size() && f[i] == '0') {
    s.zero = true;
    ++i;
  }
  if (i < f.size() && f[i] >= '0' && f[i] <= '9') s.width = digits_at(f, i);
  if (i < f.size() && f[i] == ',') {
    s.comma = true;
    ++i;
  }
  if (i < f.size() && f[i] == '.') {
    ++i;
    if (i >= f.size() || f[i] < '0' || f[i] > '9')
      rt_fail(c, p, "Format specifier missing precision");
    s.precision = digits_at(f, i);
  }
  if (i < f.size()) s.type = f[i++];
  if (i < f.size()) rt_fail(c, p, "Invalid format specifier '" + excerpt(f, 40) + "'");
  return s;
}

}  // namespace

Value percent_format(Ctx& c, Pos p, const Value& fmt_value, const Value& args) {
  const std::string& f = fmt_value.s;
  const bool escape = fmt_value.markup;  // Markup % args escapes the arguments
  std::vector<Value> positional;
  const bool tuple = args.is_list() && args.tuple;
  const bool mapping = args.k == Value::K::kDict && !args.dict->ns;
  if (tuple)
    positional = *args.list;
  else
    positional.push_back(args);
  size_t next = 0;
  bool used_mapping = false;
  std::string out;
  c.budget.charge(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    if (f[i] != '%') {
      out += f[i];
      continue;
    }
    const size_t start = i++;
    if (i >= f.size()) rt_fail(c, p, "incomplete format");
    if (f[i] == '%') {
      out += '%';
      continue;
    }
    std::optional<Value> keyed;
    if (f[i] == '(') {
      const size_t close = f.find(')', i);
      if (close == std::string::npos) rt_fail(c, p, "incomplete format key");
      if (!mapping) rt_fail(c, p, "format requires a mapping");
      const std::string key = f.substr(i + 1, close - i - 1);
      const Value* v = args.dict->find(key);
      if (!v) rt_fail(c, p, py_repr_str(key));  // Python's KeyError
      keyed = *v;
      used_mapping = true;
      i = close + 1;
    }
    Spec s;
    for (; i < f.size(); ++i) {
      const char ch = f[i];
      if (ch == '-')
        s.align = '<';
      else if (ch == '+')
        s.sign = '+';
      else if (ch == ' ')
        s.sign = s.sign == '+' ? '+' : ' ';
      else if (ch == '#')
        s.alt = true;
      else if (ch == '0')
        s.zero = true;
      else
        break;
    }
    if (i < f.size() && f[i] == '*')
      rt_fail(c, p, "* wants int (a width from the arguments: not supported by ciuic)");
    if (i < f.size() && f[i] >= '0' && f[i] <= '9') s.width = digits_at(f, i);
    if (i < f.size() && f[i] == '.') {
      ++i;
      s.precision = digits_at(f, i);
    }
    while (i < f.size() && (f[i] == 'h' || f[i] == 'l' || f[i] == 'L')) ++i;
    if (i >= f.size()) rt_fail(c, p, "incomplete format");
    char t = f[i];
    if (std::string_view("sraciduoxXeEfFgG").find(t) == std::string_view::npos) {
      char b[16];
      std::snprintf(b, sizeof b, "0x%x", static_cast<unsigned char>(t));
      rt_fail(c, p,
              std::string("unsupported format character '") +
                  (static_cast<unsigned char>(t) < 0x80 ? std::string(1, t) : "?") + "' (" + b +
                  ") at index " + std::to_string(i));
    }
    if (s.align == '<') s.zero = false;
    s.type = t == 'i' || t == 'u' ? 'd' : t;
    Value v;
    if (keyed) {
      v = *keyed;
    } else {
      if (next >= positional.size()) rt_fail(c, p, "not enough arguments for format string");
      v = positional[next++];
    }
    (void)start;
    const std::string piece = format_one(c, p, v, s, true, escape);
    limit_string(out.size() + piece.size(), "a formatted string");
    out += piece;
  }
  if (!used_mapping && !mapping && next < positional.size())
    rt_fail(c, p, "not all arguments converted during string formatting");
  Value r = Value::string(std::move(out));
  r.markup = escape;
  return r;
}

std::string str_format(Ctx& c, Pos p, const std::string& f, CallArgs& a) {
  std::string out;
  size_t auto_index = 0;
  bool manual = false, automatic = false;
  c.budget.charge(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    const char ch = f[i];
    if (ch == '}') {
      if (i + 1 < f.size() && f[i + 1] == '}') {
        out += '}';
        ++i;
        continue;
      }
      rt_fail(c, p, "Single '}' encountered in format string");
    }
    if (ch != '{') {
      out += ch;
      continue;
    }
    if (i + 1 < f.size() && f[i + 1] == '{') {
      out += '{';
      ++i;
      continue;
    }
    const size_t close = f.find('}', i);
    if (close == std::string::npos) rt_fail(c, p, "Single '{' encountered in format string");
    std::string field = f.substr(i + 1, close - i - 1);
    if (field.find('{') != std::string::npos)
      rt_fail(c, p, "nested replacement fields are not supported by ciuic");
    i = close;
    std::string spec;
    char conv = 0;
    if (size_t colon = field.find(':'); colon != std::string::npos) {
      spec = field.substr(colon + 1);
      field.resize(colon);
    }
    if (size_t bang = field.find('!'); bang != std::string::npos) {
      if (bang + 2 != field.size()) rt_fail(c, p, "expected ':' after conversion specifier");
      conv = field[bang + 1];
      if (conv != 'r' && conv != 's' && conv != 'a')
        rt_fail(c, p, std::string("Unknown conversion specifier ") + conv);
      field.resize(bang);
    }
    size_t k = 0;
    while (k < field.size() && field[k] != '.' && field[k] != '[') ++k;
    const std::string name = field.substr(0, k);
    Value v;
    if (name.empty() ||
        std::all_of(name.begin(), name.end(), [](char d) { return d >= '0' && d <= '9'; })) {
      size_t index;
      if (name.empty()) {
        if (manual)
          rt_fail(c, p,
                  "cannot switch from manual field specification to automatic field numbering");
        automatic = true;
        index = auto_index++;
      } else {
        if (automatic)
          rt_fail(c, p,
                  "cannot switch from automatic field numbering to manual field specification");
        manual = true;
        size_t at = 0;
        index = static_cast<size_t>(digits_at(name, at));
      }
      if (index >= a.pos.size())
        rt_fail(c, p,
                "tuple index out of range");  // jinja2's SandboxedFormatter (string.Formatter)
      v = a.pos[index];
    } else {
      const Value* kv = kwarg(a, name.c_str());
      if (!kv) rt_fail(c, p, py_repr_str(name));  // Python's KeyError
      v = *kv;
    }
    while (k < field.size()) {  // .attr and [key], through the sandbox's attribute and item lookup
      if (field[k] == '.') {
        size_t e = k + 1;
        while (e < field.size() && field[e] != '.' && field[e] != '[') ++e;
        v = get_attr(c, p, v, field.substr(k + 1, e - k - 1));
        k = e;
      } else {
        const size_t e = field.find(']', k);
        if (e == std::string::npos) rt_fail(c, p, "Missing ']' in format string");
        const std::string key = field.substr(k + 1, e - k - 1);
        const bool digits = !key.empty() && std::all_of(key.begin(), key.end(), [](char d) {
          return d >= '0' && d <= '9';
        });
        size_t at = 0;
        v = get_item(c, p, v, digits ? Value::integer(digits_at(key, at)) : Value::string(key));
        k = e + 1;
      }
    }
    if (v.is_undefined()) rt_fail(c, p, undefined_msg(v));
    Spec s = parse_spec(c, p, spec);
    std::string piece;
    if (conv) {
      Value text = Value::string(conv == 's' ? to_str(v) : repr(v));
      piece = format_one(c, p, text, s, false, false);
    } else {
      piece = format_one(c, p, v, s, false, false);
    }
    limit_string(out.size() + piece.size(), "a formatted string");
    out += piece;
  }
  return out;
}

}  // namespace ciuic::jinja
