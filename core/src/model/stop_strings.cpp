// Stop strings: transformers' StopStringCriteria (generation/stopping_criteria.py), the same
// backward walk over the row's last tokens, written with string compares instead of its
// precomputed embedding (same results: tests/model/generate_test.cpp against generate()).
#include <algorithm>
#include <cctype>
#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/files.h>
#include <ciuic/json.h>
#include <ciuic/tokenizer.h>

#include "model/generate.h"
#include "tokenizer/bpe.h"
#include "tokenizer/hf_tokenizer.h"

namespace ciuic::model {

namespace {

// transformers' possible_end_lengths: for each occurrence of s's last byte in token t at i, the
// overlap min(i + 1, |s|) when t[i + 1 - overlap, i] is s's tail.
bool end_overlaps(const std::string& t, const std::string& s, std::vector<size_t>& out) {
  out.clear();
  const size_t n = s.size();
  for (size_t i = t.find(s.back()); i != std::string::npos; i = t.find(s.back(), i + 1)) {
    const size_t ov = std::min(i + 1, n);
    if (t.compare(i + 1 - ov, ov, s, n - ov, ov) == 0) out.push_back(ov);
  }
  return !out.empty();
}

// transformers' token_valid_positions: with `pos` bytes of s matched from its end (1 <= pos <
// |s|), token u fits when its last min(|u|, |s| - pos) bytes end where the match stands (u may
// run off s's start; an empty token fits anywhere).
bool fits(const std::string& u, const std::string& s, size_t pos) {
  if (pos < 1 || pos >= s.size()) return false;
  const size_t m = std::min(u.size(), s.size() - pos);
  return u.compare(u.size() - m, m, s, s.size() - pos - m, m) == 0;
}

}  // namespace

StopStrings::StopStrings(std::vector<std::string> stops, std::shared_ptr<const TokenTexts> texts)
    : stops_(std::move(stops)), texts_(std::move(texts)) {
  if (stops_.empty()) throw Error("stop strings: the list is empty");
  if (!texts_ || texts_->empty())
    throw Error("stop strings need a tokenizer (its token texts) to be matched");
  std::vector<size_t> ov;
  for (const std::string& s : stops_) {
    if (s.empty()) throw Error("stop strings: an empty stop string (it would match anything)");
    bool any = false;
    for (const auto& t : *texts_) any = any || (t && end_overlaps(*t, s, ov));
    if (!any)
      throw Error("stop strings: no token of the vocabulary can end \"" + s +
                  "\" (transformers: unable to identify tokens matching it)");
    window_ = std::max(window_, s.size());
  }
}

bool StopStrings::matches_one(const std::string& s, const std::vector<int32_t>& ids) const {
  auto text = [&](int32_t id) -> const std::string* {
    if (id < 0 || static_cast<size_t>(id) >= texts_->size()) return nullptr;
    const auto& t = (*texts_)[static_cast<size_t>(id)];
    return t ? &*t : nullptr;
  };
  const std::string* last = ids.empty() ? nullptr : text(ids.back());
  std::vector<size_t> ov;
  if (!last || !end_overlaps(*last, s, ov)) return false;
  const size_t n = std::min(window_, ids.size());
  for (size_t pos0 : ov) {
    size_t pos = pos0;
    if (pos >= s.size()) return true;
    for (size_t k = 1; k < n; ++k) {
      const std::string* u = text(ids[ids.size() - 1 - k]);
      if (!u || !fits(*u, s, pos)) break;
      pos += u->size();
      if (pos >= s.size()) return true;
    }
  }
  return false;
}

bool StopStrings::matches(const std::vector<int32_t>& ids) const {
  return std::any_of(stops_.begin(), stops_.end(),
                     [&](const std::string& s) { return matches_one(s, ids); });
}

std::shared_ptr<const StopStrings::TokenTexts> stop_token_texts(const Tokenizer& tok) {
  auto out = std::make_shared<StopStrings::TokenTexts>(static_cast<size_t>(tok.vocab_size()));
  const auto* hf = dynamic_cast<const tok::HfTokenizer*>(&tok);
  const bool byte_level = hf && hf->model().byte_level();
  std::vector<int32_t> base = tok.encode("abcdef", false);
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    auto& t = (*out)[static_cast<size_t>(id)];
    const std::string* piece = hf ? hf->model().id_to_token(id) : nullptr;
    if (hf) {
      const std::string bytes = hf->token_bytes(id);
      if (bytes.empty() && !piece) continue;  // not an id of this tokenizer
      if (byte_level) {
        t = bytes;
        continue;
      }
    }
    // Byte-fallback pieces "<0xNN>" are their byte.
    if (piece && piece->size() == 6 && piece->compare(0, 3, "<0x") == 0 && (*piece)[5] == '>' &&
        std::isxdigit(static_cast<unsigned char>((*piece)[3])) &&
        std::isxdigit(static_cast<unsigned char>((*piece)[4]))) {
      t = std::string(1, static_cast<char>(std::stoi(piece->substr(3, 2), nullptr, 16)));
      continue;
    }
    // convert_tokens_to_string(tokens("abcdef") + [token]) after "abcdef" (keeps a leading space).
    std::vector<int32_t> ids = base;
    ids.push_back(id);
    const std::string s = tok.decode(ids, false);
    const size_t at = s.find("abcdef");
    t = at == std::string::npos ? tok.decode({id}, false) : s.substr(at + 6);
  }
  return out;
}

std::vector<std::string> stop_strings_of_folder(const std::string& folder) {
  const std::string path = (std::filesystem::path(folder) / "generation_config.json").string();
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return {};
  const std::string text = read_input(path, "generation_config.json", kMaxJsonInputBytes);
  check_json_depth(text, path);
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) throw Error(path + ": expected a JSON object");
  if (!j.contains("stop_strings") || j["stop_strings"].is_null()) return {};
  const auto& v = j["stop_strings"];
  std::vector<std::string> out;
  if (v.is_string()) out.push_back(v.get<std::string>());
  if (v.is_array())
    for (const auto& e : v) {
      if (!e.is_string())
        throw Error(path + ": stop_strings must be a string or a list of strings");
      out.push_back(e.get<std::string>());
    }
  if (!v.is_string() && !v.is_array())
    throw Error(path + ": stop_strings must be a string or a list of strings");
  for (const auto& s : out)
    if (s.empty()) throw Error(path + ": stop_strings has an empty string");
  return out;
}

}  // namespace ciuic::model
