// HF tokenizer.json decoders: see decoder.h.
#include "tokenizer/decoder.h"

#include <nlohmann/json.hpp>

#include <ciuic/error.h>

#include "tokenizer/bpe.h"
#include "tokenizer/json_parse.h"
#include "tokenizer/utf8.h"

namespace ciuic::tok {

using nlohmann::json;

namespace {

constexpr const char* kSupported =
    "ciuic supports ByteLevel, Replace, ByteFallback, Fuse, Strip, Metaspace and Sequence";

// One Unicode character given as a JSON string (Metaspace's replacement, Strip's content).
std::string one_char(const json& j, const char* key, const std::string& dflt,
                     const std::string& origin, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return dflt;
  if (!it->is_string())
    fail(origin, path + "/" + key, "expected a one-character string, got " + it->dump());
  const std::string s = it->get<std::string>();
  if (s.empty() || utf8::find_invalid(s) != std::string_view::npos ||
      utf8::sequence_length(s, 0) != s.size())
    fail(origin, path + "/" + key, "expected exactly one character, got " + it->dump());
  return s;
}

size_t count(const json& j, const char* key, const std::string& origin, const std::string& path) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return 0;
  if (!it->is_number_unsigned())
    fail(origin, path + "/" + key, "expected a non-negative integer, got " + it->dump());
  return it->get<size_t>();
}

// HF ByteFallback: "<0xXX>" (6 bytes), XX parsed as Rust's u8::from_str_radix(_, 16) does
// (either case; a leading '+' is accepted).
int byte_token(const std::string& t) {
  if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return -1;
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  if (t[3] == '+') return hex(t[4]);
  const int hi = hex(t[3]), lo = hex(t[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

}  // namespace

Decoder::Decoder(const json& j, const std::string& origin, const std::string& path) {
  if (j.is_null()) {
    null_ = true;
    return;
  }
  parse(j, origin, path);
}

Decoder::~Decoder() = default;

void Decoder::parse(const json& j, const std::string& origin, const std::string& path) {
  if (!j.is_object()) fail(origin, path, "expected an object, got " + j.dump());
  auto t = j.find("type");
  if (t == j.end() || !t->is_string()) fail(origin, path + "/type", "missing or not a string");
  const std::string type = t->get<std::string>();
  if (type == "Sequence") {
    auto it = j.find("decoders");
    if (it == j.end() || !it->is_array())
      fail(origin, path + "/decoders", "missing or not an array");
    for (size_t i = 0; i < it->size(); ++i)
      parse((*it)[i], origin, path + "/decoders/" + std::to_string(i));
    return;
  }
  Step s;
  if (type == "ByteLevel") {
    s.kind = Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    s.kind = Kind::kByteFallback;
  } else if (type == "Fuse") {
    s.kind = Kind::kFuse;
  } else if (type == "Replace") {
    s.content = get_string(j, "content", origin, path);
    get_pattern(j, origin, path, &s.pattern, &s.re);
    s.kind = s.re ? Kind::kReplaceRegex : Kind::kReplaceString;
  } else if (type == "Strip") {
    s.kind = Kind::kStrip;
    s.content = one_char(j, "content", " ", origin, path);
    s.start = count(j, "start", origin, path);
    s.stop = count(j, "stop", origin, path);
  } else if (type == "Metaspace") {
    s.kind = Kind::kMetaspace;
    s.content = one_char(j, "replacement", "\xE2\x96\x81", origin, path);
    if (auto ps = j.find("prepend_scheme"); ps != j.end() && !ps->is_null()) {
      if (!ps->is_string() || (*ps != "first" && *ps != "always" && *ps != "never"))
        fail(origin, path + "/prepend_scheme",
             "expected \"first\", \"always\" or \"never\", got " + ps->dump());
      s.drop_first = *ps != "never";
    } else if (auto ap = j.find("add_prefix_space"); ap != j.end() && !ap->is_null()) {
      if (!ap->is_boolean())
        fail(origin, path + "/add_prefix_space", "expected a boolean, got " + ap->dump());
      s.drop_first = ap->get<bool>();
    }
  } else {
    fail(origin, path + "/type", "unsupported decoder \"" + type + "\" (" + kSupported + ")");
  }
  steps_.push_back(std::move(s));
}

void Decoder::run(const Step& step, std::vector<std::string>& tokens) const {
  switch (step.kind) {
    case Kind::kByteLevel: {
      const ByteAlphabet& alphabet = ByteAlphabet::get();
      std::string bytes;
      for (const std::string& t : tokens) {
        std::optional<std::string> b = alphabet.to_bytes(t);
        bytes += b ? *b : t;
      }
      tokens.assign(1, utf8::lossy(bytes));
      return;
    }
    case Kind::kReplaceString:
      for (std::string& t : tokens) {
        size_t at = t.find(step.pattern);
        if (at == std::string::npos) continue;
        std::string out;
        size_t prev = 0;
        while (at != std::string::npos) {
          out.append(t, prev, at - prev);
          out += step.content;
          prev = at + step.pattern.size();
          at = t.find(step.pattern, prev);
        }
        out.append(t, prev, std::string::npos);
        t = std::move(out);
      }
      return;
    case Kind::kReplaceRegex:
      for (std::string& t : tokens) {
        std::string out;
        size_t prev = 0;
        step.re->for_each_match(t, [&](size_t s, size_t e) {
          out.append(t, prev, s - prev);
          out += step.content;
          prev = e;
        });
        out.append(t, prev, std::string::npos);
        t = std::move(out);
      }
      return;
    case Kind::kByteFallback: {
      std::vector<std::string> out;
      out.reserve(tokens.size());
      std::string run;
      size_t run_tokens = 0;
      auto flush = [&] {
        if (run_tokens == 0) return;
        if (utf8::find_invalid(run) == std::string_view::npos) {
          out.push_back(run);
        } else {
          for (size_t i = 0; i < run_tokens; ++i) out.emplace_back("\xEF\xBF\xBD");
        }
        run.clear();
        run_tokens = 0;
      };
      for (std::string& t : tokens) {
        const int b = byte_token(t);
        if (b >= 0) {
          run += static_cast<char>(b);
          ++run_tokens;
        } else {
          flush();
          out.push_back(std::move(t));
        }
      }
      flush();
      tokens = std::move(out);
      return;
    }
    case Kind::kFuse: {
      std::string all;
      for (const std::string& t : tokens) all += t;
      tokens.assign(1, std::move(all));
      return;
    }
    case Kind::kStrip:
      for (std::string& t : tokens) {
        const std::string& c = step.content;
        size_t b = 0, e = t.size();
        for (size_t i = 0; i < step.start && e - b >= c.size() && t.compare(b, c.size(), c) == 0;
             ++i)
          b += c.size();
        // HF panics when the cuts cross (a token shorter than start + stop); here they stop at each
        // other.
        for (size_t i = 0;
             i < step.stop && e - b >= c.size() && t.compare(e - c.size(), c.size(), c) == 0; ++i)
          e -= c.size();
        if (b != 0 || e != t.size()) t = t.substr(b, e - b);
      }
      return;
    case Kind::kMetaspace:
      for (size_t i = 0; i < tokens.size(); ++i) {
        std::string& t = tokens[i];
        const std::string& r = step.content;
        size_t at = t.find(r);
        if (at == std::string::npos) continue;
        const bool drop = i == 0 && step.drop_first;
        std::string out;
        size_t prev = 0;
        while (at != std::string::npos) {
          out.append(t, prev, at - prev);
          if (!drop) out += ' ';
          prev = at + r.size();
          at = t.find(r, prev);
        }
        out.append(t, prev, std::string::npos);
        t = std::move(out);
      }
      return;
  }
}

std::string Decoder::decode(std::vector<std::string> tokens) const {
  if (null_) {
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out += ' ';
      out += tokens[i];
    }
    return out;
  }
  for (const Step& s : steps_) run(s, tokens);
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace ciuic::tok
