// Internal: how the engine builds tokenizers and chat templates (the interfaces are the SDK's
// ciuic/tokenizer.h; plugins receive ready objects and never call these).
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <ciuic/tokenizer.h>

namespace ciuic {

// An HF tokenizer.json (see ciuic/tokenizer.h for what is supported). Throws Error naming the file.
CIUIC_API std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& tokenizer_json_path);
CIUIC_API std::shared_ptr<const Tokenizer> tokenizer_from_json(
    std::string_view tokenizer_json, std::string_view origin = "<string>");

// Known names: "hf" (the model's own Jinja template from the tokenizer's sibling
// tokenizer_config.json or chat_template.jinja, rendered as transformers does), "auto" ("hf"
// when the model has a template, else "plain"), "deepseek" (DeepSeek-LLM chat format), "plain"
// ("User: ...\n\nAssistant: ..."). name() of an "hf" template is "hf:<hash of the template>".
CIUIC_API std::unique_ptr<ChatTemplate> make_chat_template(std::string_view name,
                                                           const Tokenizer& tokenizer);
CIUIC_API std::vector<std::string> chat_template_names();

}  // namespace ciuic
