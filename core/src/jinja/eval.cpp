// Evaluation of the Jinja tree (ast.h): scopes, operators with Python's semantics on int64, loops,
// macros. Limits: docs/tokenizer.md "Limits".
#include "jinja/eval.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>

#include "jinja/ast.h"
#include "jinja/builtins.h"
#include "jinja/text.h"

namespace ciuic::jinja {

void rt_fail(const Ctx& c, Pos p, const std::string& msg) { fail_at(c.origin, p, msg); }

EvalScope::EvalScope(Ctx& c, Pos p) : b_(c.budget) {
  if (++b_.depth > b_.limits.max_eval_depth) {
    --b_.depth;
    b_.at = p;
    b_.fail("evaluation nested deeper than " + std::to_string(b_.limits.max_eval_depth) +
            " levels (ciuic's limit for templates; jinja2: RecursionError)");
  }
  try {
    b_.step(p);
  } catch (...) {
    --b_.depth;
    throw;
  }
}

void emit(Ctx& c, Pos p, std::string_view text) {
  if (text.empty()) return;
  const size_t n = c.out->size() + text.size();
  if (n > static_cast<uint64_t>(c.budget.limits.max_string_bytes)) {
    c.budget.at = p;
    c.budget.check_length(n, "the rendered text");
  }
  c.budget.charge(text.size());
  c.out->append(text);
}

Value lookup(const Ctx& c, const std::string& name) {
  for (auto it = c.frames.rbegin(); it != c.frames.rend(); ++it) {
    auto f = it->find(name);
    if (f != it->end()) return f->second;
  }
  return Value::undefined(name);
}

std::string undefined_msg(const Value& v) {
  if (v.b) return excerpt(v.s, 200);
  return v.s.empty() ? std::string("value is undefined")
                     : py_repr_str(excerpt(v.s, 80)) + " is undefined";
}

Flow exec_body(const Body& body, Ctx& c) {
  for (const auto& n : body) {
    Flow f = n->exec(c);
    if (f != Flow::kNormal) return f;
  }
  return Flow::kNormal;
}

std::vector<Value> iterate(Ctx& c, Pos p, const Value& v) {
  switch (v.k) {
    case Value::K::kUndefined: return {};
    case Value::K::kList:
      if (v.is_iterator()) {  // consumed: a second iteration sees what the first left
        const size_t from = std::min(v.list->consumed, v.list->size());
        v.list->consumed = v.list->size();
        c.budget.charge((v.list->size() - from) * sizeof(Value));
        return std::vector<Value>(v.list->begin() + static_cast<std::ptrdiff_t>(from),
                                  v.list->end());
      }
      c.budget.charge(v.list->size() * sizeof(Value));
      return *v.list;
    case Value::K::kDict: {
      std::vector<Value> keys;
      for (const auto& kv : v.dict->items) keys.push_back(kv.first);
      return keys;
    }
    case Value::K::kString: {
      const size_t n = cp_count(v.s);
      c.budget.at = p;
      c.budget.check_items(n, "the characters of a string");
      std::vector<Value> chars;
      chars.reserve(n);
      for (size_t i = 0; i < v.s.size();) {
        size_t len = 1;
        while (i + len < v.s.size() && (static_cast<unsigned char>(v.s[i + len]) & 0xC0) == 0x80)
          ++len;
        chars.push_back(Value::string(v.s.substr(i, len)));
        i += len;
      }
      return chars;
    }
    default: rt_fail(c, p, std::string("'") + type_name(v) + "' object is not iterable");
  }
}

// ---- integer arithmetic as Python's, within int64 -------------------------------------------
namespace {

[[noreturn]] void overflow(Ctx& c, Pos p, const std::string& what) {
  rt_fail(
      c, p,
      "integer overflow: " + what +
          " is past 64 bits (ciuic's templates compute with 64-bit integers where Python's grow)");
}

int64_t add(Ctx& c, Pos p, int64_t a, int64_t b, const char* op) {
  int64_t r;
  if (op[0] == '+' ? __builtin_add_overflow(a, b, &r) : __builtin_sub_overflow(a, b, &r))
    overflow(c, p, std::to_string(a) + " " + op + " " + std::to_string(b));
  return r;
}

int64_t mul(Ctx& c, Pos p, int64_t a, int64_t b) {
  int64_t r;
  if (__builtin_mul_overflow(a, b, &r))
    overflow(c, p, std::to_string(a) + " * " + std::to_string(b));
  return r;
}

// Python's a // b and a % b: floor division, the remainder has the divisor's sign. b != 0.
int64_t floordiv(Ctx& c, Pos p, int64_t a, int64_t b) {
  if (a == std::numeric_limits<int64_t>::min() && b == -1)
    overflow(c, p, std::to_string(a) + " // -1");
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

int64_t mod(int64_t a, int64_t b) {
  if (b == -1) return 0;  // also for INT64_MIN, where a % b would trap
  int64_t r = a % b;
  if (r != 0 && ((r < 0) != (b < 0))) r += b;
  return r;
}

// a ** e for e >= 0 by squaring: at most 64 multiplications, each checked.
int64_t power(Ctx& c, Pos p, int64_t a, int64_t e) {
  const int64_t a0 = a, e0 = e;
  if (a == 0 || a == 1) return e == 0 ? 1 : a;
  if (a == -1) return (e % 2 == 0) ? 1 : -1;
  int64_t r = 1;
  while (true) {
    if (e & 1) {
      if (__builtin_mul_overflow(r, a, &r))
        overflow(c, p, std::to_string(a0) + " ** " + std::to_string(e0));
    }
    e >>= 1;
    if (e == 0) break;
    if (__builtin_mul_overflow(a, a, &a))
      overflow(c, p, std::to_string(a0) + " ** " + std::to_string(e0));
  }
  return r;
}

// str * n and list * n, sized before anything is made.
Value repeat(Ctx& c, Pos p, const Value& s, int64_t n) {
  const uint64_t k = n > 0 ? static_cast<uint64_t>(n) : 0;
  c.budget.at = p;
  if (s.is_string()) {
    if (k && s.s.size() > static_cast<uint64_t>(c.budget.limits.max_string_bytes) / k)
      c.budget.fail("a string would be " + std::to_string(s.s.size()) + " x " + std::to_string(k) +
                    " bytes, longer than " + std::to_string(c.budget.limits.max_string_bytes) +
                    " bytes (ciuic's limit for a string in a template; docs/tokenizer.md)");
    std::string out;
    out.reserve(s.s.size() * k);
    for (uint64_t i = 0; i < k; ++i) out += s.s;
    Value r = Value::string(std::move(out));
    r.markup = s.markup;
    return r;
  }
  if (k && s.list->size() > static_cast<uint64_t>(c.budget.limits.max_list_items) / k)
    c.budget.fail("a list would have " + std::to_string(s.list->size()) + " x " +
                  std::to_string(k) + " items, more than " +
                  std::to_string(c.budget.limits.max_list_items) +
                  " (ciuic's limit for a list in a template; docs/tokenizer.md)");
  List l;
  l.reserve(s.list->size() * k);
  for (uint64_t i = 0; i < k; ++i) l.insert(l.end(), s.list->begin(), s.list->end());
  Value r = Value::make_list(std::move(l));
  r.tuple = s.tuple;
  return r;
}

}  // namespace

int64_t checked_neg(Ctx& c, Pos p, int64_t a) {
  if (a == std::numeric_limits<int64_t>::min()) overflow(c, p, "-(" + std::to_string(a) + ")");
  return -a;
}

Value binary(Ctx& c, Pos p, const std::string& op, const Value& a, const Value& b) {
  auto undefined_check = [&] {
    if (a.is_undefined()) rt_fail(c, p, undefined_msg(a));
    if (b.is_undefined()) rt_fail(c, p, undefined_msg(b));
  };
  auto unsupported = [&]() -> Value {
    rt_fail(c, p,
            "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
                type_name(b) + "'");
  };
  auto concat = [&](const std::string& x, const std::string& y) {
    c.budget.at = p;
    c.budget.check_length(x.size() + y.size(), "a string");
    return Value::string(x + y);
  };
  if (op == "~") return concat(to_str(a), to_str(b));
  if (op == "%" && a.is_string()) return percent_format(c, p, a, b);  // printf-style formatting
  undefined_check();
  const bool nums = a.is_number() && b.is_number();
  const bool floats = nums && (a.k == Value::K::kFloat || b.k == Value::K::kFloat);
  if (op == "+" || op == "-") {
    if (nums)
      return floats ? Value::number(op == "+" ? a.as_double() + b.as_double()
                                              : a.as_double() - b.as_double())
                    : Value::integer(add(c, p, a.as_int(), b.as_int(), op.c_str()));
    if (op == "-") return unsupported();
    if (a.is_string() && b.is_string()) {
      if (!a.markup && !b.markup) return concat(a.s, b.s);
      // Markup.__add__ / __radd__: the plain side is escaped, the result is Markup
      c.budget.at = p;
      Value r = concat(a.markup ? a.s : html_escape(a.s), b.markup ? b.s : html_escape(b.s));
      r.markup = true;
      return r;
    }
    if (a.markup || b.markup) return unsupported();
    if (a.k == Value::K::kList && b.k == Value::K::kList) {
      if (!a.is_plain_list()) return unsupported();
      if (!b.is_plain_list() || a.tuple != b.tuple)
        rt_fail(c, p,
                std::string("can only concatenate ") + type_name(a) + " (not \"" + type_name(b) +
                    "\") to " + type_name(a));
      c.budget.at = p;
      c.budget.check_items(a.list->size() + b.list->size());
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      Value r = Value::make_list(std::move(l));
      r.tuple = a.tuple;
      return r;
    }
    // Python: the left operand's type decides the message (str + 1, [1] + 'a'; 1 + 'a' is
    // unsupported)
    if (a.is_string())
      rt_fail(c, p,
              std::string("can only concatenate str (not \"") + type_name(b) +
                  "\") to str; use ~ to join a string with another value");
    if (a.is_plain_list())
      rt_fail(c, p,
              std::string("can only concatenate ") + type_name(a) + " (not \"" + type_name(b) +
                  "\") to " + type_name(a));
    return unsupported();
  }
  if (op == "*") {
    if (nums)
      return floats ? Value::number(a.as_double() * b.as_double())
                    : Value::integer(mul(c, p, a.as_int(), b.as_int()));
    if ((a.is_string() || a.is_plain_list()) && b.is_int()) return repeat(c, p, a, b.as_int());
    if ((b.is_string() || b.is_plain_list()) && a.is_int()) return repeat(c, p, b, a.as_int());
    return unsupported();
  }
  if (op == "/") {
    if (!nums) return unsupported();
    if (b.as_double() == 0) rt_fail(c, p, "division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (!nums) return unsupported();
    const bool fdiv = op == "//";
    if (floats) {
      if (b.as_double() == 0) rt_fail(c, p, fdiv ? "float floor division by zero" : "float modulo");
      const double x = a.as_double(), y = b.as_double();
      double r = std::fmod(x, y);
      if (fdiv) {  // Python's float_floor_div: (x - x % y) / y, floored
        double div = (x - r) / y;
        if (r != 0 && ((r < 0) != (y < 0))) div -= 1.0;
        double fl = std::floor(div);
        if (div - fl > 0.5) fl += 1.0;
        return Value::number(div == 0 ? std::copysign(0.0, x / y) : fl);
      }
      if (r != 0 && ((r < 0) != (y < 0)))
        r += y;
      else if (r == 0)
        r = std::copysign(0.0, y);
      return Value::number(r);
    }
    if (b.as_int() == 0)
      rt_fail(c, p, fdiv ? "integer division or modulo by zero" : "integer modulo by zero");
    return Value::integer(fdiv ? floordiv(c, p, a.as_int(), b.as_int())
                               : mod(a.as_int(), b.as_int()));
  }
  if (op == "**") {
    if (!nums) return unsupported();
    if (!floats && b.as_int() >= 0) return Value::integer(power(c, p, a.as_int(), b.as_int()));
    if (a.as_double() == 0 && b.as_double() < 0)
      rt_fail(c, p, "0.0 cannot be raised to a negative power");
    const double r = std::pow(a.as_double(), b.as_double());
    if (std::isinf(r) && std::isfinite(a.as_double()) && std::isfinite(b.as_double()))
      rt_fail(c, p, "(34, 'Numerical result out of range')");
    return Value::number(r);
  }
  return unsupported();
}

namespace {
int compare_at(Ctx& c, Pos p, const Value& a, const Value& b, const std::string& op, int depth) {
  if (a.is_number() && b.is_number()) {
    if (!(a.k == Value::K::kFloat || b.k == Value::K::kFloat)) {
      const int64_t x = a.as_int(), y = b.as_int();
      return x < y ? -1 : x > y ? 1 : 0;
    }
    double x = a.as_double(), y = b.as_double();
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    c.budget.charge(std::min(a.s.size(), b.s.size()));
    return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  }
  if (a.k == Value::K::kList && b.k == Value::K::kList) {
    if (depth > c.budget.limits.max_value_depth) {
      c.budget.at = p;
      c.budget.fail("comparing values nested deeper than " +
                    std::to_string(c.budget.limits.max_value_depth) +
                    " levels (ciuic's limit; Python: RecursionError)");
    }
    size_t n = std::min(a.list->size(), b.list->size());
    for (size_t i = 0; i < n; ++i) {
      c.budget.charge(sizeof(Value));
      if (equal((*a.list)[i], (*b.list)[i])) continue;
      return compare_at(c, p, (*a.list)[i], (*b.list)[i], op, depth + 1);
    }
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  if (a.is_undefined()) rt_fail(c, p, undefined_msg(a));
  if (b.is_undefined()) rt_fail(c, p, undefined_msg(b));
  rt_fail(c, p,
          "'" + op + "' not supported between instances of '" + type_name(a) + "' and '" +
              type_name(b) + "'");
}
}  // namespace

int compare(Ctx& c, Pos p, const Value& a, const Value& b, const std::string& op) {
  return compare_at(c, p, a, b, op, 0);
}

bool contains(Ctx& c, Pos p, const Value& container, const Value& item) {
  switch (container.k) {
    case Value::K::kString:
      if (!item.is_string())
        rt_fail(
            c, p,
            std::string("'in <string>' requires string as left operand, not ") + type_name(item));
      c.budget.charge(container.s.size());
      return find_sub(container.s, item.s) != std::string::npos;
    case Value::K::kList:
      if (container.is_iterator()) {  // `in` consumes an iterator up to the item found
        const List& l = *container.list;
        while (l.consumed < l.size()) {
          c.budget.charge(sizeof(Value));
          if (equal(l[container.list->consumed++], item)) return true;
        }
        return false;
      }
      for (const auto& e : *container.list) {
        c.budget.charge(sizeof(Value));
        if (equal(e, item)) return true;
      }
      return false;
    case Value::K::kDict: {
      c.budget.charge(container.dict->items.size() * sizeof(Value));
      const char* type = nullptr;
      if (!hashable(item, &type)) rt_fail(c, p, std::string("unhashable type: '") + type + "'");
      return container.dict->find(item) != nullptr;
    }
    case Value::K::kUndefined: return false;  // jinja2's Undefined iterates as empty
    default:
      rt_fail(c, p, std::string("argument of type '") + type_name(container) + "' is not iterable");
  }
}

// ---- expressions ---------------------------------------------------------------------------
Value ListExpr::evaluate(Ctx& c) const {
  List l;
  l.reserve(items.size());
  for (const auto& e : items) l.push_back(e->eval(c));
  Value v = Value::make_list(std::move(l));
  v.tuple = tuple;
  return v;
}

Value DictExpr::evaluate(Ctx& c) const {
  Value v = Value::make_dict();
  for (const auto& kv : items) {
    Value k = kv.first->eval(c);
    const char* type = nullptr;
    if (!hashable(k, &type))
      rt_fail(c, kv.first->pos, std::string("unhashable type: '") + type + "'");
    v.dict->set(std::move(k), kv.second->eval(c));
  }
  return v;
}

Value Unary::evaluate(Ctx& c) const {
  Value v = e->eval(c);
  if (op == "not") return Value::boolean(!truthy(v));
  if (!v.is_number())
    rt_fail(c, pos, "bad operand type for unary " + op + ": '" + type_name(v) + "'");
  if (op == "-")
    return v.k == Value::K::kFloat ? Value::number(-v.f)
                                   : Value::integer(checked_neg(c, pos, v.as_int()));
  return v.k == Value::K::kFloat ? v : Value::integer(v.as_int());
}

Value Binary::evaluate(Ctx& c) const {
  if (op == "and") {
    Value x = a->eval(c);
    return truthy(x) ? b->eval(c) : x;
  }
  if (op == "or") {
    Value x = a->eval(c);
    return truthy(x) ? x : b->eval(c);
  }
  Value x = a->eval(c), y = b->eval(c);
  c.budget.at = pos;
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

Value CondExpr::evaluate(Ctx& c) const {
  if (truthy(cond->eval(c))) return yes->eval(c);
  if (no) return no->eval(c);
  return Value::undefined_hint("the inline if-expression on line " + std::to_string(pos.line) +
                               " evaluated to false and no else section was defined.");
}

CallArgs Args::eval(Ctx& c) const {
  CallArgs a;
  for (const auto& e : pos) a.pos.push_back(e->eval(c));
  if (star) {
    Value xs = star->eval(c);
    if (xs.is_undefined() || xs.is_none() || xs.is_number() || xs.k == Value::K::kFunc)
      rt_fail(c, star->pos, std::string("Value after * must be an iterable, not ") + type_name(xs));
    for (auto& x : iterate(c, star->pos, xs)) a.pos.push_back(std::move(x));
  }
  for (const auto& kv : kw) a.kw.emplace_back(kv.first, kv.second->eval(c));
  if (dstar) {
    Value d = dstar->eval(c);
    if (d.k != Value::K::kDict || d.dict->ns)
      rt_fail(c, dstar->pos,
              std::string("argument after ** must be a mapping, not ") + type_name(d));
    for (const auto& kv : d.dict->items) {
      if (!kv.first.is_string()) rt_fail(c, dstar->pos, "keywords must be strings");
      for (const auto& have : a.kw)
        if (have.first == kv.first.s)
          rt_fail(c, dstar->pos, "got multiple values for keyword argument '" + have.first + "'");
      a.kw.emplace_back(kv.first.s, kv.second);
    }
  }
  return a;
}

int Args::depth() const {
  int d = 0;
  for (const auto& e : pos) d = std::max(d, e->depth);
  for (const auto& kv : kw) d = std::max(d, kv.second->depth);
  if (star) d = std::max(d, star->depth);
  if (dstar) d = std::max(d, dstar->depth);
  return d;
}

Value Call::evaluate(Ctx& c) const {
  Value f = fn->eval(c);
  CallArgs a = args.eval(c);
  c.budget.at = pos;
  return call_value(c, pos, f, a);
}

Value FilterExpr::evaluate(Ctx& c) const {
  Value v = e->eval(c);
  CallArgs a = args.eval(c);
  c.budget.at = pos;
  return apply_filter(c, pos, name, v, a);
}

Value TestExpr::evaluate(Ctx& c) const {
  Value v = e->eval(c);
  CallArgs a = args.eval(c);
  c.budget.at = pos;
  return Value::boolean(apply_test(c, pos, name, v, a) != negate);
}

std::vector<int64_t> slice_indices(Ctx& c, Pos p, int64_t n, const Value& start, const Value& stop,
                                   const Value& step) {
  auto opt = [&](const Value& v) -> std::optional<int64_t> {
    if (v.is_undefined() || v.is_none()) return std::nullopt;
    if (!v.is_int()) rt_fail(c, p, "slice indices must be integers or None");
    return v.as_int();
  };
  int64_t st = opt(step).value_or(1);
  if (st == 0) rt_fail(c, p, "slice step cannot be zero");
  auto norm = [&](std::optional<int64_t> x, int64_t dflt) {
    if (!x) return dflt;
    int64_t v = *x;
    if (v < 0) v = v < -n ? -n - 1 : v + n;  // no overflow for INT64_MIN
    if (st > 0) return std::clamp<int64_t>(v, 0, n);
    return std::clamp<int64_t>(v, -1, n - 1);
  };
  int64_t b = norm(opt(start), st > 0 ? 0 : n - 1);
  int64_t e = norm(opt(stop), st > 0 ? n : -1);
  std::vector<int64_t> idx;
  // b and e lie in [-1, n]: stepping cannot overflow while i stays in that range.
  if (st > 0)
    for (int64_t i = b; i < e; i = (st > e - i) ? e : i + st) idx.push_back(i);
  else
    for (int64_t i = b; i > e; i = (-(st + 1) >= i - e) ? e : i + st) idx.push_back(i);
  return idx;
}

Value SliceExpr::evaluate(Ctx& c) const {
  Value o = obj->eval(c);
  Value s0 = start ? start->eval(c) : Value::none(), s1 = stop ? stop->eval(c) : Value::none(),
        s2 = step ? step->eval(c) : Value::none();
  c.budget.at = pos;
  if (o.is_string()) {
    c.budget.charge(o.s.size() * sizeof(size_t));
    auto st = cp_starts(o.s);
    auto idx = slice_indices(c, pos, static_cast<int64_t>(st.size() - 1), s0, s1, s2);
    std::string out;
    for (int64_t i : idx)
      out += o.s.substr(st[static_cast<size_t>(i)],
                        st[static_cast<size_t>(i) + 1] - st[static_cast<size_t>(i)]);
    Value r = Value::string(out);
    r.markup = o.markup;
    return r;
  }
  if (o.k == Value::K::kList && !o.is_plain_list() && o.lazy != Value::Lazy::kRange)
    return Value::undefined();  // iterators and views are not subscriptable (jinja2: Undefined)
  if (o.k == Value::K::kList) {
    auto idx = slice_indices(c, pos, static_cast<int64_t>(o.list->size()), s0, s1, s2);
    List l;
    l.reserve(idx.size());
    for (int64_t i : idx) l.push_back((*o.list)[static_cast<size_t>(i)]);
    Value r = Value::make_list(std::move(l));
    r.tuple = o.tuple;
    return r;
  }
  if (o.is_undefined()) rt_fail(c, pos, undefined_msg(o));
  rt_fail(c, pos, std::string("'") + type_name(o) + "' object is not subscriptable");
}

// ---- statements ----------------------------------------------------------------------------
Flow Output::run(Ctx& c) const {
  emit(c, pos, text);
  return Flow::kNormal;
}

Flow Print::run(Ctx& c) const {
  const Value v = e->eval(c);
  c.budget.at = pos;
  if (v.is_string()) {
    emit(c, pos, v.s);
  } else {
    const std::string text = to_str(v);
    emit(c, pos, text);
  }
  return Flow::kNormal;
}

Flow If::run(Ctx& c) const {
  for (const auto& [cond, body] : branches)
    if (!cond || truthy(cond->eval(c))) return exec_body(body, c);
  return Flow::kNormal;
}

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
    rt_fail(c, t.pos,
            "cannot unpack " + std::to_string(items.size()) + " values into " +
                std::to_string(t.names.size()));
  for (size_t i = 0; i < items.size(); ++i) c.frames.back()[t.names[i]] = items[i];
}

namespace {
// Renders `body` into a string of its own (set blocks, macros, caller()).
std::string capture(Ctx& c, const Body& body) {
  std::string buf;
  std::string* saved = c.out;
  auto* saved_gen = c.gen;
  c.out = &buf;
  c.gen = nullptr;
  try {
    exec_body(body, c);
  } catch (...) {
    c.out = saved;
    c.gen = saved_gen;
    throw;
  }
  c.out = saved;
  c.gen = saved_gen;
  return buf;
}
}  // namespace

Flow Set::run(Ctx& c) const {
  Value v;
  if (value) {
    v = value->eval(c);
  } else {
    v = Value::string(capture(c, body));
    for (const auto& [name, args] : filters) {
      CallArgs a = args.eval(c);
      c.budget.at = pos;
      v = apply_filter(c, pos, name, v, a);
    }
  }
  assign(c, target, v);
  return Flow::kNormal;
}

Flow For::run(Ctx& c) const {
  Value seq = iter->eval(c);
  // A list is walked in place (seq keeps it alive: lists are immutable); anything else as
  // iterate().
  std::vector<Value> own;
  const bool in_place = seq.k == Value::K::kList && !seq.is_iterator();  // an iterator is consumed
  if (!in_place || filter) {
    std::vector<Value> all = in_place ? std::vector<Value>() : iterate(c, iter->pos, seq);
    const std::vector<Value>& from = in_place ? *seq.list : all;
    if (!filter) {
      own = std::move(all);
    } else {
      for (const auto& v : from) {
        c.frames.emplace_back();
        assign(c, target, v);
        bool keep = truthy(filter->eval(c));
        c.frames.pop_back();
        if (keep) own.push_back(v);
      }
    }
  }
  const std::vector<Value>& items = (in_place && !filter) ? *seq.list : own;
  if (items.empty()) return exec_body(else_body, c);
  const int64_t n = static_cast<int64_t>(items.size());
  // One loop object for the whole loop, updated in place (as jinja2's LoopContext), and one frame
  // emptied at each iteration: an iteration costs no allocation beyond the body's.
  auto index = std::make_shared<int64_t>(0);
  Value loop = Value::make_dict();
  Dict& d = *loop.dict;
  for (const char* key : {"index0", "index", "revindex0", "revindex", "first", "last", "length",
                          "depth", "depth0", "previtem", "nextitem"})
    d.items.emplace_back(Value::string(key), Value());
  d.items.emplace_back(Value::string("cycle"),
                       Value::function("loop.cycle", [index](CallArgs& a, Ctx& cc) -> Value {
                         if (a.pos.empty()) fail_here(cc, "no items for cycling given");
                         return a.pos[static_cast<size_t>(*index) % a.pos.size()];
                       }));
  d.items[6].second = Value::integer(n);
  d.items[7].second = Value::integer(1);
  d.items[8].second = Value::integer(0);
  c.frames.emplace_back();
  Flow f = Flow::kNormal;
  for (int64_t i = 0; i < n && f != Flow::kBreak; ++i) {
    c.budget.add_steps(
        1);  // an iteration costs about two expressions: two steps, even with an empty body
    c.budget.step(pos);
    *index = i;
    d.items[0].second = Value::integer(i);
    d.items[1].second = Value::integer(i + 1);
    d.items[2].second = Value::integer(n - i - 1);
    d.items[3].second = Value::integer(n - i);
    d.items[4].second = Value::boolean(i == 0);
    d.items[5].second = Value::boolean(i == n - 1);
    d.items[9].second = i > 0 ? items[static_cast<size_t>(i - 1)]
                              : Value::undefined_hint("there is no previous item");
    d.items[10].second = i + 1 < n ? items[static_cast<size_t>(i + 1)]
                                   : Value::undefined_hint("there is no next item");
    // A fresh scope per iteration (as jinja2): emptied when the body set names of its own.
    auto& frame = c.frames.back();
    if (frame.size() > 1 + target.names.size()) frame.clear();
    frame["loop"] = loop;
    assign(c, target, items[static_cast<size_t>(i)]);
    f = exec_body(body, c);
  }
  c.frames.pop_back();
  return Flow::kNormal;
}

Flow Generation::run(Ctx& c) const {
  size_t b = c.out->size();
  Flow f = exec_body(body, c);
  if (c.gen && c.out->size() > b) c.gen->emplace_back(b, c.out->size());
  return f;
}

namespace {
using Frames = std::vector<std::unordered_map<std::string, Value>>;

// The scopes a macro or a caller was defined in, above the template's top level (empty for a
// top-level macro): jinja2's macros and call blocks are closures over them.
Frames closure_of(Ctx& c) {
  if (c.frames.size() <= 1) return {};
  int64_t n = 0;
  for (size_t i = 1; i < c.frames.size(); ++i) n += static_cast<int64_t>(c.frames[i].size());
  c.budget.add_steps(n);  // the copy
  return Frames(c.frames.begin() + 1, c.frames.end());
}

// Runs `fn` with the frames [top level, *closure, fresh frame], then restores the caller's.
template <class Fn>
auto in_closure(Ctx& c, const Frames& closure, std::unordered_map<std::string, Value> frame,
                Fn fn) {
  Frames saved;
  saved.swap(c.frames);
  struct Restore {
    Ctx& c;
    Frames& saved;
    ~Restore() { c.frames.swap(saved); }
  } restore{c, saved};
  int64_t n = static_cast<int64_t>(saved.front().size());
  for (const auto& f : closure) n += static_cast<int64_t>(f.size());
  c.budget.add_steps(n);              // the copies below
  c.frames.push_back(saved.front());  // globals and top-level assignments, as they are now
  c.frames.insert(c.frames.end(), closure.begin(), closure.end());
  c.frames.push_back(std::move(frame));
  return fn();
}

Value call_macro(const Macro& m, const Frames& closure, CallArgs& a, Ctx& c, Pos p) {
  if (c.macro_depth >= c.budget.limits.max_macro_depth)
    rt_fail(c, p,
            "macro calls nested deeper than " + std::to_string(c.budget.limits.max_macro_depth) +
                " (ciuic's limit for templates; jinja2: RecursionError)");
  std::unordered_map<std::string, Value> frame;
  if (a.pos.size() > m.params.size() && !m.catch_varargs)
    rt_fail(c, p,
            "macro '" + m.name + "' takes not more than " + std::to_string(m.params.size()) +
                " argument(s)");
  List extra;
  for (size_t i = 0; i < a.pos.size(); ++i) {
    if (i < m.params.size())
      frame[m.params[i].first] = a.pos[i];
    else
      extra.push_back(a.pos[i]);
  }
  Value kwargs = Value::make_dict();
  for (auto& [k, v] : a.kw) {
    bool known = false;
    for (const auto& prm : m.params) known = known || prm.first == k;
    if (k == "caller" && !known) {  // {% call %} passes the caller to any macro
      frame[k] = v;
      continue;
    }
    if (!known) {
      if (!m.catch_kwargs)
        rt_fail(c, p, "macro '" + m.name + "' takes no keyword argument '" + k + "'");
      kwargs.dict->set(k, v);
      continue;
    }
    if (frame.count(k))
      rt_fail(c, p, "macro '" + m.name + "' got multiple values for argument '" + k + "'");
    frame[k] = v;
  }
  if (m.catch_varargs) {
    Value t = Value::make_list(std::move(extra));
    t.tuple = true;
    frame["varargs"] = std::move(t);
  }
  if (m.catch_kwargs) frame["kwargs"] = std::move(kwargs);
  ++c.macro_depth;
  struct Depth {
    int& d;
    ~Depth() { --d; }
  } depth{c.macro_depth};
  std::string out = in_closure(c, closure, std::move(frame), [&] {
    for (const auto& prm : m.params)
      if (!c.frames.back().count(prm.first))
        c.frames.back()[prm.first] =
            prm.second ? prm.second->eval(c)
                       : Value::undefined_hint("parameter '" + prm.first + "' was not provided");
    return capture(c, m.body);
  });
  return Value::string(std::move(out));
}
}  // namespace

Flow Macro::run(Ctx& c) const {
  const Macro* self = this;
  Pos p = pos;
  auto closure = std::make_shared<const Frames>(closure_of(c));
  c.frames.back()[name] = Value::function(name, [self, p, closure](CallArgs& a, Ctx& cc) {
    return call_macro(*self, *closure, a, cc, p);
  });
  return Flow::kNormal;
}

Flow FilterBlock::run(Ctx& c) const {
  Value v = Value::string(capture(c, body));
  for (const auto& [name, args] : filters) {
    CallArgs a = args.eval(c);
    c.budget.at = pos;
    v = apply_filter(c, pos, name, v, a);
  }
  c.budget.at = pos;
  emit(c, pos, to_str(v));
  return Flow::kNormal;
}

Flow CallBlock::run(Ctx& c) const {
  const Body* b = &body;
  auto closure =
      std::make_shared<const Frames>(closure_of(c));  // the body sees the call block's scope
  Value caller = Value::function("caller", [b, closure](CallArgs&, Ctx& cc) {
    return Value::string(in_closure(cc, *closure, {}, [&] { return capture(cc, *b); }));
  });
  c.frames.emplace_back();
  c.frames.back()["caller"] = caller;
  const Call* call_expr = static_cast<const Call*>(call.get());
  Value f = call_expr->fn->eval(c);
  CallArgs a = call_expr->args.eval(c);
  a.kw.emplace_back("caller", caller);
  Value r = call_value(c, pos, f, a);
  c.frames.pop_back();
  c.budget.at = pos;
  emit(c, pos, to_str(r));
  return Flow::kNormal;
}

}  // namespace ciuic::jinja
