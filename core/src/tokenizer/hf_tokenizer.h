// tokenizer/hf_tokenizer.h — the implementation behind ciuic::Tokenizer (internal header).
//
// Encoding follows HF `tokenizers` (Tokenizer::encode_single_sequence) step by step:
//   1. added tokens whose "normalized" is false are cut out of the raw text (leftmost-longest,
//      with their lstrip / rstrip / single_word rules);
//   2. each remaining stretch is normalized (normalizer.h) and the "normalized" added tokens
//      (their content normalized the same way, as HF does) are cut out of it the same way;
//   3. the pre-tokenizer chain (Split / Digits, then optionally ByteLevel or Metaspace, which
//      must come last) cuts each remaining stretch into pieces;
//   4. every piece is BPE-encoded (bpe.h; byte-level when the chain ends with ByteLevel);
//   5. with add_special_tokens, the post-processor's template adds its tokens (BOS ...).
// Decoding: ids -> token strings -> the decoder chain (decoder.h).
// Everything is immutable after construction; encode/decode are safe from many threads.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <ciuic/tokenizer.h>

#include "tokenizer/bpe.h"
#include "tokenizer/decoder.h"
#include "tokenizer/normalizer.h"
#include "tokenizer/regex.h"

#include <ciuic/export.h>

namespace ciuic::tok {

struct AddedToken {
  int32_t id = -1;
  std::string content;
  std::string
      decoded;  // its token string in decode(): the normalized content when "normalized", as HF
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// Leftmost-longest exact matching of a set of strings (HF uses an Aho-Corasick automaton with
// MatchKind::LeftmostLongest; at each start position, left to right, the longest pattern wins).
// A byte trie for the first kTrieDepth bytes of each pattern; the bytes after that are kept whole
// at the node of depth kTrieDepth (longest first) and compared with memcmp, so memory grows with
// the patterns' total length (a 20 MB added token costs about 20 MB, not a node per byte).
class LiteralMatcher {
 public:
  void add(std::string_view pattern, int32_t value);
  bool empty() const { return nodes_.size() <= 1; }
  // The first match starting at or after `pos`: its start, length and value.
  bool find(std::string_view text, size_t pos, size_t* start, size_t* len, int32_t* value) const;

  static constexpr size_t kTrieDepth = 64;

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> kids;  // sorted by byte
    int32_t value = -1;
    // At depth kTrieDepth only: the rest of each longer pattern and its value, longest first.
    std::vector<std::pair<std::string, int32_t>> tails;
  };
  int32_t child(int32_t node, uint8_t b) const;
  std::vector<Node> nodes_{Node{}};
  std::array<int32_t, 256> root_{};  // filled lazily: 0 = none (root index is never a child)
};

class CIUIC_API HfTokenizer final : public Tokenizer {
 public:
  // `config_json`: the parsed sibling tokenizer_config.json (bos/eos names), may be null.
  HfTokenizer(std::string_view json_text, const std::string& origin, std::string_view config_json,
              const std::string& config_origin);
  ~HfTokenizer() override;

  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const override;
  int32_t vocab_size() const override { return vocab_size_; }
  std::optional<int32_t> token_to_id(std::string_view token) const override;
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::optional<int32_t> eos_id() const override { return eos_; }
  std::string fingerprint() const override { return fingerprint_; }

  // encode(text, false), also giving for every id the [start, end) bytes of `text` it stands for
  // (HF's Encoding.offsets, in bytes: a "▁" prepended or put for a space stands for the character
  // it was made from). False when a token's extent cannot be told (byte-fallback tokens merged
  // by the model, characters the model drops, HF's out-of-order unk): `ids` are still right, the
  // offsets of that piece are the whole stretch. Same threading and errors as encode().
  bool encode_with_offsets(std::string_view text, std::vector<int32_t>& ids,
                           std::vector<std::pair<size_t, size_t>>& offsets) const;

  // The pre-tokenized pieces of `text` (raw UTF-8, prefix space included, before the byte-level
  // mapping), added tokens shown as their content. For tests and debugging.
  std::vector<std::string> pre_tokenize(std::string_view text) const;
  const BpeModel& model() const { return *model_; }
  // The sibling tokenizer_config.json as given (text and path; empty when there was none): the
  // HF chat template reads its chat_template and special tokens from it.
  const std::string& config_text() const { return config_text_; }
  const std::string& config_path() const { return config_path_; }
  // The bytes token `id` stands for in decoded text (added tokens: their content); "" if unknown.
  std::string token_bytes(int32_t id) const;

 private:
  enum class Behavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
  struct Step {
    std::unique_ptr<Regex> re;
    Behavior behavior = Behavior::kIsolated;
    bool invert = false;
  };
  struct Span {
    size_t b, e;
  };
  struct Segment {
    size_t b, e;
    int32_t added;  // index into added_, or -1 for text
  };
  struct Match {
    size_t b, e;
    bool match;
  };
  // Per-thread working memory, fetched once per encode() (thread_local lookups are not free in
  // a shared library).
  struct Scratch {
    MatchScratch* regex;
    PieceCache* cache;
    std::vector<Segment> segs, first;
    std::vector<Span> pieces, next, acc;
    std::vector<Match> matches;
    std::string buf, norm_a, norm_b;
    std::vector<std::pair<uint32_t, uint32_t>> map;  // for_each_final_piece<true>
  };
  // Metaspace pre-tokenizer: ' ' -> replacement, the replacement prepended (always, only to the
  // piece at the start of the text, or never) unless the piece starts with it, then optionally
  // split before every replacement (HF's MergedWithNext).
  struct Metaspace {
    enum class Prepend { kAlways, kFirst, kNever };
    std::string replacement;
    Prepend prepend = Prepend::kAlways;
    bool split = true;
  };
  Scratch& scratch() const;

  void parse_pre_tokenizer(const nlohmann::json& j, const std::string& path);
  void parse_post_processor(const nlohmann::json& j, const std::string& path);
  void split_added(std::string_view text, size_t b, size_t e, const LiteralMatcher& m,
                   std::vector<Segment>& out) const;
  // Steps 1-3 on `text`: on_added(index into added_) for every added token, on_piece(piece) for
  // every piece that reaches the model, in order.
  template <class A, class P>
  void run_pipeline(std::string_view text, Scratch& sc, A&& on_added, P&& on_piece) const;
  void pre_tokenize_text(std::string_view text, Segment seg, Scratch& sc) const;  // -> sc.pieces
  void apply_step(const Step& step, std::string_view text, Span piece,
                  Scratch& sc) const;  // appends sc.next
  // `at_origin`: `text` starts at offset 0 of the original text (Metaspace's "first" scheme).
  template <bool kMap, class F>
  void for_each_final_piece(std::string_view text, bool at_origin, Scratch& sc, F&& fn) const;
  bool is_word_char_before(std::string_view s) const;
  bool is_word_char_after(std::string_view s) const;

  std::string origin_;
  std::string config_text_, config_path_;
  std::unique_ptr<BpeModel> model_;
  std::vector<AddedToken> added_;
  std::vector<int32_t> added_by_id_;  // id -> index into added_, -1
  LiteralMatcher raw_matcher_, normalized_matcher_;
  std::vector<Step> steps_;
  std::unique_ptr<Normalizer> normalizer_;  // null when the identity
  std::unique_ptr<Decoder> decoder_;
  std::optional<Metaspace> metaspace_;
  bool byte_level_ = false;  // the pre-tokenizer chain ends with ByteLevel
  std::vector<uint8_t>
      special_by_id_;  // id -> its token string is a special added token's (HF skips those)
  bool add_prefix_space_ = false;
  std::unique_ptr<Regex> byte_level_regex_;  // GPT-2's, when ByteLevel.use_regex
  std::unique_ptr<Regex> word_char_;         // Rust regex \w, for single_word
  std::vector<int32_t> prefix_, suffix_;     // post-processor template around $A
  std::optional<int32_t> bos_, eos_;
  int32_t vocab_size_ = 0;
  std::string fingerprint_;
};

// 1 for every token whose [start, end) bytes overlap one of `spans` (sorted, disjoint), else 0:
// transformers' assistant mask (char_to_token(start) .. char_to_token(end - 1)).
CIUIC_API std::vector<uint8_t> loss_mask_from_offsets(
    const std::vector<std::pair<size_t, size_t>>& offsets,
    const std::vector<std::pair<size_t, size_t>>& spans);

// FNV-1a 64-bit, as 16 lowercase hex digits.
CIUIC_API std::string fnv1a64_hex(std::string_view data);

}  // namespace ciuic::tok
