// Values of the Jinja engine (jinja.h) with Python's semantics, and the budget of the render in
// progress on this thread.
//
// A Value is a small tagged union: strings by value, lists and dicts shared (as Python's
// references). Lists and dicts are immutable once built except namespaces (`{% set ns.x %}`), so
// a cycle always passes through a namespace; the render clears its namespaces when it ends, which
// frees every cycle. Deep values (a list nested 100,000 times by a loop) are freed without
// recursion (List/Dict destructors hand their children to one loop per thread).
//
// The budget: Template::render installs one Budget per render for its thread (BudgetScope).
// Making a string or list (Value::string, make_list) and scanning one charge it and check the
// limits at once; copying a Value adds its string's size, checked at the next charge or step.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "jinja/jinja.h"

namespace ciuic::jinja {

struct Pos {
  int line = 1, col = 1;
};

// Throws TemplateError "<origin>:<line>:<col>: <msg>".
[[noreturn]] void fail_at(const std::string& origin, Pos p, const std::string& msg);
std::string excerpt(std::string_view s, size_t max = 60);

// ---- the render's budget -------------------------------------------------------------------
struct Dict;

struct Budget {
  Limits limits;
  const std::string* origin = nullptr;
  Pos at;             // the expression or statement being evaluated (for errors found elsewhere)
  int64_t steps = 0;  // evaluations
  int64_t bytes = 0;  // bytes made, copied or scanned
  int depth = 0;      // evaluations in progress
  std::vector<std::weak_ptr<Dict>> namespaces;  // cleared when the render ends (frees cycles)

  [[noreturn]] void fail(const std::string& msg) const;
  // One evaluation at `p`: checks steps and bytes.
  void step(Pos p);
  // Work worth `n` steps (checked at the next step).
  void add_steps(int64_t n) { steps += n; }
  // `n` bytes scanned, copied or made: fails past max_bytes.
  void charge(size_t n) {
    bytes += static_cast<int64_t>(n);
    if (bytes > limits.max_bytes) over_bytes();
  }
  [[noreturn]] void over_bytes() const;
  // A string of `n` bytes or a list of `n` items is about to be made: fails past the limits.
  void check_string(size_t n, const char* what = "a string");
  void check_items(size_t n, const char* what = "a list");
  // A string being built has reached `n` bytes: fails past max_string_bytes (charges nothing).
  void check_length(size_t n, const char* what) const;
};

// The budget of the render on this thread, or null outside one.
Budget* budget();
// Installs `b` for this thread while alive (renders do not nest; the previous one is restored).
class BudgetScope {
 public:
  explicit BudgetScope(Budget* b);
  ~BudgetScope();
  BudgetScope(const BudgetScope&) = delete;
  BudgetScope& operator=(const BudgetScope&) = delete;

 private:
  Budget* saved_;
};

// Charges and checks making a string / list of n when a render is in progress.
inline void charge_string(size_t n, const char* what = "a string") {
  if (Budget* b = budget()) b->check_string(n, what);
}
inline void charge_items(size_t n, const char* what = "a list") {
  if (Budget* b = budget()) b->check_items(n, what);
}
inline void limit_string(size_t n, const char* what) {
  if (Budget* b = budget()) b->check_length(n, what);
}
inline void charge_scan(size_t n) {
  if (Budget* b = budget()) b->charge(n);
}

// ---- values --------------------------------------------------------------------------------
struct Value;
struct Func;
struct Ctx;

// A list's items; freed without recursion however deep.
struct List : std::vector<Value> {
  using std::vector<Value>::vector;
  List() = default;
  // Of an iterator (Value::Lazy kGenerator, kReverseIterator): the items before this one were
  // taken by an earlier iteration (Python's iterators are consumed once).
  size_t consumed = 0;
  List(std::vector<Value>&& v);
  List(const List&) = default;
  List(List&&) = default;
  List& operator=(const List&) = default;
  List& operator=(List&&) = default;
  ~List();
};

struct CallArgs {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
};

struct Value {
  enum class K : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kString, kList, kDict, kFunc };
  // What Python object a kList stands for, beyond list and tuple: jinja2's map/select/... return
  // generators, reverse a list_reverseiterator, dict.items() a view, range() a range. Each has
  // Python's behaviour: iterators are consumed once, always true, have no len() and no [i];
  // views and ranges have len(); none of them is JSON serializable (transformers' tojson raises).
  enum class Lazy : uint8_t {
    kNone,
    kGenerator,
    kReverseIterator,
    kReversed,
    kDictItems,
    kDictKeys,
    kDictValues,
    kRange
  };
  K k = K::kUndefined;
  bool b = false;
  bool tuple = false;  // a list printed as a Python tuple (tuple literals, dict items)
  bool markup =
      false;  // a string that is markupsafe's Markup (|safe, |escape): + escapes the other side
  Lazy lazy = Lazy::kNone;
  int64_t i = 0;
  double f = 0;
  std::string s;  // string value, or the name of an undefined value (its message when b is set)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Func> func;

  Value() = default;
  Value(const Value& o);  // charges the string copied to the render's budget
  Value(Value&&) noexcept = default;
  Value& operator=(const Value& o);
  Value& operator=(Value&&) noexcept = default;
  ~Value() = default;

  static Value undefined(std::string name = "");
  // An Undefined whose message is `message` (jinja2's hint: "'dict object' has no attribute 'x'").
  static Value undefined_hint(std::string message);
  static Value none();
  static Value boolean(bool x);
  static Value integer(int64_t x);
  static Value number(double x);
  static Value string(std::string x);         // checks Limits::max_string_bytes
  static Value markup_string(std::string x);  // a Markup (already escaped text)
  static Value make_list(List items = {});    // checks Limits::max_list_items
  static Value make_dict(bool ns = false);
  static Value function(std::string name, std::function<Value(CallArgs&, Ctx&)> fn);

  bool is_undefined() const { return k == K::kUndefined; }
  bool is_none() const { return k == K::kNone; }
  bool is_number() const { return k == K::kInt || k == K::kFloat || k == K::kBool; }
  bool is_string() const { return k == K::kString; }
  bool is_int() const { return k == K::kInt || k == K::kBool; }
  bool is_list() const { return k == K::kList; }
  // A plain list or tuple (not an iterator, view or range).
  bool is_plain_list() const { return k == K::kList && lazy == Lazy::kNone; }
  // An iterator: consumed when iterated, always true, no len(), not subscriptable.
  bool is_iterator() const {
    return k == K::kList &&
           (lazy == Lazy::kGenerator || lazy == Lazy::kReverseIterator || lazy == Lazy::kReversed);
  }
  double as_double() const {
    return k == K::kFloat ? f : k == K::kBool ? (b ? 1 : 0) : static_cast<double>(i);
  }
  // The integer value; a float truncated toward zero and saturated (NaN = 0), as a size.
  int64_t as_int() const;
};

// A dict: keys are any hashable value (str, int, float, bool, None, tuple), looked up as Python
// does (1, 1.0 and True are one key; the first key written stays, its value is replaced).
// `items` keeps the insertion order; it only grows (set() or appending) until clear(). String
// keys of a dict past a few items are found through a hash index kept up with the appends, so
// building or reading a large dict is not quadratic; other keys are compared one by one, the
// scan charged to the render's budget.
struct Dict {
  std::vector<std::pair<Value, Value>> items;
  bool ns = false;  // a namespace(): attributes may be assigned with {% set ns.x = ... %}
  Dict() = default;
  ~Dict();  // frees deep values without recursion
  const Value* find(std::string_view key) const;
  const Value* find(const Value& key) const;  // null also for an unhashable key
  void set(const std::string& key, Value v);
  void set(Value key, Value v);  // the key must be hashable (hashable())
  void clear();

 private:
  Value* find_str(std::string_view key) const;
  // Open addressing over the string keys: 1 + their position in items, 0 for an empty slot.
  mutable std::vector<uint32_t> slots_;
  mutable size_t indexed_ = 0;  // items[0, indexed_) are in slots_
};

// Python's hash() would accept it: not a list, dict, iterator or view (a tuple of such neither).
// Fills *type with the unhashable type's name.
bool hashable(const Value& v, const char** type = nullptr);

struct Func {
  std::string name;
  std::function<Value(CallArgs&, Ctx&)> fn;
};

// A list standing for a Python iterator, view or range (Value::Lazy); `repr` is what str() of a
// range prints (empty otherwise).
Value make_lazy(List items, Value::Lazy kind, std::string repr = "");
// markupsafe's escape(): & < > " ' as &amp; &lt; &gt; &#34; &#39; (the size is checked first).
std::string html_escape(std::string_view s);

// The variables of a render (depth checked: Limits::max_value_depth).
Value from_json(const nlohmann::ordered_json& j, int depth = 0);
const char* type_name(const Value& v);
std::string py_float(double x);                 // Python's repr(float)
std::string py_repr_str(const std::string& s);  // Python's repr(str)
// Python's str() (what {{ x }} prints) and repr(); a container met again inside itself prints as
// Python prints it ([...], {...}); nesting past Limits::max_value_depth is an error.
std::string to_str(const Value& v);
std::string repr(const Value& v);
bool truthy(const Value& v);
// Python's ==; the budget is charged per item compared; nesting past max_value_depth is an error.
bool equal(const Value& a, const Value& b);

// ---- tojson (transformers' filter: json.dumps(x, ensure_ascii=False, indent, separators)) ----
struct JsonFormat {
  bool indented = false;  // indent is not None
  std::string indent;     // the indent of one level (" " * n, or the string given)
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};
// Appends json.dumps(v); throws std::runtime_error with Python's message for what is not
// serializable (and for a circular reference), TemplateError for a limit.
void to_json(std::string& out, const Value& v, const JsonFormat& f, int depth = 0);

}  // namespace ciuic::jinja
