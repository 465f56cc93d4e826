// HF tokenizer.json normalizers: see normalizer.h.
#include "tokenizer/normalizer.h"

#include <unicode/bytestream.h>
#include <unicode/edits.h>
#include <unicode/normalizer2.h>
#include <unicode/stringpiece.h>
#include <unicode/uchar.h>

#include <algorithm>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>

#include "tokenizer/json_parse.h"
#include "tokenizer/utf8.h"

namespace ciuic::tok {

using nlohmann::json;

namespace {

constexpr const char* kSupported =
    "ciuic supports NFC, NFD, NFKC, NFKD, Lowercase, Strip, Prepend, Replace and Sequence";

bool all_ascii(std::string_view s) {
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    __builtin_memcpy(&w, s.data() + i, 8);
    if (w & 0x8080808080808080ULL) return false;
  }
  for (; i < s.size(); ++i)
    if (static_cast<unsigned char>(s[i]) >= 0x80) return false;
  return true;
}

const icu::Normalizer2* icu_instance(const std::string& type, const std::string& origin,
                                     const std::string& path) {
  UErrorCode st = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  if (type == "NFC")
    n = icu::Normalizer2::getNFCInstance(st);
  else if (type == "NFD")
    n = icu::Normalizer2::getNFDInstance(st);
  else if (type == "NFKC")
    n = icu::Normalizer2::getNFKCInstance(st);
  else
    n = icu::Normalizer2::getNFKDInstance(st);
  if (U_FAILURE(st) || n == nullptr)
    fail(origin, path, "ICU could not provide the " + type + " normalizer: " + u_errorName(st));
  return n;
}

}  // namespace

Normalizer::Normalizer(const json& j, const std::string& origin, const std::string& path)
    : origin_(origin) {
  parse(j, origin, path);
}

Normalizer::~Normalizer() = default;

void Normalizer::parse(const json& j, const std::string& origin, const std::string& path) {
  if (j.is_null()) return;
  if (!j.is_object()) fail(origin, path, "expected an object, got " + j.dump());
  auto t = j.find("type");
  if (t == j.end() || !t->is_string()) fail(origin, path + "/type", "missing or not a string");
  const std::string type = t->get<std::string>();
  if (type == "Sequence") {
    auto it = j.find("normalizers");
    if (it == j.end() || !it->is_array())
      fail(origin, path + "/normalizers", "missing or not an array");
    for (size_t i = 0; i < it->size(); ++i)
      parse((*it)[i], origin, path + "/normalizers/" + std::to_string(i));
    return;
  }
  Op op;
  if (type == "NFC" || type == "NFD" || type == "NFKC" || type == "NFKD") {
    op.kind = type == "NFC"    ? Kind::kNfc
              : type == "NFD"  ? Kind::kNfd
              : type == "NFKC" ? Kind::kNfkc
                               : Kind::kNfkd;
    op.icu = icu_instance(type, origin, path);
  } else if (type == "Lowercase") {
    op.kind = Kind::kLowercase;
  } else if (type == "Strip") {
    op.kind = Kind::kStrip;
    op.left = get_bool(j, "strip_left", true, origin, path);
    op.right = get_bool(j, "strip_right", true, origin, path);
  } else if (type == "Prepend") {
    op.kind = Kind::kPrepend;
    op.text = get_string(j, "prepend", origin, path);
    if (utf8::find_invalid(op.text) != std::string_view::npos)
      fail(origin, path + "/prepend", "not valid UTF-8");
  } else if (type == "Replace") {
    op.content = get_string(j, "content", origin, path);
    get_pattern(j, origin, path, &op.text, &op.re);
    op.kind = op.re ? Kind::kReplaceRegex : Kind::kReplaceString;
  } else if (type == "Precompiled") {
    fail(origin, path + "/type",
         "unsupported normalizer \"Precompiled\" (SentencePiece's compiled character map; " +
             std::string(kSupported) +
             ": convert the model with transformers' LlamaConverter / GemmaConverter layouts, "
             "which have none)");
  } else {
    fail(origin, path + "/type", "unsupported normalizer \"" + type + "\" (" + kSupported + ")");
  }
  ops_.push_back(std::move(op));
}

bool Normalizer::icu_normalize(const Op& op, std::string_view in, std::string& out,
                               void* edits) const {
  if (all_ascii(in)) return false;  // ASCII is invariant under every normalization form
  const auto* n = static_cast<const icu::Normalizer2*>(op.icu);
  UErrorCode st = U_ZERO_ERROR;
  const icu::StringPiece sp(in.data(), static_cast<int32_t>(in.size()));
  if (n->isNormalizedUTF8(sp, st) && U_SUCCESS(st)) return false;
  st = U_ZERO_ERROR;
  out.clear();
  icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(in.size() + 16));
  n->normalizeUTF8(0, sp, sink, static_cast<icu::Edits*>(edits), st);
  if (U_FAILURE(st))
    throw Error("tokenizer (" + origin_ + "): ICU normalization failed: " + u_errorName(st));
  return true;
}

bool Normalizer::apply(const Op& op, std::string_view in, std::string& out,
                       MatchScratch& scratch) const {
  switch (op.kind) {
    case Kind::kNfc:
    case Kind::kNfd:
    case Kind::kNfkc:
    case Kind::kNfkd: {
      return icu_normalize(op, in, out, nullptr);
    }
    case Kind::kLowercase: {
      bool changed = false;
      out.clear();
      out.reserve(in.size());
      size_t i = 0;
      while (i < in.size()) {
        const unsigned char c = static_cast<unsigned char>(in[i]);
        if (c < 0x80) {
          const char l = (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : static_cast<char>(c);
          changed |= l != static_cast<char>(c);
          out += l;
          ++i;
          continue;
        }
        size_t len;
        const uint32_t cp = utf8::decode(in, i, &len);
        if (cp == 0x130) {  // Rust: 'İ'.to_lowercase() == "i\u{307}"
          out += "i\xCC\x87";
          changed = true;
        } else {
          const uint32_t l = static_cast<uint32_t>(u_tolower(static_cast<UChar32>(cp)));
          changed |= l != cp;
          utf8::append(out, l);
        }
        i += len;
      }
      return changed;
    }
    case Kind::kStrip: {
      size_t b = 0, e = in.size();
      if (op.left) {
        while (b < e) {
          size_t len;
          if (!utf8::is_white_space(utf8::decode(in, b, &len))) break;
          b += len;
        }
      }
      if (op.right) {
        while (e > b) {
          size_t k = e - 1;
          while (k > b && (static_cast<unsigned char>(in[k]) & 0xC0) == 0x80) --k;
          size_t len;
          if (!utf8::is_white_space(utf8::decode(in, k, &len))) break;
          e = k;
        }
      }
      if (b == 0 && e == in.size()) return false;
      out.assign(in.substr(b, e - b));
      return true;
    }
    case Kind::kPrepend:
      if (in.empty() || op.text.empty()) return false;
      out.assign(op.text);
      out.append(in);
      return true;
    case Kind::kReplaceString: {
      size_t at = in.find(op.text);
      if (at == std::string_view::npos) return false;
      out.clear();
      out.reserve(in.size() + 16);
      size_t prev = 0;
      while (at != std::string_view::npos) {
        out.append(in.substr(prev, at - prev));
        out.append(op.content);
        prev = at + op.text.size();
        at = in.find(op.text, prev);
      }
      out.append(in.substr(prev));
      return true;
    }
    case Kind::kReplaceRegex: {
      if (in.empty()) return false;  // HF's find_matches reports no match in an empty string
      bool any = false;
      size_t prev = 0;
      out.clear();
      op.re->for_each_match(
          in,
          [&](size_t s, size_t e) {
            out.append(in.substr(prev, s - prev));
            out.append(op.content);
            prev = e;
            any = true;
          },
          scratch);
      if (!any) return false;
      out.append(in.substr(prev));
      return true;
    }
  }
  return false;
}

std::string_view Normalizer::normalize(std::string_view in, std::string& a, std::string& b,
                                       MatchScratch& scratch) const {
  std::string_view cur = in;
  std::string* bufs[2] = {&a, &b};
  int next = 0;  // the buffer the next changed result goes to (never the one `cur` views)
  for (const Op& op : ops_) {
    std::string& out = *bufs[next];
    if (apply(op, cur, out, scratch)) {
      cur = out;
      next ^= 1;
    }
  }
  return cur;
}

namespace {

// The decomposed characters `decomposed` (expansion[o] of them from input character o) put in
// canonical order (stable sort of every run of non-starters by combining class) give `expected`:
// then source[j] is the input character output character j aligns to under HF's rule, where a
// character keeps the "inserted" flag of its place in the decomposition when it moves, one not
// inserted aligns to the next input character not yet consumed, an inserted one to the last
// consumed. False when the reordering does not give `expected`.
bool canonical_order_alignment(std::string_view decomposed, const std::vector<size_t>& expansion,
                               std::string_view expected, std::vector<size_t>& source) {
  struct Item {
    uint32_t cp;
    bool inserted;
    uint8_t ccc;
  };
  std::vector<Item> items;
  size_t o = 0, k = 0;
  for (size_t i = 0; i < decomposed.size();) {
    size_t len;
    const uint32_t cp = utf8::decode(decomposed, i, &len);
    while (o < expansion.size() && k == expansion[o]) ++o, k = 0;
    items.push_back(
        Item{cp, k > 0, static_cast<uint8_t>(u_getCombiningClass(static_cast<UChar32>(cp)))});
    ++k;
    i += len;
  }
  for (size_t i = 0; i < items.size();) {
    size_t j = i;
    while (j < items.size() && items[j].ccc != 0) ++j;
    if (j > i)
      std::stable_sort(items.begin() + i, items.begin() + j,
                       [](const Item& a, const Item& b) { return a.ccc < b.ccc; });
    i = j == i ? i + 1 : j;
  }
  std::string text;
  for (const Item& it : items) utf8::append(text, it.cp);
  if (text != expected || items.size() != source.size()) return false;
  size_t next = 0;
  for (size_t j = 0; j < items.size(); ++j) {
    if (items[j].inserted) {
      source[j] = next == 0 ? 0 : next - 1;
    } else {
      source[j] = std::min(next, expansion.size() - 1);
      ++next;
    }
  }
  return true;
}

// `n` output bytes, all from input bytes `span`.
void spans_for_bytes(size_t n, std::pair<uint32_t, uint32_t> span, Normalizer::Alignment& map) {
  for (size_t k = 0; k < n; ++k) map.push_back(span);
}

// Each byte of `s` mapped to the span of the character it belongs to, offset by `base`.
void char_spans(std::string_view s, uint32_t base, Normalizer::Alignment& map) {
  for (size_t i = 0; i < s.size();) {
    size_t len = utf8::sequence_length(s, i);
    if (len == 0) len = 1;
    for (size_t k = 0; k < len; ++k)
      map.emplace_back(base + static_cast<uint32_t>(i), base + static_cast<uint32_t>(i + len));
    i += len;
  }
}

}  // namespace

void Normalizer::align_changed(const Op& op, std::string_view old_text, uint32_t base,
                               std::string_view new_text, Alignment& map) const {
  // HF (unicode-normalization-alignments) aligns output characters positionally: one that
  // stands for input characters aligns to the first of them and consumes them all (a composed
  // "ä" from "a" + U+0308), one a decomposition inserts aligns to the character it comes from.
  // ICU reports changed stretches, not characters: when every input character normalized alone
  // gives the stretch, each output character maps to its own; otherwise (composition,
  // reordering) the first output character maps to the first input one and the others to the
  // input characters at the same distance from the end.
  std::vector<std::pair<uint32_t, uint32_t>> olds;  // input characters: [start, end)
  for (size_t i = 0; i < old_text.size();) {
    size_t len = utf8::sequence_length(old_text, i);
    if (len == 0) len = 1;
    olds.emplace_back(base + static_cast<uint32_t>(i), base + static_cast<uint32_t>(i + len));
    i += len;
  }
  std::vector<size_t> news;  // output characters: byte lengths
  for (size_t i = 0; i < new_text.size();) {
    size_t len = utf8::sequence_length(new_text, i);
    if (len == 0) len = 1;
    news.push_back(len);
    i += len;
  }
  std::vector<size_t> source(news.size(), 0);
  std::string together;
  std::vector<size_t> expansion;
  for (const auto& [b, e] : olds) {
    const std::string_view ch = old_text.substr(b - base, e - b);
    std::string one;
    if (!icu_normalize(op, ch, one, nullptr)) one.assign(ch);
    together += one;
    size_t chars = 0;
    for (size_t i = 0; i < one.size(); ++i)
      chars += (static_cast<unsigned char>(one[i]) & 0xC0) != 0x80;
    expansion.push_back(chars);
  }
  if (together == new_text) {
    size_t j = 0;
    for (size_t o = 0; o < olds.size(); ++o)
      for (size_t k = 0; k < expansion[o] && j < news.size(); ++k) source[j++] = o;
  } else if ((op.kind == Kind::kNfd || op.kind == Kind::kNfkd) &&
             canonical_order_alignment(together, expansion, new_text, source)) {
    // Decomposition then canonical reordering: HF's crate moves each character with its
    // "inserted" mark, and aligns positionally (see canonical_order_alignment).
  } else {
    const size_t n = olds.size(), m = news.size();
    for (size_t j = 0; j < m; ++j)
      source[j] = j == 0 ? 0 : std::min(n - 1, m <= n ? j + (n - m) : j);
  }
  for (size_t j = 0; j < news.size(); ++j) spans_for_bytes(news[j], olds[source[j]], map);
}

bool Normalizer::apply_aligned(const Op& op, std::string_view in, std::string& out,
                               Alignment& map) const {
  map.clear();
  auto spans_for = [&](size_t out_bytes, uint32_t b, uint32_t e) {
    for (size_t k = 0; k < out_bytes; ++k) map.emplace_back(b, e);
  };
  switch (op.kind) {
    case Kind::kNfc:
    case Kind::kNfd:
    case Kind::kNfkc:
    case Kind::kNfkd: {
      icu::Edits edits;
      if (!icu_normalize(op, in, out, &edits)) return false;
      UErrorCode st = U_ZERO_ERROR;
      icu::Edits::Iterator it = edits.getFineIterator();
      while (it.next(st)) {
        const auto src = static_cast<uint32_t>(it.sourceIndex());
        const auto old_len = static_cast<uint32_t>(it.oldLength());
        if (it.hasChange()) {
          align_changed(op, in.substr(src, old_len), src,
                        std::string_view(out).substr(static_cast<size_t>(it.destinationIndex()),
                                                     static_cast<size_t>(it.newLength())),
                        map);
        } else {
          char_spans(in.substr(src, old_len), src, map);
        }
      }
      return true;
    }
    case Kind::kPrepend: {
      if (!apply(op, in, out, MatchScratch::local())) return false;
      const size_t first = utf8::sequence_length(in, 0);
      spans_for(op.text.size(), 0, static_cast<uint32_t>(first ? first : 1));
      char_spans(in, 0, map);
      return true;
    }
    case Kind::kStrip: {
      size_t b = 0;
      if (!apply(op, in, out, MatchScratch::local())) return false;
      if (op.left)
        b = in.find(
            out);  // the kept text is a substring; its first occurrence after the stripped prefix
      if (b == std::string_view::npos) b = 0;
      char_spans(out, static_cast<uint32_t>(b), map);
      return true;
    }
    case Kind::kLowercase: {
      if (!apply(op, in, out, MatchScratch::local())) return false;
      for (size_t i = 0; i < in.size();) {
        size_t len;
        const uint32_t cp = utf8::decode(in, i, &len);
        std::string one;
        if (cp == 0x130)
          one = "i\xCC\x87";
        else if (cp < 0x80)
          one = std::string(
              1, (cp >= 'A' && cp <= 'Z') ? static_cast<char>(cp + 32) : static_cast<char>(cp));
        else
          utf8::append(one, static_cast<uint32_t>(u_tolower(static_cast<UChar32>(cp))));
        spans_for(one.size(), static_cast<uint32_t>(i), static_cast<uint32_t>(i + len));
        i += len;
      }
      return true;
    }
    case Kind::kReplaceString:
    case Kind::kReplaceRegex: {
      std::vector<std::pair<size_t, size_t>> matches;
      if (op.kind == Kind::kReplaceString) {
        for (size_t at = in.find(op.text); at != std::string_view::npos;
             at = in.find(op.text, at + op.text.size()))
          matches.emplace_back(at, at + op.text.size());
      } else if (!in.empty()) {
        op.re->for_each_match(in, [&](size_t b, size_t e) { matches.emplace_back(b, e); });
      }
      if (matches.empty()) return false;
      out.clear();
      size_t prev = 0;
      for (const auto& [b, e] : matches) {
        out.append(in.substr(prev, b - prev));
        char_spans(in.substr(prev, b - prev), static_cast<uint32_t>(prev), map);
        out.append(op.content);
        // HF: the replacement aligns to the last character of the match ((0, 0) for an empty
        // match at the start).
        size_t k = e == 0 ? 0 : e - 1;
        while (k > 0 && (static_cast<unsigned char>(in[k]) & 0xC0) == 0x80) --k;
        const size_t klen = e == 0 ? 0 : utf8::sequence_length(in, k);
        spans_for(op.content.size(), static_cast<uint32_t>(k), static_cast<uint32_t>(k + klen));
        prev = e;
      }
      out.append(in.substr(prev));
      char_spans(in.substr(prev), static_cast<uint32_t>(prev), map);
      return true;
    }
  }
  return false;
}

std::string Normalizer::normalize_aligned(std::string_view in, Alignment& align) const {
  std::string cur(in);
  align.clear();
  char_spans(in, 0, align);
  std::string out;
  Alignment map, composed;
  for (const Op& op : ops_) {
    if (!apply_aligned(op, cur, out, map)) continue;
    composed.clear();
    composed.reserve(map.size());
    for (const auto& [b, e] : map) {
      // Input bytes [b, e) of this step -> the original bytes of the first and last of them (an
      // empty span, an insertion, takes the position it is inserted at).
      if (b < e)
        composed.emplace_back(align[b].first, align[e - 1].second);
      else if (b < align.size())
        composed.emplace_back(align[b].first, align[b].first);
      else
        composed.emplace_back(align.empty() ? 0 : align.back().second,
                              align.empty() ? 0 : align.back().second);
    }
    align.swap(composed);
    cur.swap(out);
  }
  return cur;
}

std::string Normalizer::normalize(std::string_view in) const {
  std::string a, b;
  return std::string(normalize(in, a, b, MatchScratch::local()));
}

}  // namespace ciuic::tok
