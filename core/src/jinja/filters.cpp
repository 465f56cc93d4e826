// Filters and tests of the Jinja engine (jinja2's built-ins and transformers' tojson).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "jinja/builtins.h"
#include "jinja/text.h"

namespace ciuic::jinja {

namespace {

int64_t length_of(Ctx& c, Pos p, const Value& v) {
  switch (v.k) {
    case Value::K::kUndefined: return 0;
    case Value::K::kString: c.budget.charge(v.s.size()); return static_cast<int64_t>(cp_count(v.s));
    case Value::K::kList:
      if (v.is_iterator())
        rt_fail(c, p, std::string("object of type '") + type_name(v) + "' has no len()");
      return static_cast<int64_t>(v.list->size());
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
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char ch) {
      return std::isdigit(static_cast<unsigned char>(ch)) != 0;
    });
    int64_t index = 0;
    if (digits && std::from_chars(part.data(), part.data() + part.size(), index).ec != std::errc())
      rt_fail(c, p, "index out of range: " + part);
    cur = digits ? get_item(c, p, cur, Value::integer(index))
                 : get_item(c, p, cur, Value::string(part));
    i = j + 1;
  }
  return cur;
}

Value sorted(Ctx& c, Pos p, std::vector<Value> items, bool reverse, bool case_sensitive,
             const std::string& attribute) {
  auto key = [&](const Value& v) {
    Value k = attribute.empty() ? v : attr_path(c, p, v, attribute);
    if (!case_sensitive && k.is_string()) k.s = ascii_case(k.s, false);
    return k;
  };
  std::vector<std::pair<Value, Value>> kv;
  for (auto& v : items) kv.emplace_back(key(v), v);
  std::stable_sort(kv.begin(), kv.end(), [&](const auto& x, const auto& y) {
    return reverse ? compare(c, p, y.first, x.first, "<") < 0
                   : compare(c, p, x.first, y.first, "<") < 0;
  });
  Value out = Value::make_list();
  for (auto& e : kv) out.list->push_back(e.second);
  return out;
}

}  // namespace

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
  if (name == "mapping") return v.k == Value::K::kDict && !v.dict->ns;
  if (name == "sequence")  // len() and [] (jinja2's test): not iterators nor dict views
    return v.is_plain_list() || (v.is_list() && v.lazy == Value::Lazy::kRange) || v.is_string() ||
           (v.k == Value::K::kDict && !v.dict->ns);
  if (name == "iterable")
    return v.k == Value::K::kList || v.is_string() || (v.k == Value::K::kDict && !v.dict->ns);
  if (name == "callable") return v.k == Value::K::kFunc;
  if (name == "odd" || name == "even") {
    if (v.k != Value::K::kInt && v.k != Value::K::kBool)
      rt_fail(c, p, "test '" + name + "' needs an integer");
    return (v.as_int() % 2 != 0) == (name == "odd");
  }
  if (name == "divisibleby") {
    const int64_t d = need().as_int();
    if (d == 0) rt_fail(c, p, "integer modulo by zero");
    return d == -1 || v.as_int() % d == 0;  // INT64_MIN % -1 would trap
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, need());
  if (name == "ne" || name == "!=") return !equal(v, need());
  if (name == "lt" || name == "lessthan" || name == "<") return compare(c, p, v, need(), "<") < 0;
  if (name == "le" || name == "<=") return compare(c, p, v, need(), "<=") <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">")
    return compare(c, p, v, need(), ">") > 0;
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

namespace {
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
  // jinja2's select_or_reject: `if value:` first (None, '' and 0 give nothing), then a generator.
  Value out = make_lazy({}, Value::Lazy::kGenerator);
  if (!truthy(v)) return out;
  for (const auto& e : iterate(c, p, v)) {
    Value x = by_attr ? attr_path(c, p, e, attribute) : e;
    bool r = test.empty() ? truthy(x) : apply_test(c, p, test, x, targs);
    if (r == keep_true) out.list->push_back(e);
  }
  return out;
}

// tojson's indent: None, a count of spaces (none when negative, as " " * n), or a string.
void json_indent(Ctx& c, Pos p, const Value* ind, JsonFormat& f) {
  if (!ind || ind->is_none()) return;
  f.indented = true;
  f.item_sep = ",";
  if (ind->is_string()) {
    f.indent = ind->s;
    return;
  }
  if (!ind->is_int())
    rt_fail(c, p,
            std::string("tojson: indent must be an integer or a string, not ") + type_name(*ind));
  const int64_t n = ind->as_int();
  c.budget.at = p;
  if (n > 0) c.budget.check_length(static_cast<size_t>(n), "tojson's indent");
  f.indent.assign(n > 0 ? static_cast<size_t>(n) : 0, ' ');
}

// int(x) for a finite float, as Python (an error past int64).
int64_t float_to_int(Ctx& c, Pos p, double d) {
  if (std::isinf(d)) rt_fail(c, p, "cannot convert float infinity to integer");
  if (!(d > -9.2233720368547758e18 && d < 9.2233720368547758e18))
    rt_fail(c, p,
            "integer overflow: int(" + py_float(d) +
                ") is past 64 bits (ciuic's templates compute with 64-bit integers where Python's "
                "grow)");
  return static_cast<int64_t>(d);
}
}  // namespace

Value apply_filter(Ctx& c, Pos p, const std::string& name, const Value& v, CallArgs& a) {
  auto undefined_error = [&] {
    if (v.is_undefined()) rt_fail(c, p, undefined_msg(v) + " (filter '" + name + "')");
  };
  // soft_str(s).strip() and the like: a Markup stays a Markup (markupsafe's methods).
  auto same_kind = [&](std::string text) {
    Value r = Value::string(std::move(text));
    r.markup = v.is_string() && v.markup;
    return r;
  };
  if (name == "trim") {
    const Value* chars = arg(a, 0, "chars");
    return same_kind(
        py_strip(to_str(v), true, true, (chars && chars->is_string()) ? &chars->s : nullptr));
  }
  if (name == "upper") return same_kind(ascii_case(to_str(v), true));
  if (name == "lower") return same_kind(ascii_case(to_str(v), false));
  if (name == "title") return Value::string(py_title(to_str(v)));  // joins plain str pieces
  if (name == "capitalize") return same_kind(py_capitalize(to_str(v)));
  if (name == "length" || name == "count") return Value::integer(length_of(c, p, v));
  if (name == "string") return v.is_string() ? v : Value::string(to_str(v));
  // markupsafe: safe marks the text as Markup; escape escapes what is not Markup yet; forceescape
  // escapes always. Printing a Markup prints its text (autoescape is off); `+` escapes the other
  // side.
  if (name == "safe") return (v.is_string() && v.markup) ? v : Value::markup_string(to_str(v));
  if (name == "e" || name == "escape" || name == "forceescape") {
    if (name != "forceescape" && v.is_string() && v.markup) return v;
    c.budget.at = p;
    return Value::markup_string(html_escape(to_str(v)));
  }
  if (name == "tojson") {
    JsonFormat f;
    json_indent(c, p, arg(a, 0, "indent"), f);
    if (const Value* sep = kwarg(a, "separators");
        sep && sep->k == Value::K::kList && sep->list->size() == 2) {
      f.item_sep = (*sep->list)[0].s;
      f.key_sep = (*sep->list)[1].s;
    }
    if (const Value* sk = kwarg(a, "sort_keys")) f.sort_keys = truthy(*sk);
    undefined_error();
    std::string out;
    try {
      to_json(out, v, f, 0);
    } catch (const TemplateError&) {
      throw;
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
  if (name == "first" && v.is_iterator()) {  // next(iter(x)): takes one item
    List& l = *v.list;
    if (l.consumed >= l.size()) return Value::undefined_hint("No first item, sequence was empty.");
    return l[l.consumed++];
  }
  if (name == "last" && v.is_iterator())  // next(iter(reversed(x)))
    rt_fail(c, p, std::string("'") + type_name(v) + "' object is not reversible");
  if (name == "first" || name == "last") {
    auto items = iterate(c, p, v);
    if (items.empty())
      return Value::undefined_hint(name == "first" ? "No first item, sequence was empty."
                                                   : "No last item, sequence was empty.");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::make_list(iterate(c, p, v));
  if (name == "join") {
    const Value* sep = arg(a, 0, "d");
    const Value* attribute = arg(a, 1, "attribute");
    std::string out;
    bool first = true;
    const std::string sep_text = sep ? to_str(*sep) : "";
    for (const auto& e : iterate(c, p, v)) {
      const std::string item = to_str(attribute ? attr_path(c, p, e, to_str(*attribute)) : e);
      limit_string(out.size() + (first ? 0 : sep_text.size()) + item.size(), "join's result");
      if (!first) out += sep_text;
      out += item;
      first = false;
    }
    return Value::string(std::move(out));
  }
  if (name == "replace") {
    CallArgs ra;
    ra.pos = a.pos;
    return call_method(c, p, Value::string(to_str(v)), "replace", ra);
  }
  if (name == "int") {  // jinja2's do_int: int(x), else int(float(x)), else the default
    if (v.k == Value::K::kFloat && !std::isnan(v.f)) return Value::integer(float_to_int(c, p, v.f));
    if (v.is_int()) return Value::integer(v.as_int());
    if (v.is_string()) {
      std::string s = py_strip(v.s, true, true, nullptr);
      int64_t x = 0;
      auto r = std::from_chars(s.data(), s.data() + s.size(), x);
      if (r.ec == std::errc() && r.ptr == s.data() + s.size()) return Value::integer(x);
      if (r.ec == std::errc::result_out_of_range && r.ptr == s.data() + s.size())
        rt_fail(c, p,
                "integer overflow: int('" + excerpt(s, 40) +
                    "') is past 64 bits (ciuic's templates compute with 64-bit integers where "
                    "Python's grow)");
      char* end = nullptr;
      double d = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size() && !std::isnan(d))
        return Value::integer(float_to_int(c, p, d));
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
    if (!v.is_number())
      rt_fail(c, p, std::string("bad operand type for abs(): '") + type_name(v) + "'");
    if (v.k == Value::K::kFloat) return Value::number(std::fabs(v.f));
    return Value::integer(v.as_int() < 0 ? checked_neg(c, p, v.as_int()) : v.as_int());
  }
  if (name == "round") {
    const Value* prec = arg(a, 0, "precision");
    const Value* method = arg(a, 1, "method");
    const int64_t digits = prec ? std::clamp<int64_t>(prec->as_int(), -400, 400) : 0;
    std::string how = method ? to_str(*method) : "common";
    if (digits > 308 || !std::isfinite(v.as_double()))
      return Value::number(v.as_double());  // nothing to round
    if (digits < -308) return Value::number(std::copysign(0.0, v.as_double()));
    double m = std::pow(10.0, static_cast<double>(digits));
    double x = v.as_double() * m;
    double r = how == "ceil"    ? std::ceil(x)
               : how == "floor" ? std::floor(x)
                                : std::nearbyint(x);  // Python: half to even
    return Value::number(r / m);
  }
  if (name == "reverse") {
    if (v.is_string()) {
      c.budget.charge(v.s.size() * sizeof(size_t));
      auto st = cp_starts(v.s);
      std::string out;
      for (size_t i = st.size() - 1; i > 0; --i) out += v.s.substr(st[i - 1], st[i] - st[i - 1]);
      return same_kind(out);
    }
    // reversed(x) where x is reversible (an iterator: list_reverseiterator, reversed, ...);
    // else list(x) reversed (jinja2's do_reverse).
    const bool reversible = v.is_list() ? !v.is_iterator() : v.k == Value::K::kDict;
    auto items = iterate(c, p, v);
    std::reverse(items.begin(), items.end());
    if (!reversible) return Value::make_list(std::move(items));
    return make_lazy(std::move(items),
                     v.tuple ? Value::Lazy::kReversed : Value::Lazy::kReverseIterator);
  }
  if (name == "items") {  // jinja2's do_items: a generator of the (key, value) pairs
    if (v.is_undefined()) return make_lazy({}, Value::Lazy::kGenerator);
    if (v.k != Value::K::kDict || v.dict->ns)
      rt_fail(c, p, "Can only get item pairs from a mapping.");
    CallArgs none;
    Value pairs = call_method(c, p, v, "items", none);
    pairs.lazy = Value::Lazy::kGenerator;
    return pairs;
  }
  if (name == "dictsort") {
    if (v.k != Value::K::kDict) rt_fail(c, p, "filter 'dictsort' needs a mapping");
    const Value* cs = arg(a, 0, "case_sensitive");
    const Value* by = arg(a, 1, "by");
    const Value* rev = arg(a, 2, "reverse");
    CallArgs none;
    Value items = call_method(c, p, v, "items", none);
    return sorted(c, p, *items.list, rev && truthy(*rev), cs && truthy(*cs),
                  (by && to_str(*by) == "value") ? "1" : "0");
  }
  if (name == "sort") {
    const Value* rev = arg(a, 0, "reverse");
    const Value* cs = arg(a, 1, "case_sensitive");
    const Value* at = arg(a, 2, "attribute");
    return sorted(c, p, iterate(c, p, v), rev && truthy(*rev), cs && truthy(*cs),
                  at ? to_str(*at) : "");
  }
  if (name == "unique") {
    Value out = make_lazy({}, Value::Lazy::kGenerator);
    const Value* at = kwarg(a, "attribute");
    std::vector<Value> seen;
    for (const auto& e : iterate(c, p, v)) {
      Value k = at ? attr_path(c, p, e, to_str(*at)) : e;
      if (k.is_string()) k.s = ascii_case(k.s, false);
      bool dup = false;
      c.budget.charge(seen.size() * sizeof(Value));  // quadratic: charged as such
      for (const auto& s : seen) dup = dup || equal(s, k);
      if (!dup) {
        seen.push_back(k);
        out.list->push_back(e);
      }
    }
    return out;
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr")
    return select_like(c, p, name, v, a);
  if (name == "map") {  // jinja2's do_map: `if value:` first, then a generator
    Value out = make_lazy({}, Value::Lazy::kGenerator);
    const Value* at = kwarg(a, "attribute");
    const Value* dflt = kwarg(a, "default");
    for (const auto& e : truthy(v) ? iterate(c, p, v) : std::vector<Value>()) {
      if (at) {
        Value x = attr_path(c, p, e, to_str(*at));
        out.list->push_back((x.is_undefined() && dflt) ? *dflt : x);
      } else {
        if (a.pos.empty() || !a.pos[0].is_string())
          rt_fail(c, p, "map needs a filter name or attribute=");
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
    for (const auto& e : iterate(c, p, v))
      total = binary(c, p, "+", total, at ? attr_path(c, p, e, to_str(*at)) : e);
    return total;
  }
  if (name == "min" || name == "max") {
    auto items = iterate(c, p, v);
    if (items.empty()) return Value::undefined_hint("No aggregated item, sequence was empty.");
    const Value* at = kwarg(a, "attribute");
    Value best = items[0];
    for (const auto& e : items) {
      Value ka = at ? attr_path(c, p, e, to_str(*at)) : e,
            kb = at ? attr_path(c, p, best, to_str(*at)) : best;
      int cmp = compare(c, p, ka, kb, "<");
      if (name == "min" ? cmp < 0 : cmp > 0) best = e;
    }
    return best;
  }
  if (name == "indent") {
    const Value* w = arg(a, 0, "width");
    const Value* first = arg(a, 1, "first");
    const Value* blank = arg(a, 2, "blank");
    // jinja2: width is a string, or a count of spaces (" " * width: none when negative)
    std::string pad;
    if (w && w->is_string()) {
      pad = w->s;
    } else {
      const int64_t n = w ? w->as_int() : 4;
      if (n > 0) c.budget.check_length(static_cast<size_t>(n), "indent's width");
      pad.assign(n > 0 ? static_cast<size_t>(n) : 0, ' ');
    }
    std::string s = to_str(v), out;
    size_t i = 0;
    bool first_line = true;
    while (i <= s.size()) {
      size_t j = s.find('\n', i);
      std::string line = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
      bool add =
          first_line ? (first && truthy(*first)) : (!line.empty() || (blank && truthy(*blank)));
      limit_string(out.size() + (add ? pad.size() : 0) + line.size() + 1, "indent's result");
      if (add) out += pad;
      out += line;
      if (j == std::string::npos) break;
      out += '\n';
      i = j + 1;
      first_line = false;
    }
    return same_kind(std::move(out));
  }
  if (name == "format") {  // jinja2's do_format: value % (kwargs or args)
    if (!a.pos.empty() && !a.kw.empty())
      rt_fail(c, p, "can't handle positional and keyword arguments at the same time");
    Value args;
    if (!a.kw.empty()) {
      args = Value::make_dict();
      for (const auto& kv : a.kw) args.dict->set(kv.first, kv.second);
    } else {
      args = Value::make_list(List(a.pos.begin(), a.pos.end()));
      args.tuple = true;
    }
    Value fmt = v.is_string() ? v : Value::string(to_str(v));
    return percent_format(c, p, fmt, args);
  }
  if (name == "wordcount")
    return Value::integer(static_cast<int64_t>(py_split(to_str(v), nullptr, -1).size()));
  rt_fail(c, p, "unknown filter '" + name + "'");
}

}  // namespace ciuic::jinja
