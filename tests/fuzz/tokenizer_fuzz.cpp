// tests/fuzz/tokenizer_fuzz.cpp — tokenizer.json loading, encode and decode.
//
// Input: one selector byte, then
//   selector % 4 == 0: a tokenizer.json (anything after "\n%%\n" is cut off: the seeds carry a
//                      tokenizer_config.json there); the tokenizer built from it encodes a fixed
//                      text and the input itself, and decodes the ids;
//   otherwise:         text encoded by a committed fixture tokenizer (tests/fixtures/tokenizer),
//                      the non-zero selectors taken in turn: llama3, deepseek_llm, gpt2 (byte-level
//                      BPE), qwen2 (NFC, split regex, byte-level), llama2_spm and gemma_spm
//                      (SentencePiece-style BPE with byte fallback), spm_variants_a (NFKC,
//                      Lowercase, Strip, Metaspace).
// Checks: only ciuic::Error escapes (with a short, valid UTF-8 message); ids lie in
// [0, vocab_size); for llama3 (byte-level with every byte, no stripping added tokens)
// decode(encode(text)) == text for valid UTF-8 text, as for HF `tokenizers` with it.
#include <memory>
#include <string>

#include <ciuic/tokenizer.h>

#include "fuzz_common.h"
#include "tokenizer/factory.h"

namespace {

using namespace ciuic;

constexpr int kFixtures = 7;

struct Fixture {
  std::shared_ptr<const Tokenizer> tok;
  bool roundtrip;
};

const Fixture& fixture(int i) {
  static const Fixture f[kFixtures] = {
      {load_tokenizer(fuzz::fixtures_dir() + "/tokenizer/llama3/tokenizer.json"), true},
      // The fixture is cut down to ~700 tokens and lacks byte tokens (e.g. for "ø"): HF
      // `tokenizers` does not give the text back either.
      {load_tokenizer(fuzz::fixtures_dir() + "/tokenizer/deepseek_llm/tokenizer.json"), false},
      {load_tokenizer(fuzz::fixtures_dir() + "/tokenizer/gpt2/tokenizer.json"),
       false},  // lstrip/rstrip tokens
      // NFC changes text; "\u2581" decodes to a space; Lowercase and NFKC change text: no round
      // trip.
      {load_tokenizer(fuzz::fixtures_dir() + "/tokenizer/qwen2/tokenizer.json"), false},
      {load_tokenizer(fuzz::fixtures_dir() + "/tokenizer/llama2_spm/tokenizer.json"), false},
      {load_tokenizer(fuzz::fixtures_dir() + "/tokenizer/gemma_spm/tokenizer.json"), false},
      {load_tokenizer(fuzz::fixtures_dir() + "/tokenizer/spm_variants_a/tokenizer.json"), false},
  };
  return f[i];
}

void check_ids(const Tokenizer& t, const std::vector<int32_t>& ids) {
  for (int32_t id : ids)
    fuzz::check(id >= 0 && id < t.vocab_size(), "token id outside the vocabulary");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] % 4 == 0) {
    const std::string_view json_text = fuzz::split_once(in, "\n%%\n").first;
    fuzz::expect_ok_or_error([&] {
      const std::shared_ptr<const Tokenizer> t =
          tokenizer_from_json(json_text, "fuzz/tokenizer.json");
      for (std::string_view text :
           {std::string_view("Hello, world! 12345 \xc3\xa9t\xc3\xa9\n\tThe end."), in}) {
        for (bool special : {false, true}) {
          const auto ids = t->encode(text, special);
          check_ids(*t, ids);
          t->decode(ids, !special);
        }
      }
      t->fingerprint();
      t->bos_id();
      t->eos_id();
    });
    return 0;
  }
  // Selectors 1, 2, 3, 5, 6, 7, 9, ... take the fixtures in turn (1, 2, 3 as before: old seeds keep
  // theirs).
  const Fixture& f = fixture((data[0] / 4 * 3 + data[0] % 4 - 1) % kFixtures);
  fuzz::expect_ok_or_error([&] {
    const auto ids = f.tok->encode(in, /*add_special_tokens=*/false);
    check_ids(*f.tok, ids);
    const std::string back = f.tok->decode(ids, /*skip_special_tokens=*/false);
    if (f.roundtrip && fuzz::valid_utf8(in))
      fuzz::check(back == in, "decode(encode(text)) != text",
                  std::string(in) + "\n--- decoded:\n" + back);
    check_ids(*f.tok, f.tok->encode(in, /*add_special_tokens=*/true));
  });
  return 0;
}
