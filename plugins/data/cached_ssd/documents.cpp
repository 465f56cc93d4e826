#include "documents.h"

#include <ciuic/json.h>
#include <nlohmann/json.hpp>

namespace ciuic::data {

std::string bounded_utf8(std::string_view s, size_t max) {
  auto cont = [&](size_t i) {
    return i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80;
  };
  std::string out;
  size_t i = 0;
  while (i < s.size() && out.size() < max) {
    const auto b = static_cast<unsigned char>(s[i]);
    size_t n = 0;  // length of a well-formed sequence starting at i, 0 if none
    if (b < 0x80) {
      // Control bytes but '\n' and '\t' (ESC, BEL, NUL, DEL) are written \xNN as well, as
      // ciuic::Error writes them: a quoted line must not send terminal escapes (issue 27).
      n = (b >= 0x20 && b != 0x7f) || b == '\n' || b == '\t' ? 1 : 0;
    } else if (b >= 0xC2 && b <= 0xDF) {
      n = cont(i + 1) ? 2 : 0;
    } else if (b >= 0xE0 && b <= 0xEF) {
      const auto c = i + 1 < s.size() ? static_cast<unsigned char>(s[i + 1]) : 0;
      const bool ok = (b == 0xE0 ? c >= 0xA0 : b == 0xED ? c <= 0x9F : true);
      n = ok && cont(i + 1) && cont(i + 2) ? 3 : 0;
    } else if (b >= 0xF0 && b <= 0xF4) {
      const auto c = i + 1 < s.size() ? static_cast<unsigned char>(s[i + 1]) : 0;
      const bool ok = (b == 0xF0 ? c >= 0x90 : b == 0xF4 ? c <= 0x8F : true);
      n = ok && cont(i + 1) && cont(i + 2) && cont(i + 3) ? 4 : 0;
    }
    if (n) {
      out.append(s.substr(i, n));
      i += n;
    } else {
      static const char* hex = "0123456789ABCDEF";
      out += "\\x";
      out += hex[b >> 4];
      out += hex[b & 15];
      ++i;
    }
  }
  if (i < s.size()) out += "... (" + std::to_string(s.size()) + " bytes in all)";
  return out;
}

namespace {

std::string type_name(const nlohmann::json& j) { return j.type_name(); }

size_t append(const std::vector<int32_t>& src, const std::vector<uint8_t>* src_mask,
              std::vector<uint32_t>& ids, std::vector<uint8_t>& mask) {
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] < 0) throw LineError("the tokenizer returned a negative token id");
    ids.push_back(static_cast<uint32_t>(src[i]));
    mask.push_back(src_mask ? ((*src_mask)[i] ? 1 : 0) : 1);
  }
  return src.size();
}

size_t encode_text(const nlohmann::json& j, const DocumentSettings& s, std::vector<uint32_t>& ids,
                   std::vector<uint8_t>& mask) {
  auto it = j.find(s.text_field);
  if (it == j.end()) throw LineError("missing field \"" + s.text_field + "\" (format = \"text\")");
  if (!it->is_string())
    throw LineError("field \"" + s.text_field + "\" must be a string, found " + type_name(*it));
  const auto& text = it->get_ref<const std::string&>();
  if (text.empty()) return 0;
  std::vector<int32_t> toks = s.tokenizer->encode(text, s.add_bos);
  if (s.add_eos) {
    if (auto eos = s.tokenizer->eos_id(); eos && (toks.empty() || toks.back() != *eos))
      toks.push_back(*eos);
  }
  return append(toks, nullptr, ids, mask);
}

size_t encode_chat(const nlohmann::json& j, const DocumentSettings& s, std::vector<uint32_t>& ids,
                   std::vector<uint8_t>& mask) {
  auto it = j.find(s.messages_field);
  if (it == j.end())
    throw LineError("missing field \"" + s.messages_field + "\" (format = \"chat\")");
  if (!it->is_array())
    throw LineError("field \"" + s.messages_field +
                    "\" must be an array of {role, content}, found " + type_name(*it));
  std::vector<ChatMessage> messages;
  messages.reserve(it->size());
  for (size_t i = 0; i < it->size(); ++i) {
    const auto& m = (*it)[i];
    const std::string where = s.messages_field + "[" + std::to_string(i) + "]";
    if (!m.is_object())
      throw LineError(where + " must be an object {role, content}, found " + type_name(m));
    auto r = m.find("role");
    auto c = m.find("content");
    if (r == m.end() || !r->is_string())
      throw LineError(where + ".role is missing or not a string");
    if (c == m.end() || !c->is_string())
      throw LineError(where + ".content is missing or not a string");
    std::string role = r->get<std::string>();
    if (role == "prompter") role = "user";
    if (role != "system" && role != "user" && role != "assistant")
      throw LineError(where + ".role: unknown role \"" + r->get<std::string>() +
                      "\" (known: " + kKnownRoles + ")");
    messages.push_back({std::move(role), c->get<std::string>()});
  }
  if (messages.empty()) return 0;
  EncodedChat enc = s.chat_template->encode(messages, s.assistant_only_loss);
  if (enc.loss_mask.size() != enc.ids.size())
    throw LineError("the chat template returned " + std::to_string(enc.ids.size()) + " ids but " +
                    std::to_string(enc.loss_mask.size()) + " mask entries");
  return append(enc.ids, &enc.loss_mask, ids, mask);
}

}  // namespace

size_t encode_line(std::string_view line, const DocumentSettings& s, std::vector<uint32_t>& ids,
                   std::vector<uint8_t>& mask) {
  // Before a value is built: a line nested 100,000 deep must be an error of its line, not a crash.
  if (const std::string deep = json_depth_problem(line); !deep.empty())
    throw LineError("JSON " + deep + "; ciuic reads at most " + std::to_string(kMaxJsonDepth));
  nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Re-parse with exceptions for the parser's description of what is wrong (rare path).
    try {
      nlohmann::json again = nlohmann::json::parse(line);
      (void)again;
    } catch (
        const nlohmann::json::exception& e) {  // parse_error, or out_of_range (a number overflows)
      std::string what = e.what();
      auto p = what.find("parse error");
      throw LineError("malformed JSON: " + (p == std::string::npos ? what : what.substr(p)));
    }
    throw LineError("malformed JSON");
  }
  if (!j.is_object()) throw LineError("expected a JSON object, found " + type_name(j));
  return s.format == Format::kText ? encode_text(j, s, ids, mask) : encode_chat(j, s, ids, mask);
}

}  // namespace ciuic::data
