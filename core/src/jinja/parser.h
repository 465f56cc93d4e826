// The Jinja parser: tokens (lexer.h) into the tree (ast.h) with jinja2's grammar and precedence.
// Nesting is bounded (Limits::max_nesting for brackets, unary operators and blocks,
// Limits::max_expr_depth for the height of an expression), so that neither parsing nor evaluating
// nor freeing a tree can exhaust the stack. Errors are TemplateErrors naming origin:line:col.
#pragma once

#include <string>
#include <vector>

#include "jinja/ast.h"
#include "jinja/lexer.h"

namespace ciuic::jinja {

// The template's body; *has_generation: whether it has {% generation %} blocks.
Body parse(std::vector<Token> tokens, const std::string& origin, const Limits& limits,
           bool* has_generation);

}  // namespace ciuic::jinja
