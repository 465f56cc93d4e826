// ciuic::Tokenizer: HF tokenizer.json BPE (byte-level and SentencePiece-style). See
// ciuic/tokenizer.h and tokenizer/hf_tokenizer.h for the pipeline; docs/tokenizer.md for what is
// supported.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <unordered_set>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/files.h>
#include <ciuic/json.h>
#include <ciuic/log.h>

#include "base/paths.h"
#include "tokenizer/factory.h"
#include "tokenizer/hf_tokenizer.h"
#include "tokenizer/json_parse.h"
#include "tokenizer/utf8.h"

namespace ciuic {

namespace tok {

using nlohmann::json;

namespace {

std::string type_of(const json& j, const std::string& origin, const std::string& path) {
  if (!j.is_object()) fail(origin, path, "expected an object, got " + j.dump());
  auto t = j.find("type");
  if (t == j.end() || !t->is_string()) fail(origin, path + "/type", "missing or not a string");
  return t->get<std::string>();
}

// "line L, column C" of byte offset `pos` in `text` (1-based, columns in bytes).
std::string line_col(std::string_view text, size_t pos) {
  pos = std::min(pos, text.size());
  size_t line = 1, col = 1;
  for (size_t i = 0; i < pos; ++i) {
    if (text[i] == '\n') {
      ++line;
      col = 1;
    } else {
      ++col;
    }
  }
  return "line " + std::to_string(line) + ", column " + std::to_string(col);
}

json parse_json(std::string_view text, const std::string& origin) {
  check_json_depth(text, origin);  // before anything recursive walks, dumps or fingerprints it
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::parse_error& e) {
    // e.byte is 1-based and points just past the offending character.
    size_t at = e.byte > 0 ? e.byte - 1 : 0;
    std::string what = e.what();
    // nlohmann's message starts "[json.exception.parse_error.101] parse error at line ..": keep the
    // tail.
    size_t colon = what.find(": ");
    if (colon != std::string::npos) what = what.substr(colon + 2);
    throw Error(origin + ": malformed JSON at " + line_col(text, at) + ": " + what);
  } catch (const json::exception& e) {  // out_of_range: a number that overflows (1e999)
    std::string what = e.what();
    const size_t colon = what.find("] ");
    if (colon != std::string::npos) what = what.substr(colon + 2);
    throw Error(origin + ": malformed JSON: " + what);
  }
}

std::string read_file(const std::string& path, const char* what) {
  if (paths::is(path, paths::Want::kFolder))
    throw Error("cannot read " + std::string(what) + " '" + path +
                "': it is a directory (expected tokenizer.json)");
  if (!paths::is(path,
                 paths::Want::kAny))  // missing, or a path the file system refuses (the reason)
    throw Error("cannot read " + std::string(what) + " '" + path +
                "': " + paths::problem(path, paths::Want::kFile));
  // A regular file of at most kMaxJsonInputBytes: /dev/zero or a FIFO is refused at once.
  return read_input(path, what, kMaxJsonInputBytes);
}

// GPT-2's pre-tokenization regex, as HF's ByteLevel pre-tokenizer compiles it.
constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Rust regex's Unicode \w (Alphabetic, M, Nd, Pc, Join_Control), approximated with general
// categories plus the non-letter Alphabetic symbols (circled / squared Latin letters).
constexpr const char* kRustWordChar =
    R"([\p{L}\p{Nl}\p{M}\p{Nd}\p{Pc}\x{200C}\x{200D}\x{24B6}-\x{24E9}\x{1F130}-\x{1F149}\x{1F150}-\x{1F169}\x{1F170}-\x{1F189}])";

}  // namespace

std::vector<uint8_t> loss_mask_from_offsets(const std::vector<std::pair<size_t, size_t>>& offsets,
                                            const std::vector<std::pair<size_t, size_t>>& spans) {
  std::vector<uint8_t> mask(offsets.size(), 0);
  for (size_t t = 0; t < offsets.size(); ++t) {
    const auto [b, e] = offsets[t];
    for (const auto& [sb, se] : spans) {
      if (sb >= e) break;  // spans are sorted: none later overlaps either
      if (b < se && sb < e) {
        mask[t] = 1;
        break;
      }
    }
  }
  return mask;
}

std::string fnv1a64_hex(std::string_view data) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (unsigned char c : data) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// ---- LiteralMatcher -----------------------------------------------------------------------
int32_t LiteralMatcher::child(int32_t node, uint8_t b) const {
  const auto& kids = nodes_[node].kids;
  auto it = std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, INT32_MIN));
  return (it != kids.end() && it->first == b) ? it->second : -1;
}

void LiteralMatcher::add(std::string_view pattern, int32_t value) {
  if (pattern.empty()) return;
  int32_t node = 0;
  const size_t depth = std::min(pattern.size(), kTrieDepth);
  for (size_t i = 0; i < depth; ++i) {
    const auto b = static_cast<unsigned char>(pattern[i]);
    int32_t next = child(node, b);
    if (next < 0) {
      next = static_cast<int32_t>(nodes_.size());
      nodes_.push_back(Node{});
      auto& kids = nodes_[node].kids;
      kids.insert(std::lower_bound(kids.begin(), kids.end(), std::make_pair(b, INT32_MIN)),
                  {b, next});
      if (node == 0) root_[b] = next;
    }
    node = next;
  }
  if (pattern.size() == depth) {
    nodes_[node].value = value;
    return;
  }
  const std::string_view rest = pattern.substr(depth);
  auto& tails = nodes_[node].tails;
  for (auto& t : tails)
    if (t.first == rest) {
      t.second = value;
      return;
    }
  auto at = std::find_if(tails.begin(), tails.end(),
                         [&](const auto& t) { return t.first.size() < rest.size(); });
  tails.insert(at, {std::string(rest), value});
}

bool LiteralMatcher::find(std::string_view text, size_t pos, size_t* start, size_t* len,
                          int32_t* value) const {
  if (empty()) return false;
  const auto* data = reinterpret_cast<const unsigned char*>(text.data());
  for (size_t p = pos; p < text.size(); ++p) {
    int32_t node = root_[data[p]];
    if (node == 0) continue;
    int32_t best_value = -1;
    size_t best_len = 0;
    size_t q = p;
    while (true) {
      ++q;
      if (nodes_[node].value >= 0) {
        best_value = nodes_[node].value;
        best_len = q - p;
      }
      // Patterns longer than the trie (only at depth kTrieDepth, which has no children): the
      // first that matches is the longest.
      for (const auto& [rest, v] : nodes_[node].tails)
        if (rest.size() <= text.size() - q &&
            std::memcmp(data + q, rest.data(), rest.size()) == 0) {
          best_value = v;
          best_len = q - p + rest.size();
          break;
        }
      if (q >= text.size()) break;
      node = child(node, data[q]);
      if (node < 0) break;
    }
    if (best_value >= 0) {
      *start = p;
      *len = best_len;
      *value = best_value;
      return true;
    }
  }
  return false;
}

// ---- construction -------------------------------------------------------------------------
void HfTokenizer::parse_pre_tokenizer(const json& j, const std::string& path) {
  if (j.is_null()) return;
  std::string type = type_of(j, origin_, path);
  if (byte_level_ || metaspace_) {
    const char* last = byte_level_ ? "ByteLevel" : "Metaspace";
    fail(origin_, path,
         "pre-tokenizer \"" + type + "\" after " + last + " is not supported (" + last +
             " must be last)");
  }
  if (type == "Sequence") {
    auto it = j.find("pretokenizers");
    if (it == j.end() || !it->is_array())
      fail(origin_, path + "/pretokenizers", "missing or not an array");
    for (size_t i = 0; i < it->size(); ++i)
      parse_pre_tokenizer((*it)[i], path + "/pretokenizers/" + std::to_string(i));
    return;
  }
  if (type == "Split") {
    Step step;
    auto pat = j.find("pattern");
    if (pat == j.end() || !pat->is_object() || pat->size() != 1)
      fail(origin_, path + "/pattern", "expected {\"Regex\": ...} or {\"String\": ...}");
    const std::string where = origin_ + ": " + path + "/pattern";
    if (auto r = pat->find("Regex"); r != pat->end() && r->is_string()) {
      step.re = std::make_unique<Regex>(r->get<std::string>(), where + "/Regex");
    } else if (auto s = pat->find("String"); s != pat->end() && s->is_string()) {
      step.re =
          std::make_unique<Regex>(Regex::escape_literal(s->get<std::string>()), where + "/String");
    } else {
      fail(origin_, path + "/pattern",
           "expected {\"Regex\": \"...\"} or {\"String\": \"...\"}, got " + pat->dump());
    }
    auto beh = j.find("behavior");
    if (beh == j.end() || !beh->is_string())
      fail(origin_, path + "/behavior", "missing or not a string");
    const std::string b = beh->get<std::string>();
    if (b == "Removed")
      step.behavior = Behavior::kRemoved;
    else if (b == "Isolated")
      step.behavior = Behavior::kIsolated;
    else if (b == "MergedWithPrevious")
      step.behavior = Behavior::kMergedWithPrevious;
    else if (b == "MergedWithNext")
      step.behavior = Behavior::kMergedWithNext;
    else if (b == "Contiguous")
      step.behavior = Behavior::kContiguous;
    else
      fail(origin_, path + "/behavior",
           "unknown behavior \"" + b +
               "\" (expected Removed, Isolated, MergedWithPrevious, MergedWithNext or Contiguous)");
    step.invert = get_bool(j, "invert", false, origin_, path);
    steps_.push_back(std::move(step));
    return;
  }
  if (type == "Digits") {
    Step step;
    bool individual = get_bool(j, "individual_digits", false, origin_, path);
    // HF splits on char::is_numeric (general categories Nd, Nl, No): isolated single characters,
    // or runs of them (Contiguous behaviour == runs isolated).
    step.re = std::make_unique<Regex>(individual ? "\\p{N}" : "\\p{N}+", origin_ + ": " + path);
    steps_.push_back(std::move(step));
    return;
  }
  if (type == "ByteLevel") {
    byte_level_ = true;
    add_prefix_space_ = get_bool(j, "add_prefix_space", true, origin_, path);
    if (get_bool(j, "use_regex", true, origin_, path))
      byte_level_regex_ =
          std::make_unique<Regex>(kGpt2Regex, origin_ + ": " + path + " (GPT-2 regex)");
    return;
  }
  if (type == "Metaspace") {
    Metaspace m;
    m.replacement = "\xE2\x96\x81";  // U+2581, HF's default
    if (auto r = j.find("replacement"); r != j.end() && !r->is_null()) {
      const std::string rep = r->is_string() ? r->get<std::string>() : std::string();
      if (rep.empty() || utf8::find_invalid(rep) != std::string_view::npos ||
          utf8::sequence_length(rep, 0) != rep.size())
        fail(origin_, path + "/replacement", "expected a one-character string, got " + r->dump());
      m.replacement = rep;
    }
    if (auto ps = j.find("prepend_scheme"); ps != j.end() && !ps->is_null()) {
      if (*ps == "always")
        m.prepend = Metaspace::Prepend::kAlways;
      else if (*ps == "first")
        m.prepend = Metaspace::Prepend::kFirst;
      else if (*ps == "never")
        m.prepend = Metaspace::Prepend::kNever;
      else
        fail(origin_, path + "/prepend_scheme",
             "expected \"first\", \"always\" or \"never\", got " + ps->dump());
    } else {  // files written before prepend_scheme existed
      m.prepend = get_bool(j, "add_prefix_space", true, origin_, path) ? Metaspace::Prepend::kAlways
                                                                       : Metaspace::Prepend::kNever;
    }
    m.split = get_bool(j, "split", true, origin_, path);
    metaspace_ = std::move(m);
    return;
  }
  fail(origin_, path + "/type",
       "unsupported pre-tokenizer \"" + type +
           "\" (ciuic supports Sequence, Split, Digits, ByteLevel and Metaspace)");
}

void HfTokenizer::parse_post_processor(const json& j, const std::string& path) {
  if (j.is_null()) return;
  std::string type = type_of(j, origin_, path);
  if (type == "Sequence") {
    auto it = j.find("processors");
    if (it == j.end() || !it->is_array())
      fail(origin_, path + "/processors", "missing or not an array");
    for (size_t i = 0; i < it->size(); ++i)
      parse_post_processor((*it)[i], path + "/processors/" + std::to_string(i));
    return;
  }
  if (type == "ByteLevel") return;  // only trims offsets: no effect on ids
  if (type == "TemplateProcessing") {
    if (!prefix_.empty() || !suffix_.empty())
      fail(origin_, path, "a second TemplateProcessing post-processor is not supported");
    auto single = j.find("single");
    if (single == j.end() || !single->is_array())
      fail(origin_, path + "/single", "missing or not an array");
    auto specials = j.find("special_tokens");
    bool seen_a = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& piece = (*single)[i];
      std::string ppath = path + "/single/" + std::to_string(i);
      if (piece.is_object() && piece.contains("Sequence")) {
        const json& seq = piece["Sequence"];
        if (!seq.is_object() || seq.value("id", std::string()) != "A" || seen_a)
          fail(origin_, ppath,
               "the single-sequence template must contain $A exactly once, got " + piece.dump());
        seen_a = true;
      } else if (piece.is_object() && piece.contains("SpecialToken")) {
        const json& st = piece["SpecialToken"];
        if (!st.is_object() || !st.contains("id") || !st["id"].is_string())
          fail(origin_, ppath + "/SpecialToken/id", "missing or not a string");
        std::string name = st["id"].get<std::string>();
        if (specials == j.end() || !specials->is_object() || !specials->contains(name))
          fail(origin_, path + "/special_tokens",
               "no entry for \"" + name + "\" used in the template");
        const json& ids = (*specials)[name]["ids"];
        if (!ids.is_array())
          fail(origin_, path + "/special_tokens/" + name + "/ids", "missing or not an array");
        for (const json& id : ids) {
          if (!id.is_number_integer())
            fail(origin_, path + "/special_tokens/" + name + "/ids", "expected integers");
          (seen_a ? suffix_ : prefix_).push_back(id.get<int32_t>());
        }
      } else {
        fail(origin_, ppath,
             "expected {\"SpecialToken\": ...} or {\"Sequence\": ...}, got " + piece.dump());
      }
    }
    if (!seen_a) fail(origin_, path + "/single", "the template has no $A sequence");
    return;
  }
  fail(origin_, path + "/type",
       "unsupported post-processor \"" + type +
           "\" (ciuic supports TemplateProcessing, ByteLevel and Sequence)");
}

HfTokenizer::HfTokenizer(std::string_view json_text, const std::string& origin,
                         std::string_view config_json, const std::string& config_origin)
    : origin_(origin),
      config_text_(config_json),
      config_path_(config_json.empty() ? "" : config_origin) {
  json j = parse_json(json_text, origin_);
  if (!j.is_object()) fail(origin_, "/", "expected a JSON object (an HF tokenizer.json)");
  auto m = j.find("model");
  if (m == j.end()) fail(origin_, "/model", "missing (not an HF tokenizer.json?)");

  normalizer_ = std::make_unique<Normalizer>(j.value("normalizer", json()), origin_, "/normalizer");
  if (normalizer_->identity()) normalizer_.reset();
  parse_pre_tokenizer(j.value("pre_tokenizer", json()), "/pre_tokenizer");
  // The model works on raw bytes when the pieces reach it through ByteLevel, else on characters.
  model_ = std::make_unique<BpeModel>(*m, origin_, byte_level_);
  parse_post_processor(j.value("post_processor", json()), "/post_processor");
  decoder_ = std::make_unique<Decoder>(j.value("decoder", json()), origin_, "/decoder");
  for (const char* key : {"truncation", "padding"}) {
    auto it = j.find(key);
    if (it != j.end() && !it->is_null())
      log_warn(origin_ + ": /" + key +
               " is set; ciuic ignores it (it never truncates or pads in encode)");
  }

  // Added tokens.
  vocab_size_ = model_->max_id() + 1;
  if (auto at = j.find("added_tokens"); at != j.end() && !at->is_null()) {
    if (!at->is_array()) fail(origin_, "/added_tokens", "expected an array");
    for (size_t i = 0; i < at->size(); ++i) {
      const json& t = (*at)[i];
      std::string path = "/added_tokens/" + std::to_string(i);
      if (!t.is_object()) fail(origin_, path, "expected an object");
      AddedToken a;
      if (!t.contains("id") || !t["id"].is_number_integer() || t["id"].get<int64_t>() < 0 ||
          t["id"].get<int64_t>() > INT32_MAX)
        fail(origin_, path + "/id", "missing or not a non-negative integer");
      if (!t.contains("content") || !t["content"].is_string())
        fail(origin_, path + "/content", "missing or not a string");
      a.id = t["id"].get<int32_t>();
      a.content = t["content"].get<std::string>();
      if (a.content.empty()) fail(origin_, path + "/content", "empty added token");
      if (utf8::find_invalid(a.content) != std::string_view::npos)
        fail(origin_, path + "/content", "not valid UTF-8");
      a.special = get_bool(t, "special", false, origin_, path);
      a.single_word = get_bool(t, "single_word", false, origin_, path);
      a.lstrip = get_bool(t, "lstrip", false, origin_, path);
      a.rstrip = get_bool(t, "rstrip", false, origin_, path);
      a.normalized = get_bool(t, "normalized", !a.special, origin_, path);
      vocab_size_ = std::max(vocab_size_, a.id + 1);
      added_.push_back(std::move(a));
    }
  }
  if (static_cast<size_t>(vocab_size_) >
      static_cast<size_t>(model_->max_id() + 1) + added_.size() * 4 + 1000000)
    fail(origin_, "/added_tokens",
         "an added token id (" + std::to_string(vocab_size_ - 1) +
             ") is far beyond the vocabulary (ids must be dense)");
  added_by_id_.assign(vocab_size_, -1);
  for (size_t i = 0; i < added_.size(); ++i) {
    const AddedToken& a = added_[i];
    // Later entries with the same content win, as in HF's map. "normalized" tokens are matched
    // in normalized text by their normalized content (HF normalizes them when it builds its trie).
    added_by_id_[a.id] = static_cast<int32_t>(i);
    // HF's id_to_token (and so decode) gives a normalized token's normalized content.
    added_[i].decoded = a.normalized && normalizer_ ? normalizer_->normalize(a.content) : a.content;
    if (a.normalized) {
      normalized_matcher_.add(added_[i].decoded, static_cast<int32_t>(i));
    } else {
      raw_matcher_.add(a.content, static_cast<int32_t>(i));
    }
  }
  // HF's decode skips (skip_special_tokens) every token whose string is a special token's content.
  {
    std::unordered_set<std::string> special;
    for (const AddedToken& a : added_)
      if (a.special) special.insert(a.content);
    special_by_id_.assign(vocab_size_, 0);
    for (int32_t id = 0; id < vocab_size_; ++id) {
      if (added_by_id_[id] >= 0) {
        special_by_id_[id] = special.count(added_[added_by_id_[id]].decoded) ? 1 : 0;
      } else if (const std::string* t = model_->id_to_token(id)) {
        special_by_id_[id] = special.count(*t) ? 1 : 0;
      }
    }
  }
  for (int32_t id : prefix_)
    if (id < 0 || id >= vocab_size_)
      fail(origin_, "/post_processor",
           "template token id " + std::to_string(id) + " is outside the vocabulary");
  for (int32_t id : suffix_)
    if (id < 0 || id >= vocab_size_)
      fail(origin_, "/post_processor",
           "template token id " + std::to_string(id) + " is outside the vocabulary");
  word_char_ = std::make_unique<Regex>(kRustWordChar, "tokenizer word-character class");

  // BOS / EOS: tokenizer_config.json when given, else the template's first token and known names.
  auto resolve = [&](const json& cfg, const char* key) -> std::optional<int32_t> {
    auto it = cfg.find(key);
    if (it == cfg.end() || it->is_null()) return std::nullopt;
    std::string name;
    if (it->is_string())
      name = it->get<std::string>();
    else if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
      name = (*it)["content"].get<std::string>();
    else
      fail(config_origin, std::string("/") + key,
           "expected a string or {\"content\": ...}, got " + it->dump());
    std::optional<int32_t> id = token_to_id(name);
    if (!id)
      fail(config_origin, std::string("/") + key,
           "token \"" + name + "\" is not in the tokenizer's vocabulary");
    return id;
  };
  bool have_config = !config_json.empty();
  if (have_config) {
    json cfg = parse_json(config_json, config_origin);
    if (!cfg.is_object()) fail(config_origin, "/", "expected a JSON object");
    bos_ = resolve(cfg, "bos_token");
    eos_ = resolve(cfg, "eos_token");
  } else {
    if (!prefix_.empty()) bos_ = prefix_.front();
    auto first_known = [&](std::initializer_list<const char*> names) -> std::optional<int32_t> {
      for (const char* n : names) {
        for (const AddedToken& a : added_)
          if (a.special && a.content == n) return a.id;
      }
      return std::nullopt;
    };
    if (!bos_)
      bos_ = first_known(
          {"<｜begin▁of▁sentence｜>", "<|begin_of_text|>", "<s>", "<bos>", "<|endoftext|>"});
    eos_ = first_known({"<｜end▁of▁sentence｜>", "<|end_of_text|>", "<|endoftext|>", "</s>",
                        "<|im_end|>", "<eos>"});
  }

  // Fingerprint: canonical JSON (keys sorted by nlohmann's std::map) plus the resolved BOS/EOS.
  std::string canon = "ciuic-tokenizer-v1\n" + j.dump() +
                      "\nbos=" + (bos_ ? std::to_string(*bos_) : "none") +
                      "\neos=" + (eos_ ? std::to_string(*eos_) : "none") + "\n";
  fingerprint_ = fnv1a64_hex(canon);
}

HfTokenizer::~HfTokenizer() = default;

std::optional<int32_t> HfTokenizer::token_to_id(std::string_view token) const {
  for (auto it = added_.rbegin(); it != added_.rend(); ++it)
    if (it->content == token) return it->id;
  return model_->token_to_id(token);
}

// ---- encoding -----------------------------------------------------------------------------
bool HfTokenizer::is_word_char_before(std::string_view s) const {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  size_t ms, me;
  std::string_view last = s.substr(i);
  return word_char_->search(last, 0, &ms, &me) && ms == 0;
}

bool HfTokenizer::is_word_char_after(std::string_view s) const {
  if (s.empty()) return false;
  size_t len = utf8::sequence_length(s, 0);
  size_t ms, me;
  return word_char_->search(s.substr(0, len ? len : 1), 0, &ms, &me) && ms == 0;
}

// HF AddedVocabulary::find_matches on text[b, e).
void HfTokenizer::split_added(std::string_view text, size_t b, size_t e, const LiteralMatcher& m,
                              std::vector<Segment>& out) const {
  std::string_view s = text.substr(b, e - b);
  size_t start_offset = 0;
  size_t pos = 0, mstart, mlen;
  int32_t idx;
  while (m.find(s, pos, &mstart, &mlen, &idx)) {
    pos = mstart + mlen;  // the automaton continues after the raw match, whatever we do with it
    const AddedToken& a = added_[idx];
    size_t start = mstart, stop = mstart + mlen;
    if (a.single_word) {
      bool start_space = start == 0 || !is_word_char_before(s.substr(0, start));
      bool stop_space = stop == s.size() || !is_word_char_after(s.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (a.lstrip) {
      size_t ns = start;
      while (ns > 0) {
        size_t k = ns - 1;
        while (k > 0 && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
        size_t len;
        if (!utf8::is_white_space(utf8::decode(s, k, &len))) break;
        ns = k;
      }
      start = std::max(ns, start_offset);
    }
    if (a.rstrip) {
      while (stop < s.size()) {
        size_t len;
        if (!utf8::is_white_space(utf8::decode(s, stop, &len))) break;
        stop += len;
      }
    }
    if (start_offset < start) out.push_back(Segment{b + start_offset, b + start, -1});
    out.push_back(Segment{b + start, b + stop, idx});
    start_offset = stop;
  }
  if (start_offset < s.size()) out.push_back(Segment{b + start_offset, e, -1});
}

HfTokenizer::Scratch& HfTokenizer::scratch() const {
  static thread_local Scratch sc;
  sc.regex = &MatchScratch::local();
  sc.cache = &model_->thread_cache();
  return sc;
}

template <class A, class P>
void HfTokenizer::run_pipeline(std::string_view text, Scratch& sc, A&& on_added,
                               P&& on_piece) const {
  std::vector<Segment>& raw = sc.first;
  raw.clear();
  if (text.empty()) return;
  if (raw_matcher_.empty())
    raw.push_back(Segment{0, text.size(), -1});
  else
    split_added(text, 0, text.size(), raw_matcher_, raw);
  for (const Segment& seg : raw) {
    if (seg.added >= 0) {
      on_added(seg.added);
      continue;
    }
    // HF normalizes each stretch between raw-matched added tokens on its own.
    std::string_view t = text.substr(seg.b, seg.e - seg.b);
    if (normalizer_) t = normalizer_->normalize(t, sc.norm_a, sc.norm_b, *sc.regex);
    if (t.empty()) continue;
    std::vector<Segment>& segs = sc.segs;
    segs.clear();
    if (normalized_matcher_.empty())
      segs.push_back(Segment{0, t.size(), -1});
    else
      split_added(t, 0, t.size(), normalized_matcher_, segs);
    for (const Segment& s2 : segs) {
      if (s2.added >= 0) {
        on_added(s2.added);
        continue;
      }
      pre_tokenize_text(t, s2, sc);
      for_each_final_piece<false>(t, seg.b == 0, sc, on_piece);
    }
  }
}

// flatten: the pushes of pieces are this loop's hot path (GCC otherwise calls an out-of-line
// emplace_back).
[[gnu::flatten]] void HfTokenizer::apply_step(const Step& step, std::string_view text, Span piece,
                                              Scratch& sc) const {
  std::string_view s = text.substr(piece.b, piece.e - piece.b);
  std::vector<Span>& out = sc.next;
  if (step.behavior ==
      Behavior::kIsolated) {  // the common case; match flags (and invert) are unused
    size_t prev = 0;
    step.re->for_each_match(
        s,
        [&](size_t st, size_t en) {
          if (prev != st) out.push_back(Span{piece.b + prev, piece.b + st});
          if (st != en) out.push_back(Span{piece.b + st, piece.b + en});
          prev = en;
        },
        *sc.regex);
    if (prev != s.size()) out.push_back(Span{piece.b + prev, piece.e});
    return;
  }
  std::vector<Match>& ms = sc.matches;
  ms.clear();
  size_t prev = 0;
  step.re->for_each_match(
      s,
      [&](size_t st, size_t en) {
        if (prev != st) ms.push_back({prev, st, false});
        ms.push_back({st, en, true});
        prev = en;
      },
      *sc.regex);
  if (prev != s.size()) ms.push_back({prev, s.size(), false});
  if (step.invert)
    for (Match& x : ms) x.match = !x.match;
  auto emit = [&](size_t b, size_t e) {
    if (b != e) out.push_back(Span{piece.b + b, piece.b + e});
  };
  switch (step.behavior) {
    case Behavior::kIsolated:
      for (const Match& x : ms) emit(x.b, x.e);
      return;
    case Behavior::kRemoved:
      for (const Match& x : ms)
        if (!x.match) emit(x.b, x.e);
      return;
    case Behavior::kContiguous:
    case Behavior::kMergedWithPrevious: {
      // HF NormalizedString::split folds (offsets, is_match) into a list, extending the last
      // entry instead of starting a new one when the rule says so; empty entries are dropped
      // only at the end.
      std::vector<Span>& acc = sc.acc;
      acc.clear();
      bool previous_match = false;
      for (const Match& x : ms) {
        bool extend = step.behavior == Behavior::kContiguous ? (x.match == previous_match)
                                                             : (x.match && !previous_match);
        if (extend && !acc.empty())
          acc.back().e = x.e;
        else
          acc.push_back(Span{x.b, x.e});
        previous_match = x.match;
      }
      for (const Span& a : acc) emit(a.b, a.e);
      return;
    }
    case Behavior::kMergedWithNext: {
      std::vector<Span>& acc = sc.acc;
      acc.clear();
      bool previous_match = false;
      for (auto it = ms.rbegin(); it != ms.rend(); ++it) {
        if (it->match && !previous_match && !acc.empty())
          acc.back().b = it->b;
        else
          acc.push_back(Span{it->b, it->e});
        previous_match = it->match;
      }
      for (auto it = acc.rbegin(); it != acc.rend(); ++it) emit(it->b, it->e);
      return;
    }
  }
}

void HfTokenizer::pre_tokenize_text(std::string_view text, Segment seg, Scratch& sc) const {
  sc.pieces.clear();
  sc.pieces.push_back(Span{seg.b, seg.e});
  for (const Step& step : steps_) {
    sc.next.clear();
    for (const Span& p : sc.pieces) apply_step(step, text, p, sc);
    sc.pieces.swap(sc.next);
  }
}

// Calls fn(piece) for every piece that reaches the BPE model: ByteLevel's prefix space and GPT-2
// regex applied to each pre-tokenized span.
template <bool kMap, class F>
void HfTokenizer::for_each_final_piece(std::string_view text, bool at_origin, Scratch& sc,
                                       F&& fn) const {
  // fn(piece, map): with kMap, map[i] is the [start, end) bytes of `text` that byte i of the
  // piece comes from (a prefix or replacement character: the character it stands for).
  std::string& buf = sc.buf;
  std::vector<std::pair<uint32_t, uint32_t>>& map = sc.map;
  const std::pair<uint32_t, uint32_t>* no_map = nullptr;
  auto identity = [&](size_t b, size_t e) {
    for (size_t i = b; i < e; ++i)
      map.emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1));
  };
  for (const Span& p : sc.pieces) {
    std::string_view s = text.substr(p.b, p.e - p.b);
    if constexpr (kMap) map.clear();
    if (metaspace_) {
      // HF Metaspace::pre_tokenize: ' ' -> replacement; the prefix ("first": only for the piece
      // at offset 0 of the original text); then split before each replacement (MergedWithNext).
      const std::string& rep = metaspace_->replacement;
      const bool prepend =
          metaspace_->prepend == Metaspace::Prepend::kAlways ||
          (metaspace_->prepend == Metaspace::Prepend::kFirst && at_origin && p.b == 0);
      buf.clear();
      if (prepend && s[0] != ' ' &&
          s.compare(0, rep.size(), rep) != 0) {  // after ' ' -> rep it would start with rep
        buf = rep;
        if constexpr (kMap) {
          const size_t first = utf8::sequence_length(s, 0);
          for (size_t k = 0; k < rep.size(); ++k)
            map.emplace_back(static_cast<uint32_t>(p.b),
                             static_cast<uint32_t>(p.b + (first ? first : 1)));
        }
      }
      for (size_t i = 0; i < s.size();) {
        const size_t sp = std::min(s.find(' ', i), s.size());
        buf.append(s.data() + i, sp - i);
        if constexpr (kMap) identity(p.b + i, p.b + sp);
        if (sp == s.size()) break;
        buf += rep;
        if constexpr (kMap)
          for (size_t k = 0; k < rep.size(); ++k)
            map.emplace_back(static_cast<uint32_t>(p.b + sp), static_cast<uint32_t>(p.b + sp + 1));
        i = sp + 1;
      }
      const std::string_view all = buf;
      if (!metaspace_->split) {
        fn(all, kMap ? map.data() : no_map);
        continue;
      }
      size_t start = 0;
      for (size_t at = all.find(rep, 1); at != std::string_view::npos;
           at = all.find(rep, at + rep.size())) {
        if (at > start) fn(all.substr(start, at - start), kMap ? map.data() + start : no_map);
        start = at;
      }
      if (start < all.size()) fn(all.substr(start), kMap ? map.data() + start : no_map);
      continue;
    }
    if (add_prefix_space_ && s[0] != ' ') {
      buf.assign(1, ' ');
      buf.append(s);
      s = buf;
      if constexpr (kMap) {
        const size_t first = utf8::sequence_length(text, p.b);
        map.emplace_back(static_cast<uint32_t>(p.b),
                         static_cast<uint32_t>(p.b + (first ? first : 1)));
        identity(p.b, p.e);
      }
    } else if constexpr (kMap) {
      identity(p.b, p.e);
    }
    if (byte_level_regex_) {
      size_t prev = 0;
      byte_level_regex_->for_each_match(
          s,
          [&](size_t st, size_t en) {
            if (prev != st) fn(s.substr(prev, st - prev), kMap ? map.data() + prev : no_map);
            if (st != en) fn(s.substr(st, en - st), kMap ? map.data() + st : no_map);
            prev = en;
          },
          *sc.regex);
      if (prev != s.size()) fn(s.substr(prev), kMap ? map.data() + prev : no_map);
    } else {
      fn(s, kMap ? map.data() : no_map);
    }
  }
}

bool HfTokenizer::encode_with_offsets(std::string_view text, std::vector<int32_t>& ids,
                                      std::vector<std::pair<size_t, size_t>>& offsets) const {
  const size_t bad = utf8::find_invalid(text);
  if (bad != std::string_view::npos)
    throw Error("tokenizer (" + origin_ +
                "): the text is not valid UTF-8 (first bad byte at offset " + std::to_string(bad) +
                " of " + std::to_string(text.size()) + ")");
  ids.clear();
  offsets.clear();
  if (text.empty()) return true;
  Scratch& sc = scratch();
  std::vector<Segment> raw, segs;
  if (raw_matcher_.empty())
    raw.push_back(Segment{0, text.size(), -1});
  else
    split_added(text, 0, text.size(), raw_matcher_, raw);
  Normalizer::Alignment align;
  std::vector<size_t> lens;
  bool ok = true;
  for (const Segment& seg : raw) {
    if (seg.added >= 0) {
      ids.push_back(added_[seg.added].id);
      offsets.emplace_back(seg.b, seg.e);
      continue;
    }
    const std::string_view orig = text.substr(seg.b, seg.e - seg.b);
    std::string norm;
    if (normalizer_) {
      norm = normalizer_->normalize_aligned(orig, align);
    } else {
      norm.assign(orig);
      align.clear();
      for (size_t i = 0; i < orig.size(); ++i)
        align.emplace_back(static_cast<uint32_t>(i), static_cast<uint32_t>(i + 1));
    }
    if (norm.empty()) continue;
    // Bytes [b, e) of `norm` -> bytes of `text`.
    auto to_text = [&](size_t b, size_t e) {
      return std::make_pair(seg.b + align[b].first, seg.b + align[e - 1].second);
    };
    segs.clear();
    if (normalized_matcher_.empty())
      segs.push_back(Segment{0, norm.size(), -1});
    else
      split_added(norm, 0, norm.size(), normalized_matcher_, segs);
    for (const Segment& s2 : segs) {
      if (s2.added >= 0) {
        ids.push_back(added_[s2.added].id);
        offsets.push_back(to_text(s2.b, s2.e));
        continue;
      }
      pre_tokenize_text(norm, s2, sc);
      for_each_final_piece<true>(
          norm, seg.b == 0, sc,
          [&](std::string_view piece, const std::pair<uint32_t, uint32_t>* m) {
            const size_t first = ids.size();
            model_->encode(piece, ids, *sc.cache);
            lens.clear();
            if (!model_->token_lengths(piece, ids.data() + first, ids.size() - first, lens)) {
              ok = false;
              offsets.resize(ids.size(), std::make_pair(seg.b, seg.e));
              return;
            }
            size_t at = 0;
            for (size_t len : lens) {
              offsets.push_back(to_text(m[at].first, m[at + len - 1].second));
              at += len;
            }
          });
    }
  }
  return ok;
}

std::vector<int32_t> HfTokenizer::encode(std::string_view text, bool add_special_tokens) const {
  size_t bad = utf8::find_invalid(text);
  if (bad != std::string_view::npos)
    throw Error("tokenizer (" + origin_ +
                "): the text is not valid UTF-8 (first bad byte at offset " + std::to_string(bad) +
                " of " + std::to_string(text.size()) + ")");
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + prefix_.size() + suffix_.size() + 4);
  if (add_special_tokens) out.insert(out.end(), prefix_.begin(), prefix_.end());
  Scratch& sc = scratch();
  run_pipeline(
      text, sc, [&](int32_t added) { out.push_back(added_[added].id); },
      [&](std::string_view piece, const void*) { model_->encode(piece, out, *sc.cache); });
  if (add_special_tokens) out.insert(out.end(), suffix_.begin(), suffix_.end());
  return out;
}

std::vector<std::string> HfTokenizer::pre_tokenize(std::string_view text) const {
  if (utf8::find_invalid(text) != std::string_view::npos)
    throw Error("pre_tokenize: text is not valid UTF-8");
  std::vector<std::string> out;
  Scratch& sc = scratch();
  run_pipeline(
      text, sc, [&](int32_t added) { out.push_back(added_[added].content); },
      [&](std::string_view piece, const void*) { out.emplace_back(piece); });
  return out;
}

std::string HfTokenizer::token_bytes(int32_t id) const {
  if (id >= 0 && id < static_cast<int32_t>(added_by_id_.size()) && added_by_id_[id] >= 0) {
    const AddedToken& a = added_[added_by_id_[id]];
    std::optional<std::string> b = ByteAlphabet::get().to_bytes(a.decoded);
    return b ? *b : a.decoded;
  }
  const std::string* b = model_->id_to_bytes(id);
  return b ? *b : std::string();
}

std::string HfTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  // HF Tokenizer::decode: every id becomes its token string (an added token's content, else the
  // model's token; unknown ids are skipped, and with skip_special_tokens every string that is a
  // special token's content), then the decoder chain runs on the strings.
  auto skipped = [&](int32_t id) {
    return skip_special_tokens && id >= 0 && id < static_cast<int32_t>(special_by_id_.size()) &&
           special_by_id_[id];
  };
  if (decoder_->byte_level_only()) {
    // ByteLevel alone: each token becomes its bytes (its own UTF-8 when it has characters outside
    // the byte alphabet), precomputed for model tokens; the whole is then read as UTF-8 with
    // U+FFFD for ill-formed parts.
    const ByteAlphabet& alphabet = ByteAlphabet::get();
    std::string bytes;
    bytes.reserve(ids.size() * 4);
    for (int32_t id : ids) {
      if (skipped(id)) continue;
      if (id >= 0 && id < static_cast<int32_t>(added_by_id_.size()) && added_by_id_[id] >= 0) {
        const AddedToken& a = added_[added_by_id_[id]];
        std::optional<std::string> b = alphabet.to_bytes(a.decoded);
        bytes += b ? *b : a.decoded;
        continue;
      }
      if (model_->byte_level()) {
        if (const std::string* b = model_->id_to_bytes(id)) bytes += *b;
      } else if (const std::string* t = model_->id_to_token(id)) {
        std::optional<std::string> b = alphabet.to_bytes(*t);
        bytes += b ? *b : *t;
      }
    }
    return utf8::lossy(bytes);
  }
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (skipped(id)) continue;
    if (id >= 0 && id < static_cast<int32_t>(added_by_id_.size()) && added_by_id_[id] >= 0) {
      tokens.push_back(added_[added_by_id_[id]].decoded);
    } else if (const std::string* t = model_->id_to_token(id)) {
      tokens.push_back(*t);
    }
  }
  return decoder_->decode(std::move(tokens));
}

}  // namespace tok

std::shared_ptr<const Tokenizer> tokenizer_from_json(std::string_view tokenizer_json,
                                                     std::string_view origin) {
  return std::make_shared<tok::HfTokenizer>(tokenizer_json, std::string(origin), std::string_view(),
                                            std::string());
}

std::shared_ptr<const Tokenizer> load_tokenizer(const std::string& tokenizer_json_path) {
  std::string text = tok::read_file(tokenizer_json_path, "tokenizer file");
  std::filesystem::path cfg =
      std::filesystem::path(tokenizer_json_path).parent_path() / "tokenizer_config.json";
  std::string cfg_text;
  std::error_code ec;
  if (std::filesystem::is_regular_file(cfg, ec))
    cfg_text = tok::read_file(cfg.string(), "tokenizer config");
  return std::make_shared<tok::HfTokenizer>(text, tokenizer_json_path, cfg_text, cfg.string());
}

}  // namespace ciuic
