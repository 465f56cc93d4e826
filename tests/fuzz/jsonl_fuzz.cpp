// tests/fuzz/jsonl_fuzz.cpp — the cached_ssd data plugin's JSONL record parser: one line to one
// tokenized document, "text" and "chat" formats (plugins/data/cached_ssd/documents.cpp).
//
// Input: one selector byte (format, loss and BOS/EOS settings, tokenizer, chat template), then
// the line.
// Checks: only LineError (the plugin adds file:line to it) or ciuic::Error escapes, with a short,
// valid UTF-8 message; the document's ids lie in the vocabulary and there is one mask entry per id.
#include <memory>
#include <string>

#include <ciuic/tokenizer.h>

#include "documents.h"
#include "fuzz_common.h"
#include "tokenizer/factory.h"

namespace {

using namespace ciuic;

struct Setup {
  std::shared_ptr<const Tokenizer> tok;
  std::unique_ptr<ChatTemplate> deepseek, plain;
};

const Setup& setup(int i) {
  static Setup s[2] = {
      {load_tokenizer(fuzz::fixtures_dir() + "/tokenizer/deepseek_llm/tokenizer.json"), nullptr,
       nullptr},
      {load_tokenizer(fuzz::fixtures_dir() + "/tokenizer/llama3/tokenizer.json"), nullptr, nullptr},
  };
  static const bool init = [] {
    for (auto& x : s) {
      x.deepseek = make_chat_template("deepseek", *x.tok);
      x.plain = make_chat_template("plain", *x.tok);
    }
    return true;
  }();
  (void)init;
  return s[i];
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t sel = data[0];
  const std::string_view line(reinterpret_cast<const char*>(data) + 1, size - 1);
  const Setup& su = setup(sel >> 5 & 1);
  data::DocumentSettings s;
  s.format = (sel & 1) ? data::Format::kChat : data::Format::kText;
  s.assistant_only_loss = sel & 2;
  s.add_bos = sel & 4;
  s.add_eos = sel & 8;
  s.tokenizer = su.tok.get();
  s.chat_template = (sel & 16) ? su.deepseek.get() : su.plain.get();
  std::vector<uint32_t> ids{7};  // a previous document: must stay untouched
  std::vector<uint8_t> mask{1};
  try {
    fuzz::expect_ok_or_error([&] {
      const size_t n = data::encode_line(line, s, ids, mask);
      fuzz::check(ids.size() == 1 + n && mask.size() == ids.size(), "ids and mask sizes");
      for (uint32_t id : ids)
        fuzz::check(id < static_cast<uint32_t>(su.tok->vocab_size()), "id outside the vocabulary");
      for (uint8_t m : mask) fuzz::check(m <= 1, "mask value");
    });
  } catch (const data::LineError& e) {
    fuzz::check_message(e.what());
  }
  fuzz::check(ids.size() >= 1 && ids[0] == 7, "the previous document changed");
  return 0;
}
