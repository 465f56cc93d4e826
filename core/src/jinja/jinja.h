// Internal: the subset of Jinja2 that Hugging Face chat templates use, rendered in C++.
//
// transformers renders `tokenizer_config.json`'s `chat_template` with jinja2's
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) plus the loopcontrols
// extension, its own `tojson` filter (json.dumps, no HTML escaping), `raise_exception(msg)` and
// `strftime_now(fmt)`, and the `{% generation %}` block. Template reproduces that environment:
//
//   source       as jinja2's lexer: \r\n and \r read as \n, one final newline dropped
//   statements   if/elif/else, for (tuple targets, `if` filter, `else`, loop.index/index0/
//                revindex/revindex0/first/last/length/previtem/nextitem/cycle), set (names,
//                namespace attributes, tuples, `{% set x %}...{% endset %}`), macro (with
//                varargs/kwargs) + call, filter blocks, break/continue, generation, raw,
//                comments, whitespace control (`-`, `+`, trim_blocks, lstrip_blocks)
//   expressions  Python literals, lists, tuples, dicts, attribute/item access, slices, calls
//                (with *args and **kwargs), + - * / // % ** ~, comparisons, in / not in,
//                and/or/not, `a if c else b`, filters (`|f(args)`) and tests (`is [not] t`)
//   values       Python semantics: str() of None/True/1.0/lists, truthiness, == across int and
//                float, negative indices, code-point strings, dict keys of any hashable type
//                (1, 1.0 and True one key); Undefined prints "" and is an error where Python's
//                jinja2 raises one; what jinja2 returns as a generator (map, select, reject,
//                selectattr, rejectattr, unique, items), an iterator (reverse), a view
//                (dict.items/keys/values) or a range behaves as one (consumed once, no len(),
//                not JSON serializable...); |safe and |escape make markupsafe Markup strings
//                (Markup + str escapes the str)
//   filters      abs attr capitalize count d default dictsort e escape first float forceescape
//                format indent int items join last length list lower map max min reject
//                rejectattr replace reverse round safe select selectattr sort string sum title
//                tojson trim unique upper wordcount
//   methods      str: strip lstrip rstrip split rsplit startswith endswith upper lower title
//                capitalize replace find rfind count join splitlines isdigit isalpha isalnum
//                isspace isupper islower format removeprefix removesuffix partition rpartition
//                zfill ljust rjust center swapcase casefold, and `%` formatting (format.cpp);
//                dict: items keys values get copy; list: index count copy (append, update, ...
//                are the sandbox's "unsafe" error, as ImmutableSandboxedEnvironment's)
//
// Anything outside the subset (include/import/extends, ...) is a parse error that names it.
// Templates are immutable after parsing and render() is safe from many threads.
//
// A sandbox: templates come from downloaded model folders and are hostile input. Parsing and
// rendering bound nesting, work and memory (Limits; docs/tokenizer.md "Limits"); any bound hit,
// an integer overflow (ints are int64: an error where Python's would grow) and memory exhaustion
// are TemplateErrors naming origin:line:col. Nothing a template does crashes or hangs.
//
// Layout (core/src/jinja/): value.h (values with Python semantics, the render budget), text.h
// (UTF-8 and Python str helpers), lexer.h, parser.h, ast.h (the tree), eval.h/eval.cpp
// (evaluation, operators), builtins.h (filters.cpp: filters and tests; methods.cpp: str/dict/list
// methods and globals; format.cpp: `%` and str.format), template.cpp (this header).
#pragma once

#include <ciuic/export.h>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>

namespace ciuic::jinja {

// A template's own error: parse errors (UsageError, "<origin>:<line>:<col>: ...") and errors
// while rendering, including raise_exception(msg) (message() is the template's message alone).
class CIUIC_API TemplateError : public UsageError {
 public:
  TemplateError(const std::string& what, std::string message, bool raised)
      : UsageError(what), message_(std::move(message)), raised_(raised) {}
  const std::string& message() const { return message_; }
  bool raised() const { return raised_; }  // thrown by the template's raise_exception()

 private:
  std::string message_;
  bool raised_;
};

// What one parse and one render may use. The defaults are the sandbox's (docs/tokenizer.md, with
// jinja2's equivalents); tests lower them. Every limit is checked where the work happens, before
// memory is taken where the size is known in advance (`'a' * n`, range, indent, tojson).
struct Limits {
  int max_nesting = 100;  // parser: nested (), [], {}, unary operators, not, blocks
  int max_expr_depth =
      500;  // depth of an expression tree (a chain a+b+c... or x|f|g... counts each link)
  int max_eval_depth = 1000;   // evaluator: expressions, statements and macro calls in progress
  int max_macro_depth = 100;   // macro calls in progress
  int max_value_depth = 500;   // printing, tojson, ==, <, of nested lists/dicts
  int64_t max_range = 100000;  // items of range() (jinja2's sandbox: MAX_RANGE)
  int64_t max_list_items = 1000000;     // items of any list (also iterating a string)
  int64_t max_string_bytes = 32 << 20;  // any string, the rendered text included
  int64_t max_steps =
      5000000;  // evaluations per render (expressions, statements; a loop iteration counts 2)
  int64_t max_bytes = int64_t{512}
                      << 20;  // bytes of strings and list slots made, copied or scanned
};

struct Rendered {
  std::string text;
  // Byte ranges [begin, end) of `text` written inside {% generation %} blocks, in order.
  std::vector<std::pair<size_t, size_t>> generation;
};

class CIUIC_API Template {
 public:
  // Parses `source`; throws TemplateError naming origin:line:col (also for nesting past `limits`).
  explicit Template(std::string_view source, std::string origin = "<template>", Limits limits = {});
  ~Template();
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;

  // Renders with `variables` (a JSON object: messages, add_generation_prompt, bos_token, ...).
  // Throws TemplateError on an error in the template or raised by it, on a limit hit and on
  // memory exhaustion (std::bad_alloc), each with the place in the template.
  Rendered render(const nlohmann::ordered_json& variables) const;

  bool has_generation_blocks() const;
  const std::string& origin() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ciuic::jinja
