// model/generate.h — text generation with a KV cache: batched prompts (left padding with an
// attention mask), greedy or sampled, stopping at EOS ids and max_new_tokens, as transformers'
// GenerationMixin.generate() does for a decoder-only model.
//
// The flow of generate(): the prompts are left-padded to the longest (pad id), position ids are
// cumsum(mask) - 1 (1 on padding), one prefill runs all prompt tokens through the model into a
// preallocated cache (LlamaModel::DecodeCache), then one token per step (LlamaModel::decode, or
// the static-shape decode_step, replayed as a CUDA graph on CUDA: GenerateOptions::decode_step,
// cuda_graph). Each step takes the
// last position's fp32 logits, runs them through process_logits (transformers' processor order),
// and picks argmax (greedy) or draws from softmax (sampling; a CPU generator seeded with `seed`,
// torch.multinomial's draw). A finished row (it produced an EOS id) keeps receiving the pad id,
// as in transformers, and stops counting; generation ends when every row is finished or has
// max_new_tokens new tokens, or the context (max_position_embeddings) is full.
//
// Stop strings: transformers' StopStringCriteria (see StopStrings below); the token that completes
// one is kept, the row then finishes as at an EOS.
//
// Departures from transformers (docs/generate.md): no beam search, no
// min_length/no_repeat_ngram/bad_words; top_k defaults to 50 and applies only when sampling, as
// transformers' GenerationConfig; a prompt longer than the context is an error, not a warning.
//
// Failure: ciuic::Error naming the setting (out-of-range sampling values, empty prompt, token
// outside the vocabulary, prompt longer than the context).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>

#include <ciuic/export.h>

namespace ciuic {
class Tokenizer;
}

namespace ciuic::model {

class LlamaModel;

// transformers' GenerationConfig sampling fields, same meanings and defaults.
struct SamplingParams {
  bool do_sample = false;
  double temperature = 1.0;         // > 0; 1: off
  int64_t top_k = 50;               // >= 0; 0: off
  double top_p = 1.0;               // (0, 1]; 1: off
  double min_p = 0.0;               // [0, 1]; 0: off
  double repetition_penalty = 1.0;  // > 0; 1: off
  uint64_t seed = 0;
  // Throws Error "<where>: <key> must be ..., got ..." for a value out of range.
  void validate(const std::string& where) const;
};

// transformers' logits processors in _get_logits_processor's order on scores [B, V] fp32:
// RepetitionPenaltyLogitsProcessor (repetition_penalty != 1, over `seen` [B, T] int64: prompt
// with its padding, then the generated tokens), and when do_sample the warpers
// TemperatureLogitsWarper (temperature != 1), TopKLogitsWarper (top_k != 0), TopPLogitsWarper
// (top_p < 1), MinPLogitsWarper (min_p > 0), each keeping at least one token; removed tokens get
// -inf. `steps` (optional) receives ("repetition_penalty" | "temperature" | "top_k" | "top_p" |
// "min_p", scores after it) for every processor that ran.
CIUIC_API at::Tensor process_logits(
    const at::Tensor& scores, const at::Tensor& seen, const SamplingParams& p,
    std::vector<std::pair<std::string, at::Tensor>>* steps = nullptr);

// transformers' StopStringCriteria: a row stops when its text ends with a stop string that
// overlaps its last token. Matching works on the last W tokens of the whole row (left padding,
// prompt and new tokens, so a stop string may start in the prompt; W = the longest stop string in
// bytes), walking back from the last token as transformers does: the last token must hold the
// stop string's last byte with the stop string's tail starting at the token's start (or the whole
// string inside it), every earlier token must end with the bytes still to match (running off the
// string's start is a match). A token's text is what transformers' clean_tokenizer_vocab gives
// (token_texts): its bytes, special tokens as their content.
class CIUIC_API StopStrings {
 public:
  // Per token id: its text, or nullopt for an id the tokenizer does not have (never matches).
  using TokenTexts = std::vector<std::optional<std::string>>;
  // Throws Error for no stop strings, an empty one, no token texts (no tokenizer), or a stop
  // string no token can end (transformers: "unable to identify tokens matching").
  StopStrings(std::vector<std::string> stops, std::shared_ptr<const TokenTexts> texts);
  // True when the row `ids` (all of it so far: padding, prompt, new tokens) ends a stop string.
  bool matches(const std::vector<int32_t>& ids) const;
  size_t window() const { return window_; }
  const std::vector<std::string>& strings() const { return stops_; }

 private:
  bool matches_one(const std::string& s, const std::vector<int32_t>& ids) const;
  std::vector<std::string> stops_;
  std::shared_ptr<const TokenTexts> texts_;
  size_t window_ = 0;
};

// Token texts as transformers' StopStringCriteria.clean_tokenizer_vocab makes them for `tok`:
// byte-level vocabularies: each token's bytes (added tokens: their content); others: "<0xNN>"
// byte-fallback tokens as their byte, else the text a token adds after "abcdef".
CIUIC_API std::shared_ptr<const StopStrings::TokenTexts> stop_token_texts(const Tokenizer& tok);

struct GenerateOptions {
  int64_t max_new_tokens = 128;
  std::vector<int32_t> eos_ids;  // a row stops after producing any of them
  std::optional<int32_t>
      pad_id;  // left padding / finished rows; default: config's pad, else eos_ids[0], else 0
  SamplingParams sampling;
  // Called once per new token of an unfinished row, as soon as it is chosen (streaming).
  std::function<void(size_t row, int32_t token)> on_token;
  // The raw fp32 logits [B, V] of each step, before processing (tests). With the static step the
  // tensor is a buffer the next step overwrites: clone what you keep.
  std::function<void(const at::Tensor& logits)> on_logits;
  // Checked before each step; true ends generation early (Ctrl-C in --chat).
  std::function<bool()> cancelled;
  // Stop strings: none (empty), one for every row (size 1), or one per prompt (null: none).
  std::vector<std::shared_ptr<const StopStrings>> stop_strings;
  // How the one-token steps after the prefill run (docs/generate.md, "Decode step"); the tokens
  // are the same either way, the logits equal to rounding:
  //  kDynamic: LlamaModel::decode over the filled part of the cache (shapes grow every step);
  //  kStatic: LlamaModel::decode_step over the whole cache under a key bias, every shape and
  //    host value the same from step to step (the cache's capacity rounded up to 16 slots);
  //  kAuto: kStatic on CUDA, kDynamic on the CPU (measured faster there); the environment
  //    variable CIUIC_DECODE_STEP=static or =dynamic overrides kAuto (A/B, debugging).
  enum class DecodeStep { kAuto, kDynamic, kStatic };
  DecodeStep decode_step = DecodeStep::kAuto;
  // With the static step on CUDA: capture it once per generate() call as a CUDA graph
  // (model/step_graph.h; greedy without a repetition penalty captures the argmax, the pad fill of
  // finished rows and the EOS check too) and replay it every step. CIUIC_CUDA_GRAPH=0 in the
  // environment turns it off as false does. Not used for a model with group boundaries (a
  // sharding that gathers parameters per layer runs host code each step) nor in a build without
  // CUDA; a capture that fails logs a warning and the steps run without the graph.
  bool cuda_graph = true;
};

struct GenerateResult {
  std::vector<std::vector<int32_t>>
      tokens;  // per prompt: the new tokens, ending with the EOS id when produced
  std::vector<bool> hit_eos;
  std::vector<bool> hit_stop;  // the row ended with a stop string (its last token completed it)
  double first_token_s = 0;    // prefill and the first token of every row
  double total_s = 0;
  int64_t steps = 0;  // decoding steps run (the first token included)
  // How the steps after the prefill ran: "dynamic", "static" or "cuda_graph" (empty: none ran).
  std::string decode_step;
};

// The eos ids to stop at for an HF folder: generation_config.json's eos_token_id (an id or a
// list) when the file has one, else config.json's. Errors name the file.
CIUIC_API std::vector<int32_t> eos_ids_of_folder(const std::string& folder);
// generation_config.json's sampling fields (do_sample, temperature, top_k, top_p, min_p,
// repetition_penalty) over `base`; absent file or keys keep base's. Errors name the file and key.
CIUIC_API SamplingParams sampling_of_folder(const std::string& folder, SamplingParams base = {});
// generation_config.json's stop_strings (a string or a list of strings; {} when absent). Errors
// name the file and key.
CIUIC_API std::vector<std::string> stop_strings_of_folder(const std::string& folder);

CIUIC_API GenerateResult generate(const LlamaModel& model,
                                  const std::vector<std::vector<int32_t>>& prompts,
                                  const GenerateOptions& options);

}  // namespace ciuic::model
