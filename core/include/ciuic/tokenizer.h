// ciuic/tokenizer.h — Hugging Face BPE tokenizers (byte-level and SentencePiece-style) and chat
// templates.
//
// Tokenizer reads an HF `tokenizer.json` with a BPE model and encodes exactly as the Python
// `tokenizers` package does (checked token for token by tests/tokenizer against fixtures of every
// style): byte-level BPE with a ByteLevel / Split pre-tokenizer and decoder (DeepSeek, Llama-3,
// GPT-2, Qwen2 with its NFC normalizer), and SentencePiece-style BPE (Llama-2, Mistral, Gemma:
// Metaspace or Prepend/Replace, byte_fallback, fuse_unk, ignore_merges), with the normalizers,
// Split/Digits pre-tokenizers and decoders of docs/tokenizer.md's "What is supported" table.
// Added and special tokens (lstrip/rstrip/normalized/single_word) are matched before BPE.
// Anything else (Unigram or WordPiece models, the Precompiled normalizer, other pre-tokenizers)
// is refused at construction naming its JSON path and what is supported.
//
// ChatTemplate turns a conversation into token ids plus a per-token "carries loss" mask for
// training. Templates are chosen by name in the recipe ([model] chat_template).
//
// Plugins receive both from the core (DataOpenArgs); the engine builds them (its loaders are not
// part of the SDK).
//
// Both are immutable after construction and safe to use from many threads at once.
// Failure: construction throws ciuic::Error naming the file and what is unsupported or malformed.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <ciuic/export.h>

namespace ciuic {

class CIUIC_API Tokenizer {
 public:
  virtual ~Tokenizer();

  // Encodes `text`. Special/added tokens written in the text are recognised. With
  // add_special_tokens, the post-processor's tokens (e.g. BOS) are added as HF does.
  virtual std::vector<int32_t> encode(std::string_view text,
                                      bool add_special_tokens = false) const = 0;
  virtual std::string decode(const std::vector<int32_t>& ids,
                             bool skip_special_tokens = false) const = 0;

  virtual int32_t vocab_size() const = 0;  // including added tokens
  virtual std::optional<int32_t> token_to_id(std::string_view token) const = 0;
  virtual std::optional<int32_t> bos_id() const = 0;
  virtual std::optional<int32_t> eos_id() const = 0;
  // A stable hash of everything that affects encoding (for cache manifests).
  virtual std::string fingerprint() const = 0;
};

struct ChatMessage {
  std::string role;  // "system", "user", "assistant"
  std::string content;
};

struct EncodedChat {
  std::vector<int32_t> ids;
  std::vector<uint8_t> loss_mask;  // 1 where the token is a training target
};

class CIUIC_API ChatTemplate {
 public:
  virtual ~ChatTemplate();

  virtual std::string name() const = 0;
  // The conversation rendered as text (for inspection and tests).
  virtual std::string render(const std::vector<ChatMessage>& messages) const = 0;
  // Ids of the rendered conversation; loss_mask marks assistant replies (and their end-of-turn
  // token) when assistant_only, every token otherwise.
  virtual EncodedChat encode(const std::vector<ChatMessage>& messages,
                             bool assistant_only) const = 0;
  // Ids of the prompt that asks the model for the next assistant reply (for generation).
  virtual std::vector<int32_t> encode_prompt(const std::vector<ChatMessage>& messages) const = 0;
};

}  // namespace ciuic
