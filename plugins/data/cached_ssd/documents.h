// documents.h — one JSONL line to one tokenized training document.
//
// format "text": {"<text_field>": "..."} → [BOS] tokens(text) [EOS], loss on every token.
//   BOS is added by Tokenizer::encode(text, add_special_tokens = true) — i.e. exactly what the
//   tokenizer's post-processor adds, as HF `tokenizers` does (Llama/DeepSeek: BOS) — when add_bos;
//   EOS = Tokenizer::eos_id() is appended when add_eos and the tokenizer has one (and the
//   post-processor did not already end the sequence with it).
// format "chat": {"<messages_field>": [{"role": "system"|"user"|"assistant", "content": "..."}]}
//   ("prompter" is accepted as OpenAssistant's name for "user") → ChatTemplate::encode(), loss on
//   the assistant replies only when assistant_only_loss, on every token otherwise.
//
// Thread-safe (no shared mutable state; the tokenizer and template are immutable).
// Failure: LineError with a message that does not yet name the file and line (the caller adds
// them).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <ciuic/tokenizer.h>

namespace ciuic::data {

enum class Format { kText, kChat };

struct DocumentSettings {
  Format format = Format::kText;
  std::string text_field = "text";
  std::string messages_field = "messages";
  bool assistant_only_loss = true;
  bool add_bos = true;
  bool add_eos = true;
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;
};

// `s` cut to about `max` bytes (whole characters; "... (N bytes in all)" appended when cut), with
// every byte that is not part of well-formed UTF-8, and every control byte but '\n' and '\t',
// written as \xNN: error text that quotes user data (a 50 MB unterminated line, invalid UTF-8, an
// ESC sequence) stays short, can be written into JSON and sends nothing to a terminal.
std::string bounded_utf8(std::string_view s, size_t max = 300);

// The messages are bounded_utf8: they quote user data.
class LineError : public std::runtime_error {
 public:
  explicit LineError(const std::string& what) : std::runtime_error(bounded_utf8(what)) {}
};

// Appends the encoded document to ids/mask. Returns the number of tokens appended (0 for a
// document with no content: empty text, or empty messages). Throws LineError.
size_t encode_line(std::string_view line, const DocumentSettings& s, std::vector<uint32_t>& ids,
                   std::vector<uint8_t>& mask);

// The roles a chat message may have (after aliasing), for messages.
inline constexpr const char* kKnownRoles = "system, user (or prompter), assistant";

}  // namespace ciuic::data
