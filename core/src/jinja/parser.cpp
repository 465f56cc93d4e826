#include "jinja/parser.h"

#include <algorithm>
#include <charconv>
#include <cstdlib>

namespace ciuic::jinja {

namespace {

class Parser {
 public:
  Parser(std::vector<Token> toks, const std::string& origin, const Limits& limits)
      : t_(std::move(toks)), origin_(origin), limits_(limits) {}

  Body parse_template(bool* has_generation) {
    Body b = parse_body({});
    if (peek().type != T::kEof) fail("unexpected '" + describe(peek()) + "'");
    *has_generation = has_generation_;
    return b;
  }

 private:
  // One more level of nesting while alive (Limits::max_nesting).
  class Nest {
   public:
    explicit Nest(Parser& p) : p_(p) {
      if (++p_.nesting_ > p_.limits_.max_nesting)
        p_.fail("the template nests deeper than " + std::to_string(p_.limits_.max_nesting) +
                " levels of brackets, operators or blocks (ciuic's limit; jinja2: RecursionError)");
    }
    ~Nest() { --p_.nesting_; }
    Nest(const Nest&) = delete;
    Nest& operator=(const Nest&) = delete;

   private:
    Parser& p_;
  };

  // Sets e's height from its children's and checks Limits::max_expr_depth.
  template <class N>
  ExprP deep(std::unique_ptr<N> e, int children) {
    e->depth = children + 1;
    if (e->depth > limits_.max_expr_depth)
      fail_at(origin_, e->pos,
              "expression nested deeper than " + std::to_string(limits_.max_expr_depth) +
                  " levels (ciuic's limit: a chain of operators, filters or brackets counts each "
                  "link; jinja2: "
                  "RecursionError)");
    return e;
  }
  static int depth_of(const ExprP& e) { return e ? e->depth : 0; }

  const Token& peek(size_t k = 0) const { return t_[std::min(i_ + k, t_.size() - 1)]; }
  const Token& next() { return t_[std::min(i_++, t_.size() - 1)]; }
  bool is_op(const char* op, size_t k = 0) const {
    return peek(k).type == T::kOp && peek(k).text == op;
  }
  bool is_name(const char* n, size_t k = 0) const {
    return peek(k).type == T::kName && peek(k).text == n;
  }
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
    Nest nest(*this);
    Body body;
    while (true) {
      const Token& tk = peek();
      if (tk.type == T::kEof) {
        if (!ends.empty())
          fail("missing {% " + ends.back() + " %}");  // the closing tag (not an else)
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
    if (k == "if")
      n = parse_if();
    else if (k == "for")
      n = parse_for();
    else if (k == "set")
      n = parse_set();
    else if (k == "macro")
      n = parse_macro();
    else if (k == "call")
      n = parse_call_block();
    else if (k == "filter")
      n = parse_filter_block();
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
              "unsupported statement '{% " + k +
                  " %}' (chat templates support if, for, set, macro, call, "
                  "filter, break, continue, generation, raw)");
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
    if (!is_name("in"))
      fail("expected 'in' in the for statement, found '" + describe(peek()) + "'");
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
      parse_filter_ref(n->filters);
    }
    expect_block_end();
    n->body = parse_body({"endset"});
    ++i_;
    expect_block_end();
    return n;
  }

  // One filter of a {% set %} / {% filter %} block: name(.name)* and optional arguments.
  void parse_filter_ref(std::vector<std::pair<std::string, Args>>& filters) {
    std::string name = expect_name();
    while (is_op(".")) {
      ++i_;
      name += "." + expect_name();
    }
    Args a;
    if (is_op("(")) a = parse_call_args();
    filters.emplace_back(name, std::move(a));
  }

  NodeP parse_filter_block() {
    auto n = std::make_unique<FilterBlock>();
    parse_filter_ref(n->filters);
    while (is_op("|")) {
      ++i_;
      parse_filter_ref(n->filters);
    }
    expect_block_end();
    n->body = parse_body({"endfilter"});
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
    const bool saw_varargs = saw_varargs_, saw_kwargs = saw_kwargs_;
    saw_varargs_ = saw_kwargs_ = false;
    n->body = parse_body({"endmacro"});
    n->catch_varargs = saw_varargs_;
    n->catch_kwargs = saw_kwargs_;
    saw_varargs_ = saw_varargs_ || saw_varargs;
    saw_kwargs_ = saw_kwargs_ || saw_kwargs;
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
    const int h = items_depth(l->items);
    return deep(std::move(l), h);
  }

  ExprP parse_expr(bool with_condexpr = true) {
    Nest nest(*this);
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
      const int d = std::max({depth_of(c->yes), depth_of(c->cond), depth_of(c->no)});
      e = deep(std::move(c), d);
    }
    return e;
  }

  ExprP bin(std::string op, ExprP a, ExprP b, Pos p) {
    auto n = std::make_unique<Binary>();
    n->pos = p;
    n->op = std::move(op);
    n->a = std::move(a);
    n->b = std::move(b);
    const int d = std::max(n->a->depth, n->b->depth);
    return deep(std::move(n), d);
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
      Nest nest(*this);
      n->e = parse_not();
      const int d = n->e->depth;
      return deep(std::move(n), d);
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    while (true) {
      Pos p = peek().pos;
      std::string op;
      if (peek().type == T::kOp &&
          (peek().text == "==" || peek().text == "!=" || peek().text == "<" ||
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
      Nest nest(*this);
      n->e = parse_unary(false);
      const int d = n->e->depth;
      ExprP e = deep(std::move(n), d);
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
        saw_varargs_ = saw_varargs_ || t.text == "varargs";
        saw_kwargs_ = saw_kwargs_ || t.text == "kwargs";
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
          const int h = items_depth(l->items);
          return deep(std::move(l), h);
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
          int h = 0;
          for (const auto& kv : d->items) h = std::max({h, kv.first->depth, kv.second->depth});
          return deep(std::move(d), h);
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
    const int h = items_depth(l->items);
    return deep(std::move(l), h);
  }

  // jinja2's call arguments: positional, then keywords; one *iterable and one **mapping at most
  // (*xs before keywords' end, **d last); a trailing comma is allowed.
  Args parse_call_args() {
    const Pos open = peek().pos;
    expect_op("(");
    Args a;
    auto ensure = [&](bool ok) {
      if (!ok) fail_at(origin_, open, "invalid syntax for function call expression");
    };
    while (!is_op(")")) {
      if (is_op("*")) {
        ensure(!a.star && !a.dstar);
        ++i_;
        a.star = parse_expr();
      } else if (is_op("**")) {
        ensure(!a.dstar);
        ++i_;
        a.dstar = parse_expr();
      } else if (peek().type == T::kName && is_op("=", 1)) {
        ensure(!a.dstar);
        std::string k = next().text;
        ++i_;
        a.kw.emplace_back(k, parse_expr());
      } else {
        ensure(!a.star && !a.dstar && a.kw.empty());
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
          if (r.ec != std::errc())
            fail_at(origin_, t.pos, "integer literal out of range: " + t.text);
          l->v = Value::integer(index);
          it->key = std::move(l);
          const int d = it->obj->depth;
          e = deep(std::move(it), d);
          continue;
        }
        n->name = expect_name();
        const int d = n->obj->depth;
        e = deep(std::move(n), d);
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
          const int d =
              std::max({n->obj->depth, depth_of(n->start), depth_of(n->stop), depth_of(n->step)});
          e = deep(std::move(n), d);
        } else {
          auto n = std::make_unique<Item>();
          n->pos = p;
          n->obj = std::move(e);
          n->key = std::move(a);
          const int d = std::max(n->obj->depth, n->key->depth);
          e = deep(std::move(n), d);
        }
      } else if (is_op("(")) {
        Pos p = peek().pos;
        auto n = std::make_unique<Call>();
        n->pos = p;
        n->fn = std::move(e);
        n->args = parse_call_args();
        const int d = std::max(n->fn->depth, n->args.depth());
        e = deep(std::move(n), d);
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
        const int d = std::max(n->e->depth, n->args.depth());
        e = deep(std::move(n), d);
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
        } else if (peek().type == T::kString || peek().type == T::kInt ||
                   peek().type == T::kFloat || is_op("[") || is_op("{") ||
                   (peek().type == T::kName && !is_name("else") && !is_name("and") &&
                    !is_name("or") && !is_name("if") && !is_name("is") && !is_name("in") &&
                    !is_name("not"))) {
          n->args.pos.push_back(parse_postfix(parse_primary()));
        }
        const int d = std::max(n->e->depth, n->args.depth());
        e = deep(std::move(n), d);
      } else if (is_op("(")) {
        Pos p = peek().pos;
        auto n = std::make_unique<Call>();
        n->pos = p;
        n->fn = std::move(e);
        n->args = parse_call_args();
        const int d = std::max(n->fn->depth, n->args.depth());
        e = deep(std::move(n), d);
      } else {
        return e;
      }
    }
  }

  static int items_depth(const std::vector<ExprP>& items) {
    int d = 0;
    for (const auto& e : items) d = std::max(d, e->depth);
    return d;
  }

  std::vector<Token> t_;
  size_t i_ = 0;
  const std::string& origin_;
  const Limits& limits_;
  int nesting_ = 0;
  int loop_depth_ = 0;
  bool has_generation_ = false;
  bool saw_varargs_ = false, saw_kwargs_ = false;  // names read since the innermost macro began
};

}  // namespace

Body parse(std::vector<Token> tokens, const std::string& origin, const Limits& limits,
           bool* has_generation) {
  return Parser(std::move(tokens), origin, limits).parse_template(has_generation);
}

}  // namespace ciuic::jinja
