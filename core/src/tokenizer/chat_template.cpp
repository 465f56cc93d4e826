// ciuic::ChatTemplate: "deepseek" and "plain". Rendering rules and the exactness argument are
// in docs/tokenizer.md ("Chat templates").
//
// A conversation is rendered as a list of text segments, each with a loss flag. encode() encodes
// the rendered text in one piece (the ids of transformers' apply_chat_template(tokenize=True))
// and, with assistant_only, marks the tokens whose bytes overlap a loss segment (HF's offsets,
// HfTokenizer::encode_with_offsets: transformers' return_assistant_tokens_mask). Adjacent
// segments with the same flag are joined first. The boundaries are "...Assistant:" |
// " reply<eos>" | "User: ...": the pre-tokenizers of DeepSeek, Llama-3, GPT-2, Qwen2 never join
// ':' with a following space, SentencePiece-style ones put the space into the reply's first
// token ("▁reply"), and an added token (EOS) is always a boundary, so the mask falls exactly on
// them. Without offsets (another Tokenizer, or a token whose extent is unknown) every segment is
// encoded on its own and the ids concatenated.
#include "tokenizer/factory.h"
#include "tokenizer/hf_tokenizer.h"
#include <ciuic/error.h>
#include <ciuic/tokenizer.h>

namespace ciuic {

std::unique_ptr<ChatTemplate> make_hf_chat_template(
    const Tokenizer& tokenizer);  // hf_chat_template.cpp

namespace {

struct Segment {
  std::string text;
  bool loss;
};

struct Style {
  std::string name;
  bool require_bos;  // deepseek: BOS is part of the format
  bool require_eos;  // deepseek: replies end with EOS
  std::string system_prefix;
  std::string user_prefix;
  std::string turn_suffix;       // after system and user content
  std::string assistant_prefix;  // "Assistant:" — the reply follows after one space
  std::string eos_fallback;      // reply terminator when the tokenizer has no EOS (plain)
};

class RoleTemplate final : public ChatTemplate {
 public:
  RoleTemplate(Style style, const Tokenizer& tok) : style_(std::move(style)), tok_(tok) {
    if (auto b = tok.bos_id()) bos_text_ = tok.decode({*b}, false);
    if (auto e = tok.eos_id()) eos_text_ = tok.decode({*e}, false);
    if (style_.require_bos && bos_text_.empty())
      throw UsageError(
          "chat template '" + style_.name +
          "' needs a BOS token, but the tokenizer has none (give a tokenizer_config.json with "
          "bos_token next to tokenizer.json, or use chat_template = \"plain\")");
    if (style_.require_eos && eos_text_.empty())
      throw UsageError(
          "chat template '" + style_.name +
          "' needs an EOS token, but the tokenizer has none (give a tokenizer_config.json with "
          "eos_token next to tokenizer.json, or use chat_template = \"plain\")");
    if (eos_text_.empty()) eos_text_ = style_.eos_fallback;
  }

  std::string name() const override { return style_.name; }

  std::string render(const std::vector<ChatMessage>& messages) const override {
    std::string out;
    for (const Segment& s : segments(messages)) out += s.text;
    return out;
  }

  EncodedChat encode(const std::vector<ChatMessage>& messages, bool assistant_only) const override {
    EncodedChat enc;
    if (!assistant_only) {
      enc.ids = tok_.encode(render(messages), false);
      enc.loss_mask.assign(enc.ids.size(), 1);
      return enc;
    }
    const std::vector<Segment> segs = segments(messages);
    if (const auto* hf = dynamic_cast<const tok::HfTokenizer*>(&tok_)) {
      std::string text;
      std::vector<std::pair<size_t, size_t>> spans, offsets;
      for (const Segment& s : segs) {
        if (s.loss) spans.emplace_back(text.size(), text.size() + s.text.size());
        text += s.text;
      }
      if (hf->encode_with_offsets(text, enc.ids, offsets)) {
        enc.loss_mask = tok::loss_mask_from_offsets(offsets, spans);
        return enc;
      }
      enc.ids.clear();
    }
    for (const Segment& s : segs) {
      std::vector<int32_t> ids = tok_.encode(s.text, false);
      enc.ids.insert(enc.ids.end(), ids.begin(), ids.end());
      enc.loss_mask.insert(enc.loss_mask.end(), ids.size(), s.loss ? 1 : 0);
    }
    return enc;
  }

  std::vector<int32_t> encode_prompt(const std::vector<ChatMessage>& messages) const override {
    std::string text = render(messages) + style_.assistant_prefix;
    return tok_.encode(text, false);
  }

 private:
  // The rendered conversation as segments, adjacent segments with equal loss flags joined.
  std::vector<Segment> segments(const std::vector<ChatMessage>& messages) const {
    std::vector<Segment> segs;
    auto add = [&](std::string text, bool loss) {
      if (text.empty()) return;
      if (!segs.empty() && segs.back().loss == loss)
        segs.back().text += text;
      else
        segs.push_back(Segment{std::move(text), loss});
    };
    add(bos_text_, false);
    for (size_t i = 0; i < messages.size(); ++i) {
      const ChatMessage& m = messages[i];
      if (m.role == "system") {
        add(style_.system_prefix + m.content + style_.turn_suffix, false);
      } else if (m.role == "user") {
        add(style_.user_prefix + m.content + style_.turn_suffix, false);
      } else if (m.role == "assistant") {
        add(style_.assistant_prefix, false);
        add(" " + m.content + eos_text_, true);
      } else {
        throw Error("chat template '" + style_.name + "': message " + std::to_string(i) +
                    " has role '" + m.role + "' (expected system, user or assistant)");
      }
    }
    return segs;
  }

  Style style_;
  const Tokenizer& tok_;
  std::string bos_text_, eos_text_;
};

Style deepseek_style() {
  // DeepSeek-LLM chat's tokenizer_config.json chat_template:
  //   {{ bos_token }} then per message: system -> content + '\n\n';
  //   user -> 'User: ' + content + '\n\n'; assistant -> 'Assistant: ' + content + eos_token;
  //   generation prompt 'Assistant:'.
  return Style{"deepseek", true, true, "", "User: ", "\n\n", "Assistant:", ""};
}

Style plain_style() {
  // Like deepseek, but BOS only when the tokenizer has one, system turns labelled "System: ",
  // and replies ended by EOS when the tokenizer has one, else by "\n\n".
  return Style{"plain", false, false, "System: ", "User: ", "\n\n", "Assistant:", "\n\n"};
}

}  // namespace

std::vector<std::string> chat_template_names() { return {"auto", "hf", "deepseek", "plain"}; }

std::unique_ptr<ChatTemplate> make_chat_template(std::string_view name,
                                                 const Tokenizer& tokenizer) {
  if (name == "hf" || name == "auto") {
    if (auto t = make_hf_chat_template(tokenizer)) return t;
    if (name == "auto") return std::make_unique<RoleTemplate>(plain_style(), tokenizer);
    throw UsageError(
        "chat template 'hf' needs the model's template: a tokenizer_config.json with a "
        "chat_template "
        "(or a chat_template.jinja) next to tokenizer.json, and there is none (use chat_template = "
        "\"auto\" to fall back to \"plain\", or name a built-in template)");
  }
  if (name == "deepseek") return std::make_unique<RoleTemplate>(deepseek_style(), tokenizer);
  if (name == "plain") return std::make_unique<RoleTemplate>(plain_style(), tokenizer);
  std::string known;
  for (const std::string& n : chat_template_names()) known += (known.empty() ? "" : ", ") + n;
  throw UsageError("unknown chat template '" + std::string(name) + "' (known: " + known + ")");
}

}  // namespace ciuic
