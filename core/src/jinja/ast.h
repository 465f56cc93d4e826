// The Jinja engine's syntax tree: expressions (Expr::eval) and statements (Node::exec), built by
// the parser (parser.h), evaluated by eval.cpp. Immutable after parsing; evaluation state lives in
// Ctx, so one tree renders on many threads at once.
//
// Every eval/exec is one step of the render's budget (EvalScope); Expr::depth is the height of
// the tree under a node, which the parser bounds (Limits::max_expr_depth) so that evaluating and
// freeing a tree cannot exhaust the stack.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "jinja/eval.h"

namespace ciuic::jinja {

struct Expr;
struct Node;
using ExprP = std::unique_ptr<Expr>;
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;

struct Expr {
  Pos pos;
  int depth = 1;  // height of the tree under this node (1: a leaf)
  virtual ~Expr() = default;
  Value eval(Ctx& c) const {
    EvalScope s(c, pos);
    return evaluate(c);
  }

 protected:
  virtual Value evaluate(Ctx& c) const = 0;
};

struct Node {
  Pos pos;
  virtual ~Node() = default;
  Flow exec(Ctx& c) const {
    EvalScope s(c, pos);
    return run(c);
  }

 protected:
  virtual Flow run(Ctx& c) const = 0;
};

Flow exec_body(const Body& body, Ctx& c);

// ---- expressions ---------------------------------------------------------------------------
struct Literal : Expr {
  Value v;
  Value evaluate(Ctx&) const override { return v; }
};

struct Name : Expr {
  std::string name;
  Value evaluate(Ctx& c) const override { return lookup(c, name); }
};

struct ListExpr : Expr {  // [a, b] and (a, b)
  std::vector<ExprP> items;
  bool tuple = false;
  Value evaluate(Ctx& c) const override;
};

struct DictExpr : Expr {
  std::vector<std::pair<ExprP, ExprP>> items;
  Value evaluate(Ctx& c) const override;
};

struct Unary : Expr {
  std::string op;  // "not", "-", "+"
  ExprP e;
  Value evaluate(Ctx& c) const override;
};

struct Binary : Expr {
  std::string op;  // and or == != < <= > >= in "not in" + - * / // % ** ~
  ExprP a, b;
  Value evaluate(Ctx& c) const override;
};

struct CondExpr : Expr {
  ExprP cond, yes, no;  // no may be null (undefined)
  Value evaluate(Ctx& c) const override;
};

struct Attr : Expr {
  ExprP obj;
  std::string name;
  Value evaluate(Ctx& c) const override { return get_attr(c, pos, obj->eval(c), name); }
};

struct Item : Expr {
  ExprP obj, key;
  Value evaluate(Ctx& c) const override { return get_item(c, pos, obj->eval(c), key->eval(c)); }
};

struct SliceExpr : Expr {
  ExprP obj, start, stop, step;  // start, stop, step may be null
  Value evaluate(Ctx& c) const override;
};

struct Args {
  std::vector<ExprP> pos;
  std::vector<std::pair<std::string, ExprP>> kw;
  ExprP star, dstar;  // f(*xs) and f(**d): appended to pos / kw (null when absent)
  CallArgs eval(Ctx& c) const;
  int depth() const;  // the deepest argument's
};

struct Call : Expr {
  ExprP fn;
  Args args;
  Value evaluate(Ctx& c) const override;
};

struct FilterExpr : Expr {
  ExprP e;
  std::string name;
  Args args;
  Value evaluate(Ctx& c) const override;
};

struct TestExpr : Expr {
  ExprP e;
  std::string name;
  Args args;
  bool negate = false;
  Value evaluate(Ctx& c) const override;
};

// ---- statements ----------------------------------------------------------------------------
struct Output : Node {  // template text
  std::string text;
  Flow run(Ctx& c) const override;
};

struct Print : Node {  // {{ e }}
  ExprP e;
  Flow run(Ctx& c) const override;
};

struct If : Node {
  std::vector<std::pair<ExprP, Body>> branches;  // cond null = else
  Flow run(Ctx& c) const override;
};

// Assignment target: a name, ns.attr, or a tuple of names.
struct Target {
  std::vector<std::string> names;  // several = tuple unpacking
  std::string attr;                // names[0].attr
  Pos pos;
};
void assign(Ctx& c, const Target& t, const Value& v);

struct Set : Node {
  Target target;
  ExprP value;  // null: block set
  Body body;
  std::vector<std::pair<std::string, Args>> filters;  // block set filters
  Flow run(Ctx& c) const override;
};

struct For : Node {
  Target target;
  ExprP iter;
  ExprP filter;  // `for x in xs if cond`
  Body body, else_body;
  Flow run(Ctx& c) const override;
};

struct LoopControl : Node {  // break, continue
  Flow flow;
  Flow run(Ctx&) const override { return flow; }
};

struct Generation : Node {
  Body body;
  Flow run(Ctx& c) const override;
};

struct Macro : Node {
  std::string name;
  std::vector<std::pair<std::string, ExprP>> params;  // default may be null
  // The body reads `varargs` / `kwargs` (as jinja2: extra arguments go there, else are an error).
  bool catch_varargs = false, catch_kwargs = false;
  Body body;
  Flow run(Ctx& c) const override;  // defines the macro in the current frame
};

struct FilterBlock : Node {  // {% filter f(args)|g %}body{% endfilter %}: the body's text, filtered
  std::vector<std::pair<std::string, Args>> filters;
  Body body;
  Flow run(Ctx& c) const override;
};

struct CallBlock : Node {  // {% call m(args) %}body{% endcall %}: caller() renders body
  ExprP call;              // a Call expression
  Body body;
  Flow run(Ctx& c) const override;
};

}  // namespace ciuic::jinja
