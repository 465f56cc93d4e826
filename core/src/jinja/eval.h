// Evaluation state and the operations of the Jinja engine that need a place for their errors:
// scopes (as jinja2: a for body and a macro have their own frame, `if` has not), operators with
// Python's semantics on int64 (an overflow is an error, never a wrap), iteration, comparison,
// attribute/item access and calls. Every function throws TemplateError naming origin:line:col.
#pragma once

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "jinja/value.h"

namespace ciuic::jinja {

struct Ctx {
  const std::string& origin;
  std::string* out;  // where text goes: the rendering, or a {% set %}/macro/caller buffer
  std::vector<std::pair<size_t, size_t>>* gen;  // {% generation %} ranges of the rendering, or null
  std::vector<std::unordered_map<std::string, Value>> frames;  // [0] = globals + template top level
  Budget& budget;
  int macro_depth = 0;
};

enum class Flow { kNormal, kBreak, kContinue };

[[noreturn]] void rt_fail(const Ctx& c, Pos p, const std::string& msg);
// An error at the expression being evaluated (for built-ins called without a position).
[[noreturn]] inline void fail_here(const Ctx& c, const std::string& msg) {
  rt_fail(c, c.budget.at, msg);
}

// One evaluation step at `p` while alive: counts the step and the evaluation depth
// (Limits::max_steps, max_eval_depth, max_bytes).
class EvalScope {
 public:
  EvalScope(Ctx& c, Pos p);
  ~EvalScope() { --b_.depth; }
  EvalScope(const EvalScope&) = delete;
  EvalScope& operator=(const EvalScope&) = delete;

 private:
  Budget& b_;
};

// Appends text to c.out within Limits::max_string_bytes.
void emit(Ctx& c, Pos p, std::string_view text);

Value lookup(const Ctx& c, const std::string& name);
std::string undefined_msg(const Value& v);

// The items `for` sees: a list's items, a dict's keys, a string's characters; Undefined is empty.
std::vector<Value> iterate(Ctx& c, Pos p, const Value& v);
// Binary operators + - * / // % ** ~ (not the comparisons).
Value binary(Ctx& c, Pos p, const std::string& op, const Value& a, const Value& b);
// -1, 0, 1 as Python's <; `op` names the operator in the error for unorderable types.
int compare(Ctx& c, Pos p, const Value& a, const Value& b, const std::string& op);
bool contains(Ctx& c, Pos p, const Value& container, const Value& item);
// Python's slice of n elements: the selected indices.
std::vector<int64_t> slice_indices(Ctx& c, Pos p, int64_t n, const Value& start, const Value& stop,
                                   const Value& step);
// Integer arithmetic as Python's, within int64: an overflow is an error at p.
int64_t checked_neg(Ctx& c, Pos p, int64_t a);

Value get_attr(Ctx& c, Pos p, const Value& obj, const std::string& name);
Value get_item(Ctx& c, Pos p, const Value& obj, const Value& key);
Value call_value(Ctx& c, Pos p, const Value& fn, CallArgs& args);

}  // namespace ciuic::jinja
