// Internal: the subset of Jinja2 that Hugging Face chat templates use, rendered in C++.
//
// transformers renders `tokenizer_config.json`'s `chat_template` with jinja2's
// ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True) plus the loopcontrols
// extension, its own `tojson` filter (json.dumps, no HTML escaping), `raise_exception(msg)` and
// `strftime_now(fmt)`, and the `{% generation %}` block. Template reproduces that environment:
//
//   statements   if/elif/else, for (tuple targets, `if` filter, `else`, loop.index/index0/
//                revindex/revindex0/first/last/length/previtem/nextitem/cycle), set (names,
//                namespace attributes, tuples, `{% set x %}...{% endset %}`), macro + call,
//                break/continue, generation, raw, comments, whitespace control (`-`, `+`,
//                trim_blocks, lstrip_blocks)
//   expressions  Python literals, lists, tuples, dicts, attribute/item access, slices, calls,
//                + - * / // % ** ~, comparisons, in / not in, and/or/not, `a if c else b`,
//                filters (`|f(args)`) and tests (`is [not] t`)
//   values       Python semantics: str() of None/True/1.0/lists, truthiness, == across int and
//                float, negative indices, code-point strings; Undefined prints "" and is an
//                error where Python's jinja2 raises one
//   filters      abs attr capitalize count d default dictsort e escape first float indent int
//                items join last length list lower map max min reject rejectattr replace reverse
//                round safe select selectattr sort string sum title tojson trim unique upper
//                wordcount
//   methods      str: strip lstrip rstrip split rsplit startswith endswith upper lower title
//                capitalize replace find rfind count join splitlines isdigit isalpha isalnum
//                isspace isupper islower format-free; dict: items keys values get; list: index
//                count
//
// Anything outside the subset (include/import/extends, `{% filter %}`, ...) is a parse error that
// names it. Templates are immutable after parsing and render() is safe from many threads.
#pragma once

#include <ciuic/export.h>
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

struct Rendered {
  std::string text;
  // Byte ranges [begin, end) of `text` written inside {% generation %} blocks, in order.
  std::vector<std::pair<size_t, size_t>> generation;
};

class CIUIC_API Template {
 public:
  // Parses `source`; throws TemplateError naming origin:line:col.
  explicit Template(std::string_view source, std::string origin = "<template>");
  ~Template();
  Template(const Template&) = delete;
  Template& operator=(const Template&) = delete;

  // Renders with `variables` (a JSON object: messages, add_generation_prompt, bos_token, ...).
  // Throws TemplateError on an error in the template or raised by it.
  Rendered render(const nlohmann::ordered_json& variables) const;

  bool has_generation_blocks() const;
  const std::string& origin() const;

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace ciuic::jinja
