// jinja.h: parse once, render many times (each render with its own Ctx and Budget).
#include <new>
#include <stdexcept>

#include "jinja/builtins.h"
#include "jinja/jinja.h"
#include "jinja/parser.h"

namespace ciuic::jinja {

struct Template::Impl {
  std::string origin;
  Limits limits;
  Body body;
  bool has_generation = false;
};

Template::Template(std::string_view source, std::string origin, Limits limits)
    : impl_(std::make_unique<Impl>()) {
  impl_->origin = std::move(origin);
  impl_->limits = limits;
  try {
    impl_->body =
        parse(lex(source, impl_->origin), impl_->origin, impl_->limits, &impl_->has_generation);
  } catch (const std::bad_alloc&) {
    fail_at(impl_->origin, Pos{}, "out of memory while parsing the template");
  }
}

Template::~Template() = default;

bool Template::has_generation_blocks() const { return impl_->has_generation; }
const std::string& Template::origin() const { return impl_->origin; }

Rendered Template::render(const nlohmann::ordered_json& variables) const {
  Rendered r;
  Budget budget;
  budget.limits = impl_->limits;
  budget.origin = &impl_->origin;
  BudgetScope scope(&budget);
  // Namespaces are the only mutable values, so every cycle passes through one: clearing them
  // when the render ends (however it ends) frees every cycle the template made.
  struct ClearNamespaces {
    Budget& b;
    ~ClearNamespaces() {
      for (auto& w : b.namespaces)
        if (auto d = w.lock()) d->clear();
    }
  };
  Ctx c{impl_->origin, &r.text, &r.generation, {}, budget};
  ClearNamespaces clear{budget};
  try {
    c.frames.emplace_back();
    add_globals(c.frames[0]);
    if (variables.is_object())
      for (auto it = variables.begin(); it != variables.end(); ++it)
        c.frames[0][it.key()] = from_json(it.value());
    exec_body(impl_->body, c);
  } catch (const std::bad_alloc&) {
    budget.fail("out of memory while rendering the template");
  } catch (const std::length_error&) {
    budget.fail("out of memory while rendering the template (a string or list too long)");
  }
  return r;
}

}  // namespace ciuic::jinja
