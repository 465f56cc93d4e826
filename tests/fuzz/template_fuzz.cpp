// tests/fuzz/template_fuzz.cpp — chat templates parsed AND rendered by the Jinja engine
// (core/src/jinja), the sandbox for tokenizer_config.json's chat_template.
//
// Input: one selector byte, then a template; anything after "\n%%\n" is the variables (a JSON
// object; when absent or not an object, a fixed conversation with bos/eos tokens and tools).
//   selector bit 0: add_generation_prompt;  bit 1: render twice (a render leaves no state behind).
// Limits: the defaults' shape, scaled down (kLimits) so that one input renders in milliseconds;
// the code that enforces them is the same.
// Checks: only ciuic::Error escapes (short, valid UTF-8 message); the text is within
// max_string_bytes; {% generation %} ranges are ordered and inside the text; a second render of
// the same input gives the same text (or the same error), so nothing leaks from one render into
// the next. LeakSanitizer sees the cycles a template can make through namespaces.
#include <string>

#include <nlohmann/json.hpp>

#include "fuzz_common.h"
#include "jinja/jinja.h"

namespace {

using ciuic::jinja::Limits;
using nlohmann::ordered_json;

Limits limits() {
  Limits l;
  l.max_steps = 200000;
  l.max_bytes = 16 << 20;
  l.max_string_bytes = 1 << 20;
  l.max_list_items = 100000;
  l.max_range = 10000;
  return l;
}

const ordered_json& conversation() {
  static const ordered_json v = ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "Hi \u00e9 <b> {{ x }}"},
      {"role": "assistant", "content": "Hello!", "tool_calls": [
        {"id": "call1", "type": "function", "function": {"name": "f", "arguments": {"city": "Paris", "n": 2}}}]},
      {"role": "tool", "content": "22C", "tool_call_id": "call1"},
      {"role": "user", "content": "Thanks"}],
    "bos_token": "<s>", "eos_token": "</s>",
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
  })");
  return v;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  const auto parts = ciuic::fuzz::split_once(in, "\n%%\n");
  const std::string_view source = parts.first, vars_text = parts.second;
  ordered_json vars = ordered_json::parse(vars_text, nullptr, /*allow_exceptions=*/false);
  if (!vars.is_object()) vars = conversation();
  vars["add_generation_prompt"] = (selector & 1) != 0;
  const Limits lim = limits();
  std::string first;
  ciuic::fuzz::expect_ok_or_error([&] {
    const ciuic::jinja::Template t(source, "fuzz/chat_template", lim);
    for (int round = 0; round < ((selector & 2) ? 2 : 1); ++round) {
      std::string outcome;
      const bool ok = ciuic::fuzz::expect_ok_or_error([&] {
        const ciuic::jinja::Rendered r = t.render(vars);
        ciuic::fuzz::check(r.text.size() <= static_cast<size_t>(lim.max_string_bytes),
                           "text past max_string_bytes");
        size_t last = 0;
        for (const auto& [b, e] : r.generation) {
          ciuic::fuzz::check(last <= b && b < e && e <= r.text.size(),
                             "generation range outside the text or unordered");
          last = e;
        }
        outcome = "ok:" + r.text;
      });
      if (!ok) outcome = "error";
      if (round == 0)
        first = outcome;
      else if (source.find("strftime_now") == std::string_view::npos)  // the clock may tick between
        ciuic::fuzz::check(first == outcome, "a second render differs from the first",
                           outcome.substr(0, 300));
    }
  });
  return 0;
}
