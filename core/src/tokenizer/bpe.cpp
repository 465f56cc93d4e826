// Byte-level BPE model: see bpe.h.
#include "tokenizer/bpe.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <limits>
#include <queue>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>

#include "tokenizer/utf8.h"

namespace ciuic::tok {

using nlohmann::json;

// ---- byte alphabet ------------------------------------------------------------------------
ByteAlphabet::ByteAlphabet() {
  std::array<bool, 256> direct{};
  for (int b = '!'; b <= '~'; ++b) direct[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) direct[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) direct[b] = true;
  uint32_t n = 0;
  for (int b = 0; b < 256; ++b) {
    byte_to_cp[b] = direct[b] ? static_cast<uint32_t>(b) : 256 + n++;
    cp_to_byte[byte_to_cp[b]] = static_cast<uint8_t>(b);
  }
}

const ByteAlphabet& ByteAlphabet::get() {
  static const ByteAlphabet alphabet;
  return alphabet;
}

std::optional<std::string> ByteAlphabet::to_bytes(std::string_view token) const {
  std::string out;
  out.reserve(token.size());
  size_t i = 0;
  while (i < token.size()) {
    size_t len = utf8::sequence_length(token, i);
    if (len == 0) return std::nullopt;
    uint32_t cp = utf8::decode(token, i, &len);
    auto it = cp_to_byte.find(cp);
    if (it == cp_to_byte.end()) return std::nullopt;
    out += static_cast<char>(it->second);
    i += len;
  }
  return out;
}

std::string ByteAlphabet::to_token(std::string_view bytes) const {
  std::string out;
  for (unsigned char b : bytes) utf8::append(out, byte_to_cp[b]);
  return out;
}

// ---- FlatMap64 ----------------------------------------------------------------------------
void FlatMap64::reserve(size_t n) {
  size_t cap = 16;
  while (cap < n * 2) cap <<= 1;
  if (cap <= slots_.size()) return;
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  size_ = 0;
  for (const Slot& s : old)
    if (s.key != kEmpty) put(s.key, s.value);
}

void FlatMap64::grow() { reserve(std::max<size_t>(8, size_ * 2 + 2)); }

void FlatMap64::put(uint64_t key, uint64_t value) {
  if (key == kEmpty) throw Error("tokenizer: internal error: reserved merge key");
  if ((size_ + 1) * 2 > slots_.size()) grow();
  size_t i = mix(key) & mask_;
  while (true) {
    Slot& s = slots_[i];
    if (s.key == key) {
      s.value = value;
      return;
    }
    if (s.key == kEmpty) {
      s.key = key;
      s.value = value;
      ++size_;
      return;
    }
    i = (i + 1) & mask_;
  }
}

// ---- PieceCache ---------------------------------------------------------------------------
PieceCache::PieceCache(size_t max_entries) : max_entries_(max_entries) {
  size_t cap = 16;
  while (cap < max_entries * 2) cap <<= 1;
  slots_.resize(cap);
}

uint64_t PieceCache::hash(std::string_view s) {
  // 8 bytes at a time, multiply-xorshift mixing; good enough for a cache (keys are compared).
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ (s.size() * 0xff51afd7ed558ccdULL);
  size_t i = 0;
  for (; i + 8 <= s.size(); i += 8) {
    uint64_t w;
    __builtin_memcpy(&w, s.data() + i, 8);
    h = (h ^ w) * 0xbf58476d1ce4e5b9ULL;
    h ^= h >> 31;
  }
  uint64_t w = 0;
  for (size_t k = 0; i + k < s.size(); ++k)
    w |= static_cast<uint64_t>(static_cast<unsigned char>(s[i + k])) << (8 * k);
  h = (h ^ w) * 0x94d049bb133111ebULL;
  h ^= h >> 29;
  return h ? h : 1;
}

bool PieceCache::find(std::string_view piece, uint64_t h, std::vector<int32_t>& out) const {
  const size_t mask = slots_.size() - 1;
  for (size_t i = h & mask;; i = (i + 1) & mask) {
    const Slot& s = slots_[i];
    if (s.hash == 0) return false;
    if (s.hash == h && s.key_len == piece.size() &&
        std::string_view(keys_.data() + s.key_off, s.key_len) == piece) {
      out.insert(out.end(), ids_.begin() + s.ids_off, ids_.begin() + s.ids_off + s.ids_len);
      return true;
    }
  }
}

void PieceCache::clear() {
  std::fill(slots_.begin(), slots_.end(), Slot{});
  keys_.clear();
  ids_.clear();
  used_ = 0;
}

void PieceCache::insert(std::string_view piece, uint64_t h, const int32_t* ids, size_t n) {
  if (used_ >= max_entries_) clear();
  const size_t mask = slots_.size() - 1;
  size_t i = h & mask;
  while (slots_[i].hash != 0) i = (i + 1) & mask;
  slots_[i] = Slot{h, static_cast<uint32_t>(keys_.size()), static_cast<uint32_t>(piece.size()),
                   static_cast<uint32_t>(ids_.size()), static_cast<uint32_t>(n)};
  keys_.append(piece);
  ids_.insert(ids_.end(), ids, ids + n);
  ++used_;
}

// ---- BpeModel -----------------------------------------------------------------------------
namespace {

[[noreturn]] void fail(const std::string& origin, const std::string& path,
                       const std::string& what) {
  throw Error(origin + ": " + path + ": " + what);
}

// A null, absent or "empty" option is fine; anything else is an unsupported feature.
void require_unset(const json& model, const char* key, const std::string& origin,
                   bool allow_empty_string) {
  auto it = model.find(key);
  if (it == model.end() || it->is_null()) return;
  if (allow_empty_string && it->is_string() && it->get_ref<const std::string&>().empty()) return;
  fail(origin, std::string("/model/") + key,
       "unsupported BPE option (ciuic supports byte-level BPE without it): " + it->dump());
}

}  // namespace

BpeModel::BpeModel(const json& model, const std::string& origin, bool byte_level)
    : byte_level_(byte_level) {
  if (!model.is_object()) fail(origin, "/model", "expected an object");
  if (auto t = model.find("type"); t != model.end()) {
    if (!t->is_string()) fail(origin, "/model/type", "expected a string");
    if (*t != "BPE")
      fail(origin, "/model/type",
           "unsupported model type \"" + t->get<std::string>() + "\" (ciuic supports \"BPE\")");
  }
  require_unset(model, "continuing_subword_prefix", origin, true);
  require_unset(model, "end_of_word_suffix", origin, true);
  if (auto d = model.find("dropout"); d != model.end() && !d->is_null()) {
    if (!d->is_number() || d->get<double>() != 0.0)
      fail(origin, "/model/dropout",
           "BPE dropout is not supported (encoding must be deterministic): " + d->dump());
  }
  if (auto b = model.find("byte_fallback"); b != model.end() && !b->is_null()) {
    if (!b->is_boolean()) fail(origin, "/model/byte_fallback", "expected a boolean");
    byte_fallback_ = b->get<bool>();
  }
  if (auto f = model.find("fuse_unk"); f != model.end() && !f->is_null()) {
    if (!f->is_boolean()) fail(origin, "/model/fuse_unk", "expected a boolean");
    fuse_unk_ = f->get<bool>();
  }
  if (auto g = model.find("ignore_merges"); g != model.end() && !g->is_null()) {
    if (!g->is_boolean()) fail(origin, "/model/ignore_merges", "expected a boolean");
    ignore_merges_ = g->get<bool>();
  }

  auto v = model.find("vocab");
  if (v == model.end() || !v->is_object())
    fail(origin, "/model/vocab", "missing or not an object (token -> id)");
  const ByteAlphabet& alphabet = ByteAlphabet::get();
  vocab_.reserve(v->size());
  for (auto it = v->begin(); it != v->end(); ++it) {
    if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0 ||
        it.value().get<int64_t>() > std::numeric_limits<int32_t>::max())
      fail(origin, "/model/vocab/" + it.key(),
           "expected a non-negative integer id, got " + it.value().dump());
    int32_t id = it.value().get<int32_t>();
    vocab_.emplace(it.key(), id);
    max_id_ = std::max(max_id_, id);
  }
  // Tables are indexed by id: refuse sparse ids that would make them huge (a corrupt file).
  if (static_cast<size_t>(max_id_) >= vocab_.size() * 4 + 1000000)
    fail(origin, "/model/vocab",
         "the largest id " + std::to_string(max_id_) + " is far beyond the vocabulary size " +
             std::to_string(vocab_.size()) + " (ids must be dense)");
  id_token_.assign(max_id_ + 1, nullptr);
  id_bytes_.assign(max_id_ + 1, std::string());
  id_valid_.assign(max_id_ + 1, 0);
  byte_id_.fill(-1);
  ascii_id_.fill(-1);
  fallback_id_.fill(-1);
  by_bytes_.reserve(vocab_.size());
  for (const auto& [token, id] : vocab_) {
    id_token_[id] = &token;
    id_valid_[id] = 1;
    if (!byte_level_) {  // pieces are looked up as they are
      by_bytes_.emplace(token, id);
      id_bytes_[id] = token;
      size_t len = token.empty() ? 0 : utf8::sequence_length(token, 0);
      if (len != 0 && len == token.size()) {
        const uint32_t cp = utf8::decode(token, 0, &len);
        if (cp < 0x80)
          ascii_id_[cp] = id;
        else
          char_id_.put(cp, static_cast<uint64_t>(id));
      }
      continue;
    }
    std::optional<std::string> bytes = alphabet.to_bytes(token);
    if (bytes) {
      if (bytes->size() == 1) byte_id_[static_cast<unsigned char>((*bytes)[0])] = id;
      by_bytes_.emplace(*bytes, id);
      id_bytes_[id] = std::move(*bytes);
    } else {
      id_bytes_[id] = token;  // HF's ByteLevel decoder passes such tokens through as UTF-8
    }
  }

  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);  // Rust's format!("<{b:#04X}>")
    if (auto it = vocab_.find(name); it != vocab_.end()) fallback_id_[b] = it->second;
  }

  if (auto u = model.find("unk_token"); u != model.end() && !u->is_null()) {
    if (!u->is_string()) fail(origin, "/model/unk_token", "expected a string or null");
    auto it = vocab_.find(u->get<std::string>());
    if (it == vocab_.end())
      fail(origin, "/model/unk_token",
           "unk_token \"" + u->get<std::string>() + "\" is not in the vocabulary");
    unk_id_ = it->second;
  }

  auto m = model.find("merges");
  if (m == model.end() || !m->is_array()) fail(origin, "/model/merges", "missing or not an array");
  merges_.reserve(m->size());
  uint32_t rank = 0;
  for (const json& entry : *m) {
    std::string path = "/model/merges/" + std::to_string(rank);
    std::string a, b;
    if (entry.is_string()) {
      const std::string& s = entry.get_ref<const std::string&>();
      size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        fail(origin, path,
             "a merge written as a string must be two tokens separated by one space: " +
                 entry.dump());
      a = s.substr(0, sp);
      b = s.substr(sp + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
               entry[1].is_string()) {
      a = entry[0].get<std::string>();
      b = entry[1].get<std::string>();
    } else {
      fail(origin, path, "expected \"a b\" or [\"a\", \"b\"], got " + entry.dump());
    }
    auto ia = vocab_.find(a), ib = vocab_.find(b), ic = vocab_.find(a + b);
    if (ia == vocab_.end())
      fail(origin, path, "merge token \"" + a + "\" is not in the vocabulary");
    if (ib == vocab_.end())
      fail(origin, path, "merge token \"" + b + "\" is not in the vocabulary");
    if (ic == vocab_.end())
      fail(origin, path, "merged token \"" + a + b + "\" is not in the vocabulary");
    // Like HF (a hash map filled in order), a repeated pair keeps its last rank.
    if (!byte_level_ && !a.empty() && !b.empty()) {
      // The boundary between the last character of `a` and the first of `b` can be merged across.
      size_t k = a.size() - 1;
      while (k > 0 && (static_cast<unsigned char>(a[k]) & 0xC0) == 0x80) --k;
      size_t la, lb;
      const uint64_t last = utf8::valid_at(a, k) ? utf8::decode(a, k, &la) : 0xFFFFFFFFu;
      const uint64_t first = utf8::valid_at(b, 0) ? utf8::decode(b, 0, &lb) : 0xFFFFFFFFu;
      crossable_.put((last << 32) | first, 1);
      if ((last | first) < 0x80) ascii_crossable_[last * 0x80 + first] = 1;
    }
    merges_.put((static_cast<uint64_t>(static_cast<uint32_t>(ia->second)) << 32) |
                    static_cast<uint32_t>(ib->second),
                (static_cast<uint64_t>(rank) << 32) | static_cast<uint32_t>(ic->second));
    ++rank;
  }
  static std::atomic<uint64_t> next_instance{1};
  instance_id_ = next_instance.fetch_add(1);
}

PieceCache& BpeModel::thread_cache() const {
  struct Entry {
    uint64_t model;
    std::unique_ptr<PieceCache> cache;
  };
  static thread_local std::vector<Entry> caches;
  for (Entry& e : caches)
    if (e.model == instance_id_) return *e.cache;
  if (caches.size() >= 8) caches.erase(caches.begin());  // least recently created
  caches.push_back(Entry{instance_id_, std::make_unique<PieceCache>(kCacheEntries)});
  return *caches.back().cache;
}

bool BpeModel::token_lengths(std::string_view piece, const int32_t* ids, size_t n,
                             std::vector<size_t>& lens) const {
  size_t pos = 0;
  // A character the model has no symbol for (neither in the vocabulary nor byte-fallback-able).
  auto missing_at = [&](size_t at, size_t* len) {
    if (byte_level_) {
      *len = 1;
      return byte_id_[static_cast<unsigned char>(piece[at])] < 0;
    }
    *len = utf8::sequence_length(piece, at);
    if (*len == 0) *len = 1;
    if (char_id(piece, at, *len) >= 0) return false;
    if (!byte_fallback_) return true;
    for (size_t k = 0; k < *len; ++k)
      if (fallback_id_[static_cast<unsigned char>(piece[at + k])] < 0) return true;
    return false;
  };
  for (size_t t = 0; t < n; ++t) {
    const int32_t id = ids[t];
    if (id < 0 || id > max_id_ || !id_valid_[id]) return false;
    const std::string& bytes = id_bytes_[id];
    if (!bytes.empty() && piece.compare(pos, bytes.size(), bytes) == 0 &&
        !(unk_id_ && id == *unk_id_)) {
      lens.push_back(bytes.size());
      pos += bytes.size();
      continue;
    }
    bool is_fallback = false;
    for (int b = 0; b < 256 && !is_fallback; ++b) is_fallback = fallback_id_[b] == id;
    if (is_fallback && pos < piece.size() &&
        fallback_id_[static_cast<unsigned char>(piece[pos])] == id) {
      lens.push_back(1);
      ++pos;
      continue;
    }
    if (unk_id_ && id == *unk_id_ && pos < piece.size()) {
      size_t len, end = pos;
      if (!missing_at(end, &len)) return false;
      end += len;
      while (fuse_unk_ && end < piece.size() && missing_at(end, &len)) end += len;
      lens.push_back(end - pos);
      pos = end;
      continue;
    }
    return false;
  }
  return pos == piece.size();
}

std::optional<int32_t> BpeModel::token_to_id(std::string_view token) const {
  auto it = vocab_.find(std::string(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || id > max_id_ || !id_valid_[id]) return nullptr;
  return id_token_[id];
}

const std::string* BpeModel::id_to_bytes(int32_t id) const {
  if (id < 0 || id > max_id_ || !id_valid_[id]) return nullptr;
  return &id_bytes_[id];
}

void BpeModel::merge_short(std::vector<int32_t>& s) const {
  constexpr uint64_t kNone = ~0ULL;
  uint64_t pr[kShortWord];  // rank << 32 | new id of pair (s[j], s[j+1])
  size_t n = s.size();
  auto pair_at = [&](size_t j) -> uint64_t {
    const uint64_t* m = find_merge(s[j], s[j + 1]);
    return m ? *m : kNone;
  };
  for (size_t j = 0; j + 1 < n; ++j) pr[j] = pair_at(j);
  while (n > 1) {
    size_t best = 0;
    uint64_t best_rank = kNone;
    for (size_t j = 0; j + 1 < n; ++j) {
      // Compare ranks only (high half): the leftmost pair wins ties.
      if ((pr[j] >> 32) < (best_rank >> 32)) {
        best_rank = pr[j];
        best = j;
      }
    }
    if (best_rank == kNone) break;
    s[best] = static_cast<int32_t>(best_rank & 0xffffffffu);
    s.erase(s.begin() + best + 1);
    if (best + 2 < n) std::copy(pr + best + 2, pr + n - 1, pr + best + 1);
    --n;
    if (best > 0) pr[best - 1] = pair_at(best - 1);
    if (best + 1 < n) pr[best] = pair_at(best);
  }
}

void BpeModel::merge_long(std::vector<int32_t>& s) const {
  // HF's Word::merge_all: a min-heap on (rank, position) over a doubly linked list of symbols.
  struct Sym {
    int32_t id;
    int64_t prev, next;
    bool alive;
  };
  struct Cand {
    uint32_t rank;
    size_t pos;
    int32_t new_id;
    bool operator<(const Cand& o) const {  // priority_queue is a max-heap: invert
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  const size_t n = s.size();
  thread_local std::vector<Sym> sym;
  thread_local std::vector<Cand> heap_storage;
  sym.resize(n);
  for (size_t i = 0; i < n; ++i)
    sym[i] =
        Sym{s[i], static_cast<int64_t>(i) - 1, i + 1 < n ? static_cast<int64_t>(i + 1) : -1, true};
  heap_storage.clear();
  std::priority_queue<Cand> queue(std::less<Cand>(), std::move(heap_storage));
  for (size_t i = 0; i + 1 < n; ++i)
    if (const uint64_t* m = find_merge(s[i], s[i + 1]))
      queue.push(Cand{static_cast<uint32_t>(*m >> 32), i, static_cast<int32_t>(*m & 0xffffffffu)});
  while (!queue.empty()) {
    Cand top = queue.top();
    queue.pop();
    Sym& cur = sym[top.pos];
    if (!cur.alive || cur.next < 0) continue;
    size_t next_pos = static_cast<size_t>(cur.next);
    const uint64_t* m = find_merge(cur.id, sym[next_pos].id);
    if (!m || static_cast<int32_t>(*m & 0xffffffffu) != top.new_id) continue;  // stale entry
    cur.id = top.new_id;
    cur.next = sym[next_pos].next;
    sym[next_pos].alive = false;
    if (cur.next >= 0) sym[cur.next].prev = static_cast<int64_t>(top.pos);
    if (cur.prev >= 0)
      if (const uint64_t* pm = find_merge(sym[cur.prev].id, cur.id))
        queue.push(Cand{static_cast<uint32_t>(*pm >> 32), static_cast<size_t>(cur.prev),
                        static_cast<int32_t>(*pm & 0xffffffffu)});
    if (cur.next >= 0)
      if (const uint64_t* nm = find_merge(cur.id, sym[cur.next].id))
        queue.push(Cand{static_cast<uint32_t>(*nm >> 32), top.pos,
                        static_cast<int32_t>(*nm & 0xffffffffu)});
  }
  s.clear();
  for (size_t i = 0; i < n; ++i)
    if (sym[i].alive) s.push_back(sym[i].id);
  // Keep the heap's buffer for the next call (priority_queue exposes it only to subclasses).
  struct Access : std::priority_queue<Cand> {
    static std::vector<Cand>&& take(std::priority_queue<Cand>& q) {
      return std::move(q.*&Access::c);
    }
  };
  heap_storage = Access::take(queue);
}

int32_t BpeModel::char_id(std::string_view piece, size_t i, size_t len) const {
  const auto c = static_cast<unsigned char>(piece[i]);
  if (c < 0x80) return ascii_id_[c];
  size_t l;
  const uint64_t* id = char_id_.find(utf8::decode(piece, i, &l));
  return id ? static_cast<int32_t>(*id) : -1;
}

void BpeModel::initial_symbols(std::string_view piece, std::vector<int32_t>& syms) const {
  // HF merge_word: one symbol per character of the piece (byte-level: per byte, each byte being
  // one character of the byte alphabet). A character missing from the vocabulary becomes its
  // "<0xXX>" bytes (byte_fallback, when every one exists) or unk_token (fused when fuse_unk)
  // or, without unk_token, is dropped -- all as HF does, including HF's order: a pending unk is
  // only written when the next vocabulary character (or the end) comes, after any byte tokens.
  bool pending_unk = false;
  auto missing = [&](std::string_view utf8_of_char) {
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char b : utf8_of_char) all &= fallback_id_[b] >= 0;
      if (all) {
        for (unsigned char b : utf8_of_char) syms.push_back(fallback_id_[b]);
        return;
      }
    }
    if (unk_id_) {
      if (pending_unk && !fuse_unk_) syms.push_back(*unk_id_);
      pending_unk = true;
    }
  };
  auto found = [&](int32_t id) {
    if (pending_unk) {
      syms.push_back(*unk_id_);
      pending_unk = false;
    }
    syms.push_back(id);
  };
  if (byte_level_) {
    const ByteAlphabet& alphabet = ByteAlphabet::get();
    for (unsigned char b : piece) {
      const int32_t id = byte_id_[b];
      if (id >= 0) {
        found(id);
      } else {
        std::string ch;
        utf8::append(ch, alphabet.byte_to_cp[b]);
        missing(ch);
      }
    }
  } else {
    for (size_t i = 0; i < piece.size();) {
      size_t len = utf8::sequence_length(piece, i);
      if (len == 0) len = 1;  // not reached: the text is valid UTF-8
      const int32_t id = char_id(piece, i, len);
      if (id >= 0)
        found(id);
      else
        missing(piece.substr(i, len));
      i += len;
    }
  }
  if (pending_unk) syms.push_back(*unk_id_);
}

void BpeModel::encode_uncached(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.empty()) return;
  if (ignore_merges_) {
    auto it = by_bytes_.find(std::string(piece));
    if (it != by_bytes_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  thread_local std::vector<int32_t> syms;
  syms.clear();
  initial_symbols(piece, syms);
  if (syms.size() <= kShortWord) {
    merge_short(syms);
  } else {
    merge_long(syms);
  }
  out.insert(out.end(), syms.begin(), syms.end());
}

void BpeModel::encode_split(std::string_view piece, std::vector<int32_t>& out,
                            PieceCache& cache) const {
  // Merges never join two symbols whose characters meet at a boundary that no merge spans (no
  // merge (L, R) with L ending in the left character and R starting with the right one), and the
  // merges on either side of it do not interact (each applies to adjacent symbols of one side;
  // their order by (rank, position) is the same on each side alone). So a long piece -- a whole
  // stretch of text for Llama-2's and Gemma's layouts, which have no splitting pre-tokenizer -- is
  // cut at such boundaries between two vocabulary characters (unk and byte-fallback characters
  // are never cut around: fuse_unk joins them) and the parts go through the merge cache. The ids
  // are those of the whole piece. Not with ignore_merges, where the whole piece is looked up.
  size_t start = 0, i = 0;
  uint32_t prev = 0;
  bool prev_found = false;
  const auto* d = reinterpret_cast<const unsigned char*>(piece.data());
  while (i < piece.size()) {
    uint32_t cp;
    size_t len;
    bool found;
    if (d[i] < 0x80) {
      cp = d[i];
      len = 1;
      found = ascii_id_[cp] >= 0;
    } else {
      len = utf8::sequence_length(piece, i);
      if (len == 0) len = 1;
      size_t l;
      cp = utf8::decode(piece, i, &l);
      found = char_id_.find(cp) != nullptr;
    }
    if (found && prev_found && i > start) {
      const bool cross = (prev | cp) < 0x80
                             ? ascii_crossable_[prev * 0x80 + cp]
                             : crossable_.find((static_cast<uint64_t>(prev) << 32) | cp) != nullptr;
      if (!cross) {
        encode(piece.substr(start, i - start), out, cache);
        start = i;
      }
    }
    prev = cp;
    prev_found = found;
    i += len;
  }
  const std::string_view rest = piece.substr(start);
  if (rest.size() == piece.size())
    encode_uncached(rest, out);
  else
    encode(rest, out, cache);
}

void BpeModel::encode(std::string_view piece, std::vector<int32_t>& out, PieceCache& cache) const {
  if (piece.size() > kMaxCachedLen || piece.empty()) {
    if (!byte_level_ && !ignore_merges_ && !piece.empty())
      encode_split(piece, out, cache);
    else
      encode_uncached(piece, out);
    return;
  }
  uint64_t h = PieceCache::hash(piece);
  if (cache.find(piece, h, out)) return;
  size_t before = out.size();
  encode_uncached(piece, out);
  cache.insert(piece, h, out.data() + before, out.size() - before);
}

}  // namespace ciuic::tok
