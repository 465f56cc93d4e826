// The nesting bound of JSON inputs (ciuic/json.h).
#include <ciuic/json.h>

namespace ciuic {

std::string json_depth_problem(std::string_view text, size_t max_depth) {
  size_t depth = 0, line = 1, line_start = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '\\')
        ++i;  // the escaped character (a quote or a backslash) cannot end the string
      else if (c == '"')
        in_string = false;
      else if (c == '\n')
        ++line, line_start = i + 1;  // invalid in JSON; counted for the position
      continue;
    }
    switch (c) {
      case '"': in_string = true; break;
      case '\n': ++line, line_start = i + 1; break;
      case '[':
      case '{':
        if (++depth > max_depth)
          return "nested deeper than " + std::to_string(max_depth) +
                 " levels (arrays and objects) at line " + std::to_string(line) + ", column " +
                 std::to_string(i - line_start + 1);
        break;
      case ']':
      case '}':
        if (depth > 0) --depth;
        break;
      default: break;
    }
  }
  return "";
}

void check_json_depth(std::string_view text, const std::string& origin, int exit_code) {
  const std::string problem = json_depth_problem(text);
  if (problem.empty()) return;
  const std::string m =
      origin + ": JSON " + problem + "; ciuic reads at most " + std::to_string(kMaxJsonDepth) +
      " (the recursion limit of serde_json, which HF tokenizers and safetensors use)";
  if (exit_code == kExitUsage) throw UsageError(m);
  throw Error(m, exit_code);
}

}  // namespace ciuic
