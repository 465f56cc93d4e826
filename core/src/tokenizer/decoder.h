// tokenizer/decoder.h — the "decoder" of an HF tokenizer.json, as a chain over token strings.
//
// HF `Tokenizer::decode` turns ids into token strings (added tokens: their content; model
// tokens: their vocabulary string), then runs the decoder's decode_chain and joins the result.
// Supported, with HF's semantics:
//   ByteLevel     every token's characters mapped back through GPT-2's byte alphabet (a token
//                 with a character outside it is kept as its UTF-8), all fused into one string,
//                 read as UTF-8 with U+FFFD for ill-formed parts (from_utf8_lossy)
//   Replace       per token, every match of a {"String"} literal or {"Regex"} replaced
//   ByteFallback  runs of "<0xXX>" tokens become their bytes when those are valid UTF-8, else one
//                 U+FFFD per byte token
//   Fuse          all tokens joined into one
//   Strip         per token, up to `start` leading and `stop` trailing `content` characters cut
//   Metaspace     per token, the replacement character becomes a space, except in the first
//                 token where it is dropped (unless prepend_scheme is "never")
//   Sequence      of these
// null (no decoder) joins the tokens with single spaces, as HF does. Anything else is refused at
// construction with its JSON path.
//
// Threading: immutable after construction; decode() may be called from any number of threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include <ciuic/export.h>

#include "tokenizer/regex.h"

namespace ciuic::tok {

class CIUIC_API Decoder {
 public:
  Decoder(const nlohmann::json& j, const std::string& origin, const std::string& path);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  // True when the decoder is exactly ByteLevel (alone or as a Sequence's only member): the caller
  // may then decode through precomputed token bytes.
  bool byte_level_only() const { return steps_.size() == 1 && steps_[0].kind == Kind::kByteLevel; }

  // HF decode_chain + join on `tokens` (consumed).
  std::string decode(std::vector<std::string> tokens) const;

 private:
  enum class Kind {
    kByteLevel,
    kReplaceString,
    kReplaceRegex,
    kByteFallback,
    kFuse,
    kStrip,
    kMetaspace
  };
  struct Step {
    Kind kind;
    std::string pattern,
        content;  // Replace (pattern String), Strip (content), Metaspace (replacement)
    std::unique_ptr<Regex> re;   // Replace (pattern Regex)
    size_t start = 0, stop = 0;  // Strip
    bool drop_first = true;      // Metaspace: prepend_scheme != never
  };
  void parse(const nlohmann::json& j, const std::string& origin, const std::string& path);
  void run(const Step& step, std::vector<std::string>& tokens) const;

  std::vector<Step> steps_;
  bool null_ = false;
};

}  // namespace ciuic::tok
