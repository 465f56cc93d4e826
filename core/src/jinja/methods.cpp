// Attribute and item access, calls, the str/dict/list methods chat templates use, and the globals
// of transformers' environment.
#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <iterator>
#include <optional>

#include "jinja/builtins.h"
#include "jinja/text.h"

namespace ciuic::jinja {

bool is_method(const Value& obj, const std::string& name) {
  static const char* kStr[] = {
      "strip",    "lstrip",       "rstrip",       "split",     "rsplit",     "startswith",
      "endswith", "upper",        "lower",        "title",     "capitalize", "replace",
      "find",     "rfind",        "count",        "join",      "splitlines", "isdigit",
      "isalpha",  "isalnum",      "isspace",      "isupper",   "islower",    "index",
      "format",   "removeprefix", "removesuffix", "partition", "rpartition", "zfill",
      "ljust",    "rjust",        "center",       "swapcase",  "casefold"};
  static const char* kDict[] = {"items", "keys", "values", "get", "copy"};
  static const char* kList[] = {"index", "count", "copy"};
  if (obj.is_string()) {
    for (const char* m : kStr)
      if (name == m) return true;
  } else if (obj.k == Value::K::kDict && !obj.dict->ns) {
    for (const char* m : kDict)
      if (name == m) return true;
  } else if (obj.is_plain_list()) {
    for (const char* m : kList)
      if (name == m) return true;
  }
  return false;
}

namespace {
Value bound_method(const Value& obj, const std::string& name, Pos p) {
  Value self = obj;
  return Value::function(
      name, [self, name, p](CallArgs& a, Ctx& c) { return call_method(c, p, self, name, a); });
}

}  // namespace

namespace {
// jinja2's object_type_repr: "None", "dict object", "str object", ... (for Undefined's messages).
std::string object_type_repr(const Value& v) {
  if (v.is_none()) return "None";
  if (v.k == Value::K::kDict && v.dict->ns)
    return "transformers.utils.chat_template_utils.TemplateNamespace object";
  if (v.is_string() && v.markup) return "markupsafe.Markup object";
  return std::string(type_name(v)) + " object";
}

// jinja2's Undefined for obj.name / obj[key] that is not there, with jinja2's message.
Value missing(const Value& obj, const Value& key) {
  if (key.is_string())
    return Value::undefined_hint(py_repr_str(object_type_repr(obj)) + " has no attribute " +
                                 py_repr_str(excerpt(key.s, 80)));
  return Value::undefined_hint(object_type_repr(obj) + " has no element " + excerpt(repr(key), 80));
}
Value missing(const Value& obj, const std::string& name) {
  return Value::undefined_hint(py_repr_str(object_type_repr(obj)) + " has no attribute " +
                               py_repr_str(excerpt(name, 80)));
}

// ImmutableSandboxedEnvironment: the methods that would change a list or dict are unsafe (an
// Undefined whose use raises jinja2's SecurityError message).
std::optional<Value> unsafe_method(const Value& obj, const std::string& name) {
  static const std::vector<std::string> kList = {"append", "extend", "insert", "pop",
                                                 "remove", "clear",  "sort",   "reverse"};
  static const std::vector<std::string> kDict = {"update", "pop", "popitem", "setdefault", "clear"};
  const bool list = obj.is_plain_list() && !obj.tuple,
             dict = obj.k == Value::K::kDict && !obj.dict->ns;
  if (!list && !dict) return std::nullopt;
  const auto& names = list ? kList : kDict;
  if (std::find(names.begin(), names.end(), name) == names.end()) return std::nullopt;
  return Value::undefined_hint("access to attribute '" + name + "' of '" + type_name(obj) +
                               "' object is unsafe.");
}
}  // namespace

Value get_attr(Ctx& c, Pos p, const Value& obj, const std::string& name) {
  if (obj.is_undefined()) rt_fail(c, p, undefined_msg(obj) + " (reading ." + name + ")");
  if (std::optional<Value> u = unsafe_method(obj, name)) return *u;
  if (obj.k == Value::K::kDict) {
    if (obj.dict->ns) {
      if (const Value* v = obj.dict->find(name)) return *v;
      return missing(obj, name);
    }
    if (is_method(obj, name)) return bound_method(obj, name, p);
    if (const Value* v = obj.dict->find(name)) return *v;
    return missing(obj, name);
  }
  if (is_method(obj, name)) return bound_method(obj, name, p);
  return missing(obj, name);
}

Value get_item(Ctx& c, Pos p, const Value& obj, const Value& key) {
  if (obj.is_undefined())
    rt_fail(c, p, undefined_msg(obj) + " (reading [" + excerpt(repr(key), 30) + "])");
  if (obj.k == Value::K::kDict) {
    if (key.is_string()) {
      if (const Value* v = obj.dict->find(key.s)) return *v;
      if (!obj.dict->ns && is_method(obj, key.s)) return bound_method(obj, key.s, p);
      return missing(obj, key);
    }
    if (!obj.dict->ns)
      if (const Value* v = obj.dict->find(key)) return *v;
    return missing(obj, key);
  }
  // Iterators and dict views are not subscriptable: jinja2's sandbox gives Undefined.
  const bool indexable = obj.is_plain_list() || (obj.is_list() && obj.lazy == Value::Lazy::kRange);
  if ((indexable || obj.is_string()) && (key.k == Value::K::kInt || key.k == Value::K::kBool)) {
    if (obj.k == Value::K::kList) {
      int64_t n = static_cast<int64_t>(obj.list->size()), i = key.as_int();
      if (i < 0) i += n;
      if (i < 0 || i >= n) return missing(obj, key);
      return (*obj.list)[static_cast<size_t>(i)];
    }
    c.budget.charge(obj.s.size());
    int64_t n = static_cast<int64_t>(cp_count(obj.s)), i = key.as_int();
    if (i < 0) i += n;
    if (i < 0 || i >= n) return missing(obj, key);
    size_t at = 0;  // the byte offset of code point i
    for (int64_t k = 0; k <= i; ++at)
      if ((static_cast<unsigned char>(obj.s[at]) & 0xC0) != 0x80 && k++ == i) break;
    size_t end = at + 1;
    while (end < obj.s.size() && (static_cast<unsigned char>(obj.s[end]) & 0xC0) == 0x80) ++end;
    Value r = Value::string(obj.s.substr(at, end - at));
    r.markup = obj.markup;
    return r;
  }
  if (key.is_string()) return get_attr(c, p, obj, key.s);
  return missing(obj, key);
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

Value str_list(const std::vector<std::string>& v) {
  List l;
  l.reserve(v.size());
  for (const auto& s : v) l.push_back(Value::string(s));
  return Value::make_list(std::move(l));
}

namespace {
// The separator argument of split/rsplit: a non-empty str or None (null).
const std::string* split_sep(Ctx& c, Pos p, const Value* sep) {
  if (!sep || sep->is_none()) return nullptr;
  if (!sep->is_string()) rt_fail(c, p, std::string("must be str or None, not ") + type_name(*sep));
  if (sep->s.empty()) rt_fail(c, p, "empty separator");
  return &sep->s;
}
}  // namespace

namespace {
// markupsafe's Markup methods: those that return a str return a Markup (strip, replace, upper,
// ...; replace escapes its `new` first); split/rsplit/splitlines return Markups; join escapes the
// items. Null when `name` is a plain str method on a Markup (find, startswith, ...).
std::optional<Value> markup_method(Ctx& c, Pos p, const Value& obj, const std::string& name,
                                   CallArgs& a) {
  static const char* kWrapped[] = {"capitalize",   "title",        "lower",    "upper",
                                   "replace",      "lstrip",       "rstrip",   "strip",
                                   "removeprefix", "removesuffix", "zfill",    "ljust",
                                   "rjust",        "center",       "swapcase", "casefold"};
  const bool wrapped = std::any_of(std::begin(kWrapped), std::end(kWrapped),
                                   [&](const char* m) { return name == m; });
  const bool splits = name == "split" || name == "rsplit" || name == "splitlines";
  if (!wrapped && !splits && name != "join") return std::nullopt;
  Value plain = obj;
  plain.markup = false;
  CallArgs args = a;
  auto escape = [](Value& v) {
    if (v.is_string() && !v.markup) v = Value::markup_string(html_escape(v.s));
  };
  if (name == "replace" && args.pos.size() > 1)
    escape(args.pos[1]);  // markupsafe 3 escapes `new` only
  if (name == "join" && !args.pos.empty()) {
    List items;
    for (const auto& e : iterate(c, p, args.pos[0]))
      items.push_back(e.is_string() && e.markup ? e : Value::string(html_escape(to_str(e))));
    args.pos[0] = Value::make_list(std::move(items));
  }
  Value r = call_method(c, p, plain, name, args);
  if (r.is_string()) r.markup = true;
  if (r.is_list())
    for (auto& e : *r.list) e.markup = e.is_string();
  return r;
}
}  // namespace

Value call_method(Ctx& c, Pos p, const Value& obj, const std::string& name, CallArgs& a) {
  if (obj.is_string() && obj.markup)
    if (std::optional<Value> r = markup_method(c, p, obj, name, a)) return *r;
  if (obj.is_string()) {
    const std::string& s = obj.s;
    c.budget.charge(s.size());  // every method reads the string once (at most)
    auto chars_arg = [&]() -> const std::string* {
      const Value* v = arg(a, 0, "chars");
      return (v && v->is_string()) ? &v->s : nullptr;
    };
    if (name == "strip") return Value::string(py_strip(s, true, true, chars_arg()));
    if (name == "lstrip") return Value::string(py_strip(s, true, false, chars_arg()));
    if (name == "rstrip") return Value::string(py_strip(s, false, true, chars_arg()));
    if (name == "split" || name == "rsplit") {
      const std::string* sep = split_sep(c, p, arg(a, 0, "sep"));
      const Value* m = arg(a, 1, "maxsplit");
      int64_t maxsplit = m ? m->as_int() : -1;
      if (name == "rsplit" && maxsplit >= 0) {
        // split from the right: reverse trick on the whole list
        std::vector<std::string> all = py_split(s, sep, -1);
        if (static_cast<int64_t>(all.size()) <= maxsplit + 1) return str_list(all);
        if (!sep) return str_list(all);  // whitespace rsplit with maxsplit: rare
        size_t keep = all.size() - static_cast<size_t>(maxsplit);
        std::string head;
        for (size_t i = 0; i < keep; ++i) head += (i ? *sep : "") + all[i];
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
                                 : (s.size() >= cand.size() &&
                                    s.compare(s.size() - cand.size(), cand.size(), cand) == 0))
          return Value::boolean(true);
      }
      return Value::boolean(false);
    }
    if (name == "upper") return Value::string(ascii_case(s, true));
    if (name == "lower") return Value::string(ascii_case(s, false));
    if (name == "title") return Value::string(py_title(s));
    if (name == "capitalize") return Value::string(py_capitalize(s));
    if (name == "replace") {
      std::string from = need_str(c, p, arg(a, 0, "old"), "replace"),
                  to = need_str(c, p, arg(a, 1, "new"), "replace");
      const Value* cnt = arg(a, 2, "count");
      int64_t n = cnt ? cnt->as_int() : -1;
      std::string out;
      size_t i = 0;
      auto put = [&](std::string_view piece) {
        limit_string(out.size() + piece.size(), "replace's result");
        out += piece;
      };
      if (from.empty()) {  // Python: `to` before every character and at the end
        for (size_t k = 0; k < s.size(); ++k) {
          const bool starts = (static_cast<unsigned char>(s[k]) & 0xC0) != 0x80;
          if (starts && n != 0) {
            put(to);
            if (n > 0) --n;
          }
          put(std::string_view(&s[k], 1));
        }
        if (n != 0) put(to);
        return Value::string(std::move(out));
      }
      while (n != 0) {
        size_t j = find_sub(s, from, i);
        if (j == std::string::npos) break;
        put(std::string_view(s).substr(i, j - i));
        put(to);
        i = j + from.size();
        if (n > 0) --n;
      }
      put(std::string_view(s).substr(i));
      return Value::string(std::move(out));
    }
    if (name == "find" || name == "rfind" || name == "index") {
      std::string x = need_str(c, p, arg(a, 0, nullptr), name.c_str());
      size_t j = name == "rfind" ? rfind_sub(s, x) : find_sub(s, x);
      if (j == std::string::npos) {
        if (name == "index") rt_fail(c, p, "substring not found");
        return Value::integer(-1);
      }
      return Value::integer(static_cast<int64_t>(cp_count(std::string_view(s).substr(0, j))));
    }
    if (name == "count") {
      std::string x = need_str(c, p, arg(a, 0, nullptr), "count");
      if (x.empty()) return Value::integer(static_cast<int64_t>(cp_count(s) + 1));
      int64_t n = 0;
      for (size_t j = find_sub(s, x); j != std::string::npos; j = find_sub(s, x, j + x.size())) ++n;
      return Value::integer(n);
    }
    if (name == "join") {
      const Value* x = arg(a, 0, nullptr);
      if (!x) rt_fail(c, p, "join expects an argument");
      std::string out;
      bool first = true;
      for (const auto& e : iterate(c, p, *x)) {
        if (!e.is_string())
          rt_fail(c, p,
                  std::string("sequence item: expected str instance, ") + type_name(e) + " found");
        limit_string(out.size() + (first ? 0 : s.size()) + e.s.size(), "join's result");
        if (!first) out += s;
        out += e.s;
        first = false;
      }
      return Value::string(std::move(out));
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
    if (name == "isalpha")
      return all_of([](unsigned char ch) { return std::isalpha(ch) != 0 || ch >= 0x80; });
    if (name == "isalnum")
      return all_of([](unsigned char ch) { return std::isalnum(ch) != 0 || ch >= 0x80; });
    if (name == "isspace") return all_of([](unsigned char ch) { return std::isspace(ch) != 0; });
    if (name == "isupper")
      return Value::boolean(s != ascii_case(s, false) && s == ascii_case(s, true));
    if (name == "islower")
      return Value::boolean(s != ascii_case(s, true) && s == ascii_case(s, false));
    if (name == "format") return Value::string(str_format(c, p, s, a));
    if (name == "casefold") return Value::string(ascii_case(s, false));
    if (name == "swapcase") {
      std::string out;
      for (size_t i = 0; i < s.size();) {  // each code point: upper if it was lower, else lower
        size_t len = 0;
        decode_at(s, i, &len);
        const std::string ch = s.substr(i, len), up = ascii_case(ch, true);
        out += up != ch ? up : ascii_case(ch, false);
        i += len;
      }
      return Value::string(std::move(out));
    }
    if (name == "removeprefix" || name == "removesuffix") {
      const std::string x = need_str(c, p, arg(a, 0, nullptr), name.c_str());
      const bool prefix = name == "removeprefix";
      if (x.size() <= s.size() && (prefix ? s.compare(0, x.size(), x) == 0
                                          : s.compare(s.size() - x.size(), x.size(), x) == 0))
        return Value::string(prefix ? s.substr(x.size()) : s.substr(0, s.size() - x.size()));
      return Value::string(s);
    }
    if (name == "partition" || name == "rpartition") {
      const std::string sep = need_str(c, p, arg(a, 0, nullptr), name.c_str());
      if (sep.empty()) rt_fail(c, p, "empty separator");
      const size_t j = name == "partition" ? find_sub(s, sep) : rfind_sub(s, sep);
      std::vector<std::string> parts;
      if (j == std::string::npos)
        parts = name == "partition" ? std::vector<std::string>{s, "", ""}
                                    : std::vector<std::string>{"", "", s};
      else
        parts = {s.substr(0, j), sep, s.substr(j + sep.size())};
      Value t = str_list(parts);
      t.tuple = true;
      return t;
    }
    if (name == "zfill" || name == "ljust" || name == "rjust" || name == "center") {
      const Value* w = arg(a, 0, nullptr);
      if (!w || !w->is_int()) rt_fail(c, p, name + "() expects an integer width");
      const Value* fc = arg(a, 1, nullptr);
      std::string fill = " ";
      if (fc) {
        if (!fc->is_string() || cp_count(fc->s) != 1)
          rt_fail(c, p, "The fill character must be exactly one character long");
        fill = fc->s;
      }
      const size_t n = cp_count(s);
      const int64_t width = w->as_int();
      if (width <= static_cast<int64_t>(n)) return Value::string(s);
      const size_t extra = static_cast<size_t>(width) - n;
      c.budget.at = p;
      c.budget.check_length(s.size() + extra * fill.size(), (name + "'s result").c_str());
      auto rep = [&](size_t k) {
        std::string r;
        for (size_t i = 0; i < k; ++i) r += fill;
        return r;
      };
      if (name == "zfill") {
        const bool signed_ = !s.empty() && (s[0] == '+' || s[0] == '-');
        return Value::string(signed_ ? s.substr(0, 1) + std::string(extra, '0') + s.substr(1)
                                     : std::string(extra, '0') + s);
      }
      if (name == "ljust") return Value::string(s + rep(extra));
      if (name == "rjust") return Value::string(rep(extra) + s);
      // Python's center: the extra odd fill goes left when the width is odd... as CPython's pad()
      const size_t left = extra / 2 + (extra & static_cast<size_t>(width) & 1);
      return Value::string(rep(left) + s + rep(extra - left));
    }
  }
  if (obj.k == Value::K::kDict) {
    if (name == "copy") {
      Value d = Value::make_dict();
      for (const auto& kv : obj.dict->items) d.dict->set(kv.first, kv.second);
      return d;
    }
    if (name == "items") {
      Value l = make_lazy({}, Value::Lazy::kDictItems);
      for (const auto& kv : obj.dict->items) {
        Value pair = Value::make_list({kv.first, kv.second});
        pair.tuple = true;
        l.list->push_back(pair);
      }
      return l;
    }
    if (name == "keys") {
      Value l = make_lazy({}, Value::Lazy::kDictKeys);
      for (const auto& kv : obj.dict->items) l.list->push_back(kv.first);
      return l;
    }
    if (name == "values") {
      Value l = make_lazy({}, Value::Lazy::kDictValues);
      for (const auto& kv : obj.dict->items) l.list->push_back(kv.second);
      return l;
    }
    if (name == "get") {
      const Value* k = arg(a, 0, nullptr);
      const Value* d = arg(a, 1, "default");
      if (!k) rt_fail(c, p, "get expected at least 1 argument, got 0");
      const char* type = nullptr;
      if (!hashable(*k, &type)) rt_fail(c, p, std::string("unhashable type: '") + type + "'");
      if (const Value* v = obj.dict->find(*k)) return *v;
      return d ? *d : Value::none();
    }
  }
  if (obj.is_plain_list()) {
    if (name == "copy") {
      Value l = Value::make_list(List(obj.list->begin(), obj.list->end()));
      l.tuple = obj.tuple;
      return l;
    }
    const Value* x = arg(a, 0, nullptr);
    if (!x) rt_fail(c, p, name + " expects an argument");
    c.budget.charge(obj.list->size() * sizeof(Value));
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

// ---- globals -------------------------------------------------------------------------------
void add_globals(std::unordered_map<std::string, Value>& g) {
  g["raise_exception"] = Value::function("raise_exception", [](CallArgs& a, Ctx&) -> Value {
    std::string msg = a.pos.empty() ? "" : to_str(a.pos[0]);
    throw TemplateError("chat template raised an exception: " + msg, msg, true);
  });
  // jinja2's sandbox: safe_range refuses more than MAX_RANGE items, with this message.
  g["range"] = Value::function("range", [](CallArgs& a, Ctx& c) -> Value {
    if (a.pos.empty() || a.pos.size() > 3)
      fail_here(c, "range expected at most 3 arguments, got " + std::to_string(a.pos.size()));
    for (const auto& v : a.pos)
      if (!v.is_int())
        fail_here(c,
                  std::string("'") + type_name(v) + "' object cannot be interpreted as an integer");
    int64_t start = 0, stop = 0, step = 1;
    if (a.pos.size() == 1) {
      stop = a.pos[0].as_int();
    } else {
      start = a.pos[0].as_int();
      stop = a.pos[1].as_int();
      if (a.pos.size() == 3) step = a.pos[2].as_int();
    }
    if (step == 0) fail_here(c, "range() arg 3 must not be zero");
    // len(range(start, stop, step)), in 128 bits so that no bound overflows
    const __int128 span =
        step > 0 ? static_cast<__int128>(stop) - start : static_cast<__int128>(start) - stop;
    const __int128 st = step > 0 ? static_cast<__int128>(step) : -static_cast<__int128>(step);
    const __int128 n = span <= 0 ? 0 : (span - 1) / st + 1;
    if (n > c.budget.limits.max_range)
      fail_here(c, "Range too big. The sandbox blocks ranges larger than MAX_RANGE (" +
                       std::to_string(c.budget.limits.max_range) + ").");
    List l;
    l.reserve(static_cast<size_t>(n));
    for (__int128 k = 0; k < n; ++k)
      l.push_back(Value::integer(static_cast<int64_t>(start + k * step)));
    std::string r = "range(" + std::to_string(start) + ", " + std::to_string(stop) +
                    (step != 1 ? ", " + std::to_string(step) : std::string()) + ")";
    return make_lazy(std::move(l), Value::Lazy::kRange, std::move(r));
  });
  // dict(mapping or iterable of pairs, **kw), as Python's; namespace() takes the same arguments.
  auto dict_args = [](CallArgs& a, Ctx& c, Value d) -> Value {
    if (a.pos.size() > 1)
      fail_here(c, "dict expected at most 1 argument, got " + std::to_string(a.pos.size()));
    if (!a.pos.empty()) {
      const Value& v = a.pos[0];
      if (v.k == Value::K::kDict) {  // its keys are distinct already: copied as they are
        c.budget.charge(v.dict->items.size() * sizeof(Value));
        d.dict->items = v.dict->items;
      } else {
        std::vector<Value> items = iterate(c, c.budget.at, v);
        for (size_t i = 0; i < items.size(); ++i) {
          std::vector<Value> pair = iterate(c, c.budget.at, items[i]);
          if (pair.size() != 2)
            fail_here(c, "dictionary update sequence element #" + std::to_string(i) +
                             " has length " + std::to_string(pair.size()) + "; 2 is required");
          const char* type = nullptr;
          if (!hashable(pair[0], &type))
            fail_here(c, std::string("unhashable type: '") + type + "'");
          d.dict->set(std::move(pair[0]), std::move(pair[1]));
        }
      }
    }
    for (const auto& kv : a.kw) d.dict->set(kv.first, kv.second);
    return d;
  };
  g["namespace"] = Value::function("namespace", [dict_args](CallArgs& a, Ctx& c) -> Value {
    return dict_args(a, c, Value::make_dict(true));
  });
  g["dict"] = Value::function("dict", [dict_args](CallArgs& a, Ctx& c) -> Value {
    return dict_args(a, c, Value::make_dict());
  });
  // transformers' strftime_now: datetime.now() in local time. With SOURCE_DATE_EPOCH set (the
  // reproducible-builds convention: seconds since 1970, UTC) "now" is that instant, in UTC, so a
  // render is reproducible (the tests pin the day their transformers fixtures were made).
  g["strftime_now"] = Value::function("strftime_now", [](CallArgs& a, Ctx&) -> Value {
    std::string fmt = a.pos.empty() ? "" : to_str(a.pos[0]);
    std::time_t t = std::time(nullptr);
    std::tm tm{};
    const char* pinned = std::getenv("SOURCE_DATE_EPOCH");
    char* end = nullptr;
    const long long epoch = pinned ? std::strtoll(pinned, &end, 10) : 0;
    if (pinned && *pinned && end && *end == '\0' && epoch >= 0) {
      t = static_cast<std::time_t>(epoch);
      gmtime_r(&t, &tm);
    } else {
      localtime_r(&t, &tm);
    }
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, fmt.c_str(), &tm);
    return Value::string(std::string(buf, n));
  });
}

}  // namespace ciuic::jinja
