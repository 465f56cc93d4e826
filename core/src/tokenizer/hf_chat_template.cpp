// ChatTemplate "hf": the model's own Jinja chat template (tokenizer_config.json's chat_template,
// or a chat_template.jinja next to it, as transformers loads them), rendered by jinja.h.
//
// Text and ids are those of transformers' apply_chat_template: the conversation is rendered with
// the special tokens of tokenizer_config.json and tokenized in one piece. The loss mask needs to
// know which characters are the assistant's; in order of preference:
//   1. {% generation %} blocks, when the template has them (as return_assistant_tokens_mask);
//   2. rendered prefixes: for assistant message i, the text between the rendering of messages[:i]
//      with add_generation_prompt=true and that of messages[:i+1] (trailing whitespace dropped),
//      when both are prefixes of the whole rendering;
//   3. otherwise (templates that re-render earlier turns, e.g. Mistral's system prompt placed in
//      the last user turn), the reply's content found in order in the rendering (as written or
//      trimmed), with the spaces just before it and the special token just after it (its end of
//      turn): what the model generates after the prompt.
// A token carries loss when its bytes overlap an assistant range (HF marks char_to_token(start)
// .. char_to_token(end - 1)). docs/tokenizer.md explains the method and its checks.
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/files.h>
#include <ciuic/tokenizer.h>

#include "jinja/jinja.h"
#include "tokenizer/hf_tokenizer.h"

namespace ciuic {

namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

std::string read_text(const fs::path& p) {
  return read_input(p.string(), "chat template", kMaxJsonInputBytes);
}

std::string token_string(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return "";
}

class HfChatTemplate final : public ChatTemplate {
 public:
  HfChatTemplate(std::string source, std::string origin, const Tokenizer& tok, ojson specials)
      : tmpl_(source, origin),
        tok_(tok),
        hf_(dynamic_cast<const tok::HfTokenizer*>(&tok)),
        specials_(std::move(specials)),
        origin_(std::move(origin)) {
    name_ = "hf:" + tok::fnv1a64_hex(source);
  }

  std::string name() const override { return name_; }

  std::string render(const std::vector<ChatMessage>& messages) const override {
    return render_n(messages, messages.size(), false).text;
  }

  EncodedChat encode(const std::vector<ChatMessage>& messages, bool assistant_only) const override {
    jinja::Rendered full = render_n(messages, messages.size(), false);
    EncodedChat enc;
    if (!assistant_only) {
      enc.ids = tok_.encode(full.text, false);
      enc.loss_mask.assign(enc.ids.size(), 1);
      return enc;
    }
    std::vector<std::pair<size_t, size_t>> spans = assistant_spans(messages, full);
    // The ids of the whole rendering and each token's bytes in it (HF's offsets): a token carries
    // loss when its bytes overlap an assistant range. When the offsets cannot be had (not an HF
    // tokenizer, or a token whose extent is unknown), encode range by range so that the mask
    // falls on the boundaries.
    std::vector<std::pair<size_t, size_t>> offsets;
    if (!hf_ || !hf_->encode_with_offsets(full.text, enc.ids, offsets))
      return encode_ranges(full.text, spans);
    enc.loss_mask = tok::loss_mask_from_offsets(offsets, spans);
    return enc;
  }

  std::vector<int32_t> encode_prompt(const std::vector<ChatMessage>& messages) const override {
    return tok_.encode(render_n(messages, messages.size(), true).text, false);
  }

 private:
  jinja::Rendered render_n(const std::vector<ChatMessage>& messages, size_t n,
                           bool add_generation_prompt) const {
    ojson vars = specials_;
    ojson msgs = ojson::array();
    for (size_t i = 0; i < n; ++i)
      msgs.push_back({{"role", messages[i].role}, {"content", messages[i].content}});
    vars["messages"] = std::move(msgs);
    vars["tools"] = nullptr;
    vars["documents"] = nullptr;
    vars["add_generation_prompt"] = add_generation_prompt;
    try {
      return tmpl_.render(vars);
    } catch (const jinja::TemplateError& e) {
      if (e.raised())
        throw UsageError("chat template " + origin_ + " refused the conversation: " + e.message());
      throw;
    }
  }

  // Byte ranges of the assistant's text in `full` (sorted, disjoint).
  std::vector<std::pair<size_t, size_t>> assistant_spans(const std::vector<ChatMessage>& messages,
                                                         const jinja::Rendered& full) const {
    if (tmpl_.has_generation_blocks()) return full.generation;
    std::vector<std::pair<size_t, size_t>> spans;
    if (prefix_spans(messages, full.text, spans)) return spans;
    spans.clear();
    content_spans(messages, full.text, spans);
    return spans;
  }

  bool prefix_spans(const std::vector<ChatMessage>& messages, const std::string& text,
                    std::vector<std::pair<size_t, size_t>>& spans) const {
    auto is_prefix = [](const std::string& p, const std::string& s) {
      return s.compare(0, p.size(), p) == 0;
    };
    for (size_t i = 0; i < messages.size(); ++i) {
      if (messages[i].role != "assistant") continue;
      std::string before, after;
      try {
        before = render_n(messages, i, true).text;
        after = i + 1 == messages.size() ? text : render_n(messages, i + 1, false).text;
      } catch (const Error&) {
        return false;  // a prefix the template refuses (e.g. it must start with a user turn)
      }
      if (!is_prefix(before, after) || !is_prefix(after, text)) return false;
      size_t e = after.size();
      while (e > before.size() && std::isspace(static_cast<unsigned char>(after[e - 1]))) --e;
      if (e > before.size()) spans.emplace_back(before.size(), e);
    }
    return true;
  }

  void content_spans(const std::vector<ChatMessage>& messages, const std::string& text,
                     std::vector<std::pair<size_t, size_t>>& spans) const {
    auto trim = [](const std::string& c) {
      size_t l = 0, r = c.size();
      while (l < r && std::isspace(static_cast<unsigned char>(c[l]))) ++l;
      while (r > l && std::isspace(static_cast<unsigned char>(c[r - 1]))) --r;
      return c.substr(l, r - l);
    };
    // Messages in order: each is looked for after the previous one (as written, else trimmed), so
    // that a reply equal to an earlier question is not taken for it. System prompts are skipped:
    // templates move them (Mistral v0.3 writes it into the last user turn).
    size_t cursor = 0;
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (m.role == "system") continue;
      const std::string trimmed = trim(m.content);
      if (trimmed.empty()) continue;
      size_t b = text.find(m.content, cursor), len = m.content.size();
      if (b == std::string::npos) {
        b = text.find(trimmed, cursor);
        len = trimmed.size();
      }
      if (m.role != "assistant") {
        if (b != std::string::npos) cursor = b + len;
        continue;
      }
      if (b == std::string::npos)
        throw UsageError(
            "chat template " + origin_ + ": cannot find assistant message " + std::to_string(i) +
            " in the rendered conversation (the template rewrites replies), so the loss mask "
            "is unknown; add {% generation %} ... {% endgeneration %} around the reply in the "
            "template, or set [data] assistant_only_loss = false");
      const size_t e = b + len + special_token_at(text, b + len);
      while (b > cursor && text[b - 1] == ' ')
        --b;  // a space before the reply is generated with it
      spans.emplace_back(b, e);
      cursor = e;
    }
  }

  // Length of a vocabulary token written like "<...>" or "[...]" at text[pos] (an end-of-turn
  // marker such as </s>, <|eot_id|>, <|im_end|>), else 0.
  size_t special_token_at(const std::string& text, size_t pos) const {
    if (pos >= text.size() || (text[pos] != '<' && text[pos] != '[')) return 0;
    const char close = text[pos] == '<' ? '>' : ']';
    for (size_t n = 2; n <= 48 && pos + n <= text.size(); ++n) {
      if (text[pos + n - 1] != close) continue;
      if (tok_.token_to_id(text.substr(pos, n))) return n;
    }
    return 0;
  }

  EncodedChat encode_ranges(const std::string& text,
                            const std::vector<std::pair<size_t, size_t>>& spans) const {
    EncodedChat enc;
    size_t at = 0;
    auto add = [&](size_t b, size_t e, bool loss) {
      if (e <= b) return;
      std::vector<int32_t> ids = tok_.encode(std::string_view(text).substr(b, e - b), false);
      enc.ids.insert(enc.ids.end(), ids.begin(), ids.end());
      enc.loss_mask.insert(enc.loss_mask.end(), ids.size(), loss ? 1 : 0);
    };
    for (const auto& [b, e] : spans) {
      add(at, b, false);
      add(b, e, true);
      at = e;
    }
    add(at, text.size(), false);
    return enc;
  }

  jinja::Template tmpl_;
  const Tokenizer& tok_;
  const tok::HfTokenizer* hf_;
  ojson specials_;
  std::string origin_, name_;
};

}  // namespace

// The model's template: chat_template.jinja next to tokenizer_config.json, else its chat_template
// (a string, or a list of {name, template} from which "default" is taken). Returns null when the
// tokenizer has no template; throws on a malformed one.
std::unique_ptr<ChatTemplate> make_hf_chat_template(const Tokenizer& tokenizer) {
  const auto* hf = dynamic_cast<const tok::HfTokenizer*>(&tokenizer);
  if (!hf || hf->config_path().empty()) return nullptr;
  const fs::path cfg_path = hf->config_path();
  nlohmann::json cfg = nlohmann::json::parse(hf->config_text(), nullptr, false);
  if (!cfg.is_object()) throw UsageError(cfg_path.string() + ": expected a JSON object");
  std::string source, origin;
  const fs::path jinja_file = cfg_path.parent_path() / "chat_template.jinja";
  std::error_code ec;
  if (fs::is_regular_file(jinja_file, ec)) {
    source = read_text(jinja_file);
    origin = jinja_file.string();
  } else if (auto it = cfg.find("chat_template"); it != cfg.end() && !it->is_null()) {
    origin = cfg_path.string() + " (chat_template)";
    if (it->is_string()) {
      source = it->get<std::string>();
    } else if (it->is_array()) {
      for (const auto& e : *it)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string())
          source = e["template"].get<std::string>();
      if (source.empty())
        throw UsageError(cfg_path.string() +
                         ": chat_template is a list without a \"default\" entry");
    } else {
      throw UsageError(cfg_path.string() +
                       ": chat_template: expected a string or a list of {name, template}, found " +
                       std::string(it->type_name()));
    }
  } else {
    return nullptr;
  }
  ojson specials = ojson::object();
  for (const char* k : {"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
                        "cls_token", "mask_token"}) {
    auto it = cfg.find(k);
    if (it == cfg.end()) continue;
    std::string v = token_string(*it);
    if (!v.empty()) specials[k] = v;
  }
  if (auto it = cfg.find("additional_special_tokens"); it != cfg.end() && it->is_array()) {
    ojson extra = ojson::array();
    for (const auto& e : *it) extra.push_back(token_string(e));
    specials["additional_special_tokens"] = extra;
  }
  return std::make_unique<HfChatTemplate>(std::move(source), std::move(origin), tokenizer,
                                          std::move(specials));
}

}  // namespace ciuic
