// tokenizer/bpe.h — the BPE model of an HF tokenizer.json ("model": {"type": "BPE"}).
//
// Two modes, chosen by the pipeline:
//  - byte-level (the pre-tokenizer ends with ByteLevel): vocabulary tokens are written in GPT-2's
//    byte-to-unicode alphabet ("Ġthe" for " the"). The model works on raw bytes instead: every
//    token whose characters all belong to that alphabet is mapped back to its bytes once at load,
//    so a pre-tokenized piece of text is BPE-encoded without converting it; one symbol per byte.
//  - characters (no ByteLevel: SentencePiece-style vocabularies such as Llama-2's, Mistral's,
//    Gemma's with "▁" for a space): pieces are looked up as they are, one symbol per character.
// A character (byte-level: a byte) missing from the vocabulary becomes its UTF-8 bytes as
// "<0xXX>" tokens with byte_fallback (when all of them exist), else unk_token (consecutive ones
// fused into one with fuse_unk), else it is dropped: HF's BPE::merge_word, including its order
// (a pending unk is emitted after byte-fallback tokens that follow it). Merges are applied exactly
// as HF's `Word::merge_all` does: repeatedly the adjacent pair of lowest merge rank, the leftmost
// one on ties. With ignore_merges a piece that is itself a vocabulary token is emitted whole.
//
// Threading: immutable after construction; encode() may be called from any number of threads at
// once. The merge cache (piece -> ids) is per thread and per model, as in HF (no locks): each
// thread keeps the caches of the last 8 models it used, up to kCacheEntries pieces each
// (emptied when full), about 2 MB apiece.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <ciuic/export.h>

namespace ciuic::tok {

// GPT-2's reversible byte <-> unicode map (bytes_to_unicode in openai/gpt-2 encoder.py).
struct CIUIC_API ByteAlphabet {
  std::array<uint32_t, 256> byte_to_cp{};  // byte -> code point
  std::unordered_map<uint32_t, uint8_t> cp_to_byte;
  ByteAlphabet();
  static const ByteAlphabet& get();
  // The bytes `token` stands for, or nullopt when a character is outside the alphabet.
  std::optional<std::string> to_bytes(std::string_view token) const;
  std::string to_token(std::string_view bytes) const;  // the inverse
};

// Open-addressing hash map uint64 -> uint64 (keys != ~0), built once, read concurrently.
class FlatMap64 {
 public:
  void reserve(size_t n);
  // Inserts or overwrites.
  void put(uint64_t key, uint64_t value);
  const uint64_t* find(uint64_t key) const {
    if (mask_ == 0) return nullptr;
    size_t i = mix(key) & mask_;
    while (true) {
      const Slot& s = slots_[i];
      if (s.key == key) return &s.value;
      if (s.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }
  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~0ULL;
  struct Slot {
    uint64_t key = kEmpty;
    uint64_t value = 0;
  };
  static size_t mix(uint64_t k) {
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    return static_cast<size_t>(k);
  }
  void grow();
  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

// Open-addressing map piece bytes -> ids for one thread; emptied when full. Not thread-safe.
class PieceCache {
 public:
  explicit PieceCache(size_t max_entries);
  static uint64_t hash(std::string_view piece);
  // Appends the cached ids of `piece` to `out`; false when absent.
  bool find(std::string_view piece, uint64_t h, std::vector<int32_t>& out) const;
  void insert(std::string_view piece, uint64_t h, const int32_t* ids, size_t n);
  size_t size() const { return used_; }

 private:
  struct Slot {
    uint64_t hash = 0;  // 0 = empty (hash() never returns 0)
    uint32_t key_off = 0, key_len = 0, ids_off = 0, ids_len = 0;
  };
  void clear();
  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<int32_t> ids_;
  size_t used_ = 0, max_entries_;
};

class CIUIC_API BpeModel {
 public:
  // Parses the "model" object. `origin` names the file; errors are ciuic::Error
  // "<origin>: /model/<path>: <what>". `byte_level`: the pipeline's pre-tokenizer ends with
  // ByteLevel (pieces are raw bytes standing for byte-alphabet characters).
  BpeModel(const nlohmann::json& model, const std::string& origin, bool byte_level = true);

  // Appends the ids of one pre-tokenized piece (raw bytes, not the byte-level alphabet), through
  // `cache` (from thread_cache(), fetched once per text by the caller) or this thread's cache.
  void encode(std::string_view piece, std::vector<int32_t>& out, PieceCache& cache) const;
  void encode(std::string_view piece, std::vector<int32_t>& out) const {
    encode(piece, out, thread_cache());
  }
  // This thread's cache for this model.
  PieceCache& thread_cache() const;
  // Same, without the cache (tests compare both paths).
  void encode_uncached(std::string_view piece, std::vector<int32_t>& out) const;

  // The byte length in `piece` of each of `ids` (encode()'s output for `piece`), appended to
  // `lens`; false when they cannot be told apart (merged byte-fallback tokens, unknown ids).
  bool token_lengths(std::string_view piece, const int32_t* ids, size_t n,
                     std::vector<size_t>& lens) const;

  std::optional<int32_t> token_to_id(std::string_view token) const;  // byte-level form
  // Token string (byte-level form) of `id`, or nullptr.
  const std::string* id_to_token(int32_t id) const;
  // Bytes the decoder outputs for model token `id` (HF ByteLevel decoder: mapped bytes, or the
  // token's own UTF-8 when it has characters outside the alphabet); nullptr if not a model id.
  const std::string* id_to_bytes(int32_t id) const;
  int32_t max_id() const { return max_id_; }
  size_t vocab_size() const { return vocab_.size(); }
  bool byte_level() const { return byte_level_; }

 private:
  // The initial symbols of `piece` (HF merge_word before merge_all), appended to `syms`.
  void initial_symbols(std::string_view piece, std::vector<int32_t>& syms) const;
  int32_t char_id(std::string_view piece, size_t i, size_t len) const;
  // Characters mode, a piece longer than the cache takes: cut where no merge can join (see .cpp).
  void encode_split(std::string_view piece, std::vector<int32_t>& out, PieceCache& cache) const;
  void merge_short(std::vector<int32_t>& syms) const;
  void merge_long(std::vector<int32_t>& syms) const;
  const uint64_t* find_merge(int32_t a, int32_t b) const {
    return merges_.find((static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) |
                        static_cast<uint32_t>(b));
  }

  std::unordered_map<std::string, int32_t> vocab_;     // byte-level token -> id
  std::unordered_map<std::string, int32_t> by_bytes_;  // raw bytes -> id (mappable tokens)
  std::vector<const std::string*> id_token_;           // id -> key in vocab_
  std::vector<std::string> id_bytes_;                  // id -> decoder bytes
  std::vector<uint8_t> id_valid_;
  std::array<int32_t, 256> byte_id_{};   // byte-level: single byte -> id, -1 if absent
  std::array<int32_t, 128> ascii_id_{};  // characters: ASCII character -> id, -1
  FlatMap64 char_id_;                    // characters: code point -> id (non-ASCII)
  FlatMap64 crossable_;  // characters: (last cp of L) << 32 | first cp of R, per merge
  std::array<uint8_t, 128 * 128> ascii_crossable_{};  // the same for two ASCII characters
  std::array<int32_t, 256> fallback_id_{};            // "<0xXX>" -> id, -1 if absent
  bool byte_level_ = true;
  bool byte_fallback_ = false;
  FlatMap64 merges_;  // (a,b) -> rank << 32 | new id
  int32_t max_id_ = -1;
  std::optional<int32_t> unk_id_;
  bool fuse_unk_ = false;
  bool ignore_merges_ = false;

  static constexpr size_t kShortWord = 48;  // longer words take the heap-based merge
  static constexpr size_t kCacheEntries = 32768;
  static constexpr size_t kMaxCachedLen = 256;
  uint64_t instance_id_;
};

}  // namespace ciuic::tok
