// A --prompts file's lines (app/prompt_lines.h).
#include "app/prompt_lines.h"

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/json.h>

namespace ciuic::app {

std::optional<PromptLine> parse_prompt_line(std::string_view line, const std::string& where) {
  if (line.find_first_not_of(" \t\r") == std::string_view::npos) return std::nullopt;
  check_json_depth(line, where, kExitUsage);
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    throw UsageError(where +
                     ": not a JSON object (expected {\"prompt\": ...} or {\"messages\": [...]})");
  PromptLine out;
  const auto prompt = j.find("prompt");
  const auto messages = j.find("messages");
  if (prompt != j.end() && prompt->is_string()) {
    out.prompt = prompt->get<std::string>();
  } else if (messages != j.end() && messages->is_array()) {
    for (const auto& m : *messages) {
      const auto role = m.is_object() ? m.find("role") : m.end();
      const auto content = m.is_object() ? m.find("content") : m.end();
      if (!m.is_object() || role == m.end() || !role->is_string() || content == m.end() ||
          !content->is_string())
        throw UsageError(where + ": each message needs string \"role\" and \"content\"");
      out.messages.push_back({role->get<std::string>(), content->get<std::string>()});
    }
  } else {
    throw UsageError(where + ": expected a string \"prompt\" or a \"messages\" list");
  }
  if (const auto stops = j.find("stop_strings"); stops != j.end()) {
    const auto bad = [&] {
      return UsageError(where + ": \"stop_strings\" must be a string or a list of strings");
    };
    std::vector<std::string> v;
    if (stops->is_string()) {
      v.push_back(stops->get<std::string>());
    } else if (stops->is_array()) {
      for (const auto& e : *stops) {
        if (!e.is_string()) throw bad();
        v.push_back(e.get<std::string>());
      }
    } else {
      throw bad();
    }
    out.stop_strings = std::move(v);
  }
  return out;
}

}  // namespace ciuic::app
