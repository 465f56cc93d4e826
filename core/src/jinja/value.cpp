#include "jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>

namespace ciuic::jinja {

using json = nlohmann::ordered_json;

void fail_at(const std::string& origin, Pos p, const std::string& msg) {
  throw TemplateError(
      origin + ":" + std::to_string(p.line) + ":" + std::to_string(p.col) + ": " + msg, msg, false);
}

std::string excerpt(std::string_view s, size_t max) {
  if (s.size() <= max) return std::string(s);
  while (max > 0 && (static_cast<unsigned char>(s[max]) & 0xC0) == 0x80)
    --max;  // a whole code point
  return std::string(s.substr(0, max)) + "...";
}

// ---- budget --------------------------------------------------------------------------------
namespace {
thread_local Budget* t_budget = nullptr;

std::string mib(int64_t bytes) {
  return bytes % (1 << 20) == 0 ? std::to_string(bytes >> 20) + " MiB"
                                : std::to_string(bytes) + " bytes";
}

int value_depth_limit() {
  return t_budget ? t_budget->limits.max_value_depth : Limits{}.max_value_depth;
}
}  // namespace

Budget* budget() { return t_budget; }
BudgetScope::BudgetScope(Budget* b) : saved_(t_budget) { t_budget = b; }
BudgetScope::~BudgetScope() { t_budget = saved_; }

void Budget::fail(const std::string& msg) const {
  fail_at(origin ? *origin : std::string("<template>"), at, msg);
}

void Budget::step(Pos p) {
  at = p;
  if (++steps > limits.max_steps)
    fail("the template ran past " + std::to_string(limits.max_steps) +
         " evaluation steps (ciuic's work limit for one render; docs/tokenizer.md)");
  if (bytes > limits.max_bytes) over_bytes();
}

void Budget::over_bytes() const {
  fail("the template made, copied or scanned more than " + mib(limits.max_bytes) +
       " (ciuic's memory and work limit for one render; docs/tokenizer.md)");
}

void Budget::check_length(size_t n, const char* what) const {
  if (n > static_cast<uint64_t>(limits.max_string_bytes))
    fail(std::string(what) + " would be " + std::to_string(n) + " bytes, longer than " +
         mib(limits.max_string_bytes) +
         " (ciuic's limit for a string in a template; docs/tokenizer.md)");
}

void Budget::check_string(size_t n, const char* what) {
  check_length(n, what);
  charge(n);
}

void Budget::check_items(size_t n, const char* what) {
  if (n > static_cast<uint64_t>(limits.max_list_items))
    fail(std::string(what) + " would have " + std::to_string(n) + " items, more than " +
         std::to_string(limits.max_list_items) +
         " (ciuic's limit for a list in a template; docs/tokenizer.md)");
  charge(n * sizeof(Value));
}

// ---- freeing deep values without recursion ---------------------------------------------------
namespace {
thread_local std::vector<Value>* t_pending = nullptr;  // set while the outermost free runs

template <class Take>
void free_children(size_t n, Take take) {
  if (t_pending) {  // inside the loop below: hand the children over
    for (size_t i = 0; i < n; ++i) {
      Value& v = take(i);
      if (v.list || v.dict || v.func) t_pending->push_back(std::move(v));
    }
    return;
  }
  std::vector<Value> pending;
  for (size_t i = 0; i < n; ++i) {
    Value& v = take(i);
    if (v.list || v.dict || v.func) pending.push_back(std::move(v));
  }
  if (pending.empty()) return;
  t_pending = &pending;
  while (!pending.empty()) {
    Value v = std::move(pending.back());
    pending.pop_back();
    // v is freed here; a container it held last frees into `pending`.
  }
  t_pending = nullptr;
}
}  // namespace

List::List(std::vector<Value>&& v) : std::vector<Value>(std::move(v)) {}
List::~List() {
  free_children(size(), [this](size_t i) -> Value& { return (*this)[i]; });
}
Dict::~Dict() {
  free_children(items.size(), [this](size_t i) -> Value& { return items[i].second; });
}

// ---- Value ---------------------------------------------------------------------------------
Value::Value(const Value& o)
    : k(o.k),
      b(o.b),
      tuple(o.tuple),
      markup(o.markup),
      lazy(o.lazy),
      i(o.i),
      f(o.f),
      s(o.s),
      list(o.list),
      dict(o.dict),
      func(o.func) {
  if (!s.empty() && t_budget)
    t_budget->bytes += static_cast<int64_t>(s.size());  // checked later: no throw here
}

Value& Value::operator=(const Value& o) {
  if (this != &o) {
    Value copy(o);
    *this = std::move(copy);
  }
  return *this;
}

int64_t Value::as_int() const {
  if (k == K::kBool) return b ? 1 : 0;
  if (k != K::kFloat) return i;
  if (std::isnan(f)) return 0;
  if (f >= 9.2233720368547758e18) return std::numeric_limits<int64_t>::max();
  if (f <= -9.2233720368547758e18) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(f);
}

Value Value::undefined(std::string name) {
  Value v;
  v.s = std::move(name);
  return v;
}
Value Value::undefined_hint(std::string message) {
  Value v;
  v.b = true;
  v.s = std::move(message);
  return v;
}
Value Value::none() {
  Value v;
  v.k = K::kNone;
  return v;
}
Value Value::boolean(bool x) {
  Value v;
  v.k = K::kBool;
  v.b = x;
  return v;
}
Value Value::integer(int64_t x) {
  Value v;
  v.k = K::kInt;
  v.i = x;
  return v;
}
Value Value::number(double x) {
  Value v;
  v.k = K::kFloat;
  v.f = x;
  return v;
}
Value Value::string(std::string x) {
  charge_string(x.size());
  Value v;
  v.k = K::kString;
  v.s = std::move(x);
  return v;
}
Value Value::markup_string(std::string x) {
  Value v = string(std::move(x));
  v.markup = true;
  return v;
}

Value make_lazy(List items, Value::Lazy kind, std::string repr) {
  Value v = Value::make_list(std::move(items));
  v.lazy = kind;
  v.s = std::move(repr);
  return v;
}

std::string html_escape(std::string_view s) {
  size_t size = s.size();  // of the result: each entity adds at most 4 bytes
  for (char ch : s)
    size += (ch == '&' || ch == '<' || ch == '>' || ch == '"' || ch == '\'') ? 4 : 0;
  limit_string(size, "escape's result");
  std::string out;
  out.reserve(size);
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
  return out;
}

// ---- Dict ----------------------------------------------------------------------------------
bool hashable(const Value& v, const char** type) {
  auto no = [&] {
    if (type) *type = type_name(v);
    return false;
  };
  if (v.k == Value::K::kDict) return v.dict->ns || no();  // a namespace hashes as an object
  if (v.k != Value::K::kList) return true;
  switch (v.lazy) {
    case Value::Lazy::kNone:
      if (!v.tuple) return no();
      for (const auto& e : *v.list)
        if (!hashable(e, type)) return false;
      return true;
    case Value::Lazy::kDictItems:
    case Value::Lazy::kDictKeys: return no();
    default: return true;  // iterators, dict_values and range hash as objects
  }
}

namespace {
// Python's dict key equality (hash and ==): numbers by value, str by text, None, tuples by items.
bool same_key(const Value& a, const Value& b) {
  if (a.is_string() || b.is_string()) return a.is_string() && b.is_string() && a.s == b.s;
  if (a.is_number() && b.is_number()) return equal(a, b);
  if (a.k != b.k) return false;
  if (a.k == Value::K::kNone || a.k == Value::K::kUndefined) return true;
  if (a.k == Value::K::kFunc) return a.func == b.func;
  if (a.k == Value::K::kList) {
    if (a.list == b.list) return true;
    if (!a.tuple || !b.tuple)
      return a.lazy == Value::Lazy::kRange && b.lazy == Value::Lazy::kRange && a.s == b.s;
    if (a.list->size() != b.list->size()) return false;
    for (size_t i = 0; i < a.list->size(); ++i)
      if (!same_key((*a.list)[i], (*b.list)[i])) return false;
    return true;
  }
  return false;
}
}  // namespace

Value* Dict::find_str(std::string_view key) const {
  auto* self = const_cast<Dict*>(this);  // the index is a cache; items are the dict's own
  if (items.size() <= 8) {
    for (auto& kv : self->items)
      if (kv.first.k == Value::K::kString && kv.first.s == key) return &kv.second;
    return nullptr;
  }
  if (indexed_ > items.size() ||
      slots_.size() < 2 * items.size()) {  // (re)build, at least twice as wide
    size_t n = 32;
    while (n < 4 * items.size()) n *= 2;
    slots_.assign(n, 0);
    indexed_ = 0;
  }
  const size_t mask = slots_.size() - 1;
  auto slot_of = [&](std::string_view k, bool* found) {
    size_t h = std::hash<std::string_view>{}(k)&mask;
    while (slots_[h] != 0) {
      if (items[slots_[h] - 1].first.s == k) {
        *found = true;
        return h;
      }
      h = (h + 1) & mask;
    }
    *found = false;
    return h;
  };
  for (; indexed_ < items.size(); ++indexed_) {
    if (items[indexed_].first.k != Value::K::kString) continue;
    bool found = false;
    const size_t h = slot_of(items[indexed_].first.s, &found);
    if (!found) slots_[h] = static_cast<uint32_t>(indexed_ + 1);  // the first of equal keys wins
  }
  bool found = false;
  const size_t h = slot_of(key, &found);
  return found ? &self->items[slots_[h] - 1].second : nullptr;
}

const Value* Dict::find(std::string_view key) const { return find_str(key); }

void Dict::clear() {
  items.clear();
  slots_.clear();
  indexed_ = 0;
}

const Value* Dict::find(const Value& key) const {
  if (key.is_string()) return find(std::string_view(key.s));
  if (!hashable(key)) return nullptr;
  charge_scan(items.size() * sizeof(Value));
  for (const auto& kv : items)
    if (same_key(kv.first, key)) return &kv.second;
  return nullptr;
}

void Dict::set(const std::string& key, Value v) {
  if (Value* have = find_str(key)) {
    *have = std::move(v);
    return;
  }
  items.emplace_back(Value::string(key), std::move(v));
}

void Dict::set(Value key, Value v) {
  if (key.is_string()) {
    key.markup = false;
    if (Value* have = find_str(key.s)) {
      *have = std::move(v);
      return;
    }
    items.emplace_back(std::move(key), std::move(v));
    return;
  }
  charge_scan(items.size() * sizeof(Value));
  for (auto& kv : items)
    if (same_key(kv.first, key)) {
      kv.second = std::move(v);
      return;
    }
  items.emplace_back(std::move(key), std::move(v));
}

Value Value::make_list(List items) {
  charge_items(items.size());
  Value v;
  v.k = K::kList;
  v.list = std::make_shared<List>(std::move(items));
  return v;
}

Value Value::make_dict(bool ns) {
  Value v;
  v.k = K::kDict;
  v.dict = std::make_shared<Dict>();
  v.dict->ns = ns;
  if (ns && t_budget) t_budget->namespaces.push_back(v.dict);
  return v;
}

Value Value::function(std::string name, std::function<Value(CallArgs&, Ctx&)> fn) {
  Value v;
  v.k = K::kFunc;
  v.func = std::make_shared<Func>(Func{std::move(name), std::move(fn)});
  return v;
}

Value from_json(const json& j, int depth) {
  if (depth > value_depth_limit())
    throw TemplateError(
        "template variables nested deeper than " + std::to_string(value_depth_limit()) + " levels",
        "template variables nested too deep", false);
  switch (j.type()) {
    case json::value_t::null: return Value::none();
    case json::value_t::boolean: return Value::boolean(j.get<bool>());
    case json::value_t::number_integer: return Value::integer(j.get<int64_t>());
    case json::value_t::number_unsigned: {
      const uint64_t u = j.get<uint64_t>();
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw TemplateError("template variable " + std::to_string(u) +
                                " is past the 64-bit integers of ciuic's templates",
                            "integer variable out of range", false);
      return Value::integer(static_cast<int64_t>(u));
    }
    case json::value_t::number_float: return Value::number(j.get<double>());
    case json::value_t::string: return Value::string(j.get<std::string>());
    case json::value_t::array: {
      Value v = Value::make_list();
      for (const auto& e : j) v.list->push_back(from_json(e, depth + 1));
      return v;
    }
    case json::value_t::object: {
      Value v = Value::make_dict();
      for (auto it = j.begin(); it != j.end(); ++it)
        v.dict->items.emplace_back(Value::string(it.key()), from_json(it.value(), depth + 1));
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
    case Value::K::kString: return v.markup ? "Markup" : "str";
    case Value::K::kList:
      switch (v.lazy) {
        case Value::Lazy::kNone: return v.tuple ? "tuple" : "list";
        case Value::Lazy::kGenerator: return "generator";
        case Value::Lazy::kReverseIterator: return "list_reverseiterator";
        case Value::Lazy::kReversed: return "reversed";
        case Value::Lazy::kDictItems: return "dict_items";
        case Value::Lazy::kDictKeys: return "dict_keys";
        case Value::Lazy::kDictValues: return "dict_values";
        case Value::Lazy::kRange: return "range";
      }
      return "list";
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
      out = digits.substr(0, static_cast<size_t>(point)) + "." +
            digits.substr(static_cast<size_t>(point));
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
  bool has_single = s.find('\'') != std::string::npos,
       has_double = s.find('"') != std::string::npos;
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

// ---- str() and repr() ------------------------------------------------------------------------
namespace {

// The containers being printed (Python's Py_ReprEnter) and the nesting depth.
class Walk {
 public:
  // False when `p` is already being printed (a cycle); throws past the depth limit.
  bool enter(const void* p, const char* what) {
    for (const void* q : open_)
      if (q == p) return false;
    if (static_cast<int>(open_.size()) >= value_depth_limit()) {
      const std::string msg = std::string(what) + " of a value nested deeper than " +
                              std::to_string(value_depth_limit()) +
                              " levels (ciuic's limit; Python: RecursionError)";
      if (t_budget) t_budget->fail(msg);
      throw TemplateError(msg, msg, false);
    }
    open_.push_back(p);
    return true;
  }
  void leave() { open_.pop_back(); }

 private:
  std::vector<const void*> open_;
};

void repr_to(std::string& out, const Value& v, Walk& w);

void str_to(std::string& out, const Value& v, Walk& w) {
  switch (v.k) {
    case Value::K::kUndefined: return;
    case Value::K::kNone: out += "None"; return;
    case Value::K::kBool: out += v.b ? "True" : "False"; return;
    case Value::K::kInt: out += std::to_string(v.i); return;
    case Value::K::kFloat: out += py_float(v.f); return;
    case Value::K::kString: out += v.s; return;
    default: repr_to(out, v, w);
  }
}

void repr_dict(std::string& out, const Dict& d, Walk& w) {
  if (!w.enter(&d, "printing")) {
    out += "{...}";
    return;
  }
  out += '{';
  bool first = true;
  for (const auto& kv : d.items) {
    if (!first) out += ", ";
    first = false;
    repr_to(out, kv.first, w);
    out += ": ";
    repr_to(out, kv.second, w);
    limit_string(out.size(), "a printed value");
  }
  out += '}';
  w.leave();
}

void repr_to(std::string& out, const Value& v, Walk& w) {
  switch (v.k) {
    case Value::K::kString: out += py_repr_str(v.s); return;
    case Value::K::kList: {
      if (v.lazy == Value::Lazy::kRange) {
        out += v.s;
        return;
      }
      if (v.is_iterator()) {  // Python prints the object's address; ciuic prints none
        out += std::string("<") + type_name(v) + " object>";
        return;
      }
      if (v.lazy !=
          Value::Lazy::kNone) {  // dict_items([...]), dict_keys([...]), dict_values([...])
        Value plain = v;
        plain.lazy = Value::Lazy::kNone;
        out += type_name(v);
        out += '(';
        repr_to(out, plain, w);
        out += ')';
        return;
      }
      if (!w.enter(v.list.get(), "printing")) {
        out += v.tuple ? "(...)" : "[...]";
        return;
      }
      out += v.tuple ? "(" : "[";
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += ", ";
        repr_to(out, (*v.list)[i], w);
        limit_string(out.size(), "a printed value");
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      out += v.tuple ? ")" : "]";
      w.leave();
      return;
    }
    case Value::K::kDict:
      if (v.dict->ns) {  // jinja2: f"<Namespace {self.__attrs!r}>"
        out += "<Namespace ";
        repr_dict(out, *v.dict, w);
        out += ">";
        return;
      }
      repr_dict(out, *v.dict, w);
      return;
    case Value::K::kFunc: out += "<function " + v.func->name + ">"; return;
    default: str_to(out, v, w);
  }
}

}  // namespace

std::string to_str(const Value& v) {
  if (v.k == Value::K::kString) return v.s;
  std::string out;
  Walk w;
  str_to(out, v, w);
  return out;
}

std::string repr(const Value& v) {
  std::string out;
  Walk w;
  repr_to(out, v, w);
  return out;
}

bool truthy(const Value& v) {
  switch (v.k) {
    case Value::K::kUndefined:
    case Value::K::kNone: return false;
    case Value::K::kBool: return v.b;
    case Value::K::kInt: return v.i != 0;
    case Value::K::kFloat: return v.f != 0;
    case Value::K::kString: return !v.s.empty();
    case Value::K::kList: return v.is_iterator() || !v.list->empty();
    case Value::K::kDict: return v.dict->ns || !v.dict->items.empty();
    case Value::K::kFunc: return true;
  }
  return false;
}

namespace {
bool equal_at(const Value& a, const Value& b, int depth) {
  if (a.is_number() && b.is_number()) {
    if (a.k == Value::K::kFloat || b.k == Value::K::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.k != b.k) return false;
  if (depth > value_depth_limit()) {
    const std::string msg = "comparing values nested deeper than " +
                            std::to_string(value_depth_limit()) +
                            " levels (ciuic's limit; Python: RecursionError)";
    if (t_budget) t_budget->fail(msg);
    throw TemplateError(msg, msg, false);
  }
  switch (a.k) {
    case Value::K::kUndefined:
    case Value::K::kNone: return true;
    case Value::K::kString: charge_scan(std::min(a.s.size(), b.s.size())); return a.s == b.s;
    case Value::K::kList:
      if (a.list == b.list) return true;  // Python compares items by identity first
      if (a.tuple != b.tuple || a.lazy != b.lazy || a.is_iterator()) return false;  // (1,) != [1]
      if (a.lazy == Value::Lazy::kRange) return a.s == b.s;
      if (a.list->size() != b.list->size()) return false;
      charge_scan(a.list->size() * sizeof(Value));
      for (size_t i = 0; i < a.list->size(); ++i)
        if (!equal_at((*a.list)[i], (*b.list)[i], depth + 1)) return false;
      return true;
    case Value::K::kDict:
      if (a.dict == b.dict) return true;
      if (a.dict->ns || b.dict->ns) return false;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      charge_scan(a.dict->items.size() * a.dict->items.size() * 8);
      for (const auto& kv : a.dict->items) {
        const Value* o = b.dict->find(kv.first);
        if (!o || !equal_at(kv.second, *o, depth + 1)) return false;
      }
      return true;
    case Value::K::kFunc: return a.func == b.func;
    default: return false;
  }
}
}  // namespace

bool equal(const Value& a, const Value& b) { return equal_at(a, b, 0); }

// ---- tojson ----------------------------------------------------------------------------------
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

namespace {
void to_json_at(std::string& out, const Value& v, const JsonFormat& f, int depth, Walk& w) {
  auto newline = [&](int d) {
    limit_string(out.size() + 1 + f.indent.size() * static_cast<size_t>(d), "tojson's text");
    out += '\n';
    for (int k = 0; k < d; ++k) out += f.indent;
  };
  switch (v.k) {
    case Value::K::kUndefined:
      throw std::runtime_error("Object of type Undefined is not JSON serializable");
    case Value::K::kNone: out += "null"; return;
    case Value::K::kBool: out += v.b ? "true" : "false"; return;
    case Value::K::kInt: out += std::to_string(v.i); return;
    case Value::K::kFloat: {
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f > 0 ? "Infinity" : "-Infinity";
      else
        out += py_float(v.f);
      return;
    }
    case Value::K::kString: json_str(out, v.s); break;
    case Value::K::kList: {
      if (v.lazy != Value::Lazy::kNone)
        throw std::runtime_error(std::string("Object of type ") + type_name(v) +
                                 " is not JSON serializable");
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      if (!w.enter(v.list.get(), "tojson")) throw std::runtime_error("Circular reference detected");
      out += '[';
      for (size_t i = 0; i < v.list->size(); ++i) {
        if (i) out += f.item_sep;
        if (f.indented) newline(depth + 1);
        to_json_at(out, (*v.list)[i], f, depth + 1, w);
      }
      if (f.indented) newline(depth);
      out += ']';
      w.leave();
      break;
    }
    case Value::K::kDict: {
      // transformers' tojson does not serialize jinja2's namespace objects.
      if (v.dict->ns)
        throw std::runtime_error("Object of type TemplateNamespace is not JSON serializable");
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      if (!w.enter(v.dict.get(), "tojson")) throw std::runtime_error("Circular reference detected");
      std::vector<const std::pair<Value, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (f.sort_keys && items.size() > 1) {  // Python's sorted(d.items()): keys of one kind only
        const Value& k0 = items[0]->first;
        for (const auto* kv : items) {
          const Value& k = kv->first;
          const bool ok = (k.is_string() && k0.is_string()) || (k.is_number() && k0.is_number());
          if (!ok)
            throw std::runtime_error(std::string("'<' not supported between instances of '") +
                                     type_name(k) + "' and '" + type_name(k0) + "'");
        }
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) {
          if (a->first.is_string()) return a->first.s < b->first.s;
          return a->first.as_double() < b->first.as_double();
        });
      }
      out += '{';
      bool first = true;
      for (const auto* kv : items) {
        if (!first) out += f.item_sep;
        first = false;
        if (f.indented) newline(depth + 1);
        const Value& k =
            kv->first;  // json.dumps turns str, int, float, bool and None keys into strings
        switch (k.k) {
          case Value::K::kString: json_str(out, k.s); break;
          case Value::K::kInt: json_str(out, std::to_string(k.i)); break;
          case Value::K::kBool: json_str(out, k.b ? "true" : "false"); break;
          case Value::K::kNone: json_str(out, "null"); break;
          case Value::K::kFloat: {
            std::string t;
            to_json_at(t, k, f, depth + 1, w);
            json_str(out, t);
            break;
          }
          default:
            throw std::runtime_error(
                std::string("keys must be str, int, float, bool or None, not ") + type_name(k));
        }
        out += f.key_sep;
        to_json_at(out, kv->second, f, depth + 1, w);
      }
      if (f.indented) newline(depth);
      out += '}';
      w.leave();
      break;
    }
    case Value::K::kFunc:
      throw std::runtime_error("Object of type function is not JSON serializable");
  }
  limit_string(out.size(), "tojson's text");
}
}  // namespace

void to_json(std::string& out, const Value& v, const JsonFormat& f, int depth) {
  Walk w;
  to_json_at(out, v, f, depth, w);
}

}  // namespace ciuic::jinja
