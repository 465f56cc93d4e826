#include "cache.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <random>
#include <thread>

#include <ciuic/error.h>
#include <ciuic/json.h>
#include <ciuic/log.h>

#include "hash64.h"

namespace ciuic::data {
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

constexpr char kShardMagic[8] = {'C', 'I', 'U', 'I', 'C', 'T', 'O', 'K'};
constexpr char kIndexMagic[8] = {'C', 'I', 'U', 'I', 'C', 'I', 'D', 'X'};
constexpr size_t kHeaderBytes = 64;
constexpr size_t kBlockBytes = 1 << 20;  // tokenization work unit (whole lines)

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

std::string mb(uint64_t bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MB", bytes / 1e6);
  return b;
}

uint64_t hash_file(const std::string& path, uint64_t* bytes) {
  MappedFile f(path);
  f.advise_sequential();
  *bytes = f.size();
  return xxh64(f.data(), f.size());
}

// Encodings of fixed probes: a tokenizer or template whose behaviour changed gets a new key even
// when its fingerprint (or name) did not.
std::string probe_hash(const DocumentSettings& d) {
  Hash64 h;
  if (d.tokenizer) {
    auto ids = d.tokenizer->encode("Hello, world! 12345 \xc3\xa9t\xc3\xa9\n\tThe end.", true);
    h.update(ids.data(), ids.size() * sizeof(int32_t));
    h.update_pod(d.tokenizer->bos_id().value_or(-1));
    h.update_pod(d.tokenizer->eos_id().value_or(-1));
    h.update_pod(d.tokenizer->vocab_size());
  }
  if (d.format == Format::kChat && d.chat_template) {
    std::vector<ChatMessage> conv{{"system", "Be brief."},
                                  {"user", "What is 2 + 2?"},
                                  {"assistant", "4"},
                                  {"user", "And 3 + 3?"},
                                  {"assistant", "6"}};
    for (bool assistant_only : {false, true}) {
      EncodedChat e = d.chat_template->encode(conv, assistant_only);
      h.update(e.ids.data(), e.ids.size() * sizeof(int32_t));
      h.update(e.loss_mask.data(), e.loss_mask.size());
    }
  }
  return hex64(h.digest());
}

// ---- progress -------------------------------------------------------------------------------
class Progress {
 public:
  Progress(bool enabled, uint64_t total) : enabled_(enabled), total_(total), tty_(isatty(2)) {}
  void update(uint64_t done, uint64_t docs) {
    if (!enabled_) return;
    auto now = Clock::now();
    double since = std::chrono::duration<double>(now - last_).count();
    if (since < (tty_ ? 0.2 : 10.0)) return;
    last_ = now;
    print(done, docs, false);
  }
  void finish(uint64_t docs) {
    if (enabled_) print(total_, docs, true);
  }

 private:
  void print(uint64_t done, uint64_t docs, bool last) {
    double el = seconds_since(t0_);
    double pct = total_ ? 100.0 * done / total_ : 100.0;
    int filled = static_cast<int>(pct / 5);
    std::string bar(filled, '#');
    bar.resize(20, '.');
    char line[256];
    std::snprintf(line, sizeof line,
                  "ciuic data: tokenizing [%s] %5.1f%% %s/%s %.1f MB/s %llu docs", bar.c_str(), pct,
                  mb(done).c_str(), mb(total_).c_str(), el > 0 ? done / 1e6 / el : 0.0,
                  static_cast<unsigned long long>(docs));
    if (tty_)
      std::fprintf(stderr, "\r%s%s", line, last ? "\n" : "");
    else
      std::fprintf(stderr, "%s\n", line);
    std::fflush(stderr);
  }
  bool enabled_;
  uint64_t total_;
  bool tty_;
  Clock::time_point t0_ = Clock::now();
  Clock::time_point last_ = Clock::now();
};

// ---- build ----------------------------------------------------------------------------------
struct Block {
  uint32_t source;
  uint64_t first_line;  // 1-based
  std::string_view text;
};

struct DocMeta {
  uint64_t line;
  uint32_t num_tokens, num_loss;
};

struct BlockResult {
  std::vector<uint32_t> ids;
  std::vector<uint8_t> mask;
  std::vector<DocMeta> docs;
  std::vector<std::pair<uint64_t, std::string>> bad;  // line, message
  uint64_t empty = 0, no_loss = 0;
};

void tokenize_block(const Block& b, const CacheSettings& s, BlockResult& r) {
  uint64_t line_no = b.first_line;
  size_t pos = 0;
  const std::string_view t = b.text;
  while (pos < t.size()) {
    size_t nl = t.find('\n', pos);
    size_t end = nl == std::string_view::npos ? t.size() : nl;
    std::string_view line = t.substr(pos, end - pos);
    pos = end + 1;
    const uint64_t this_line = line_no++;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.find_first_not_of(" \t") == std::string_view::npos) continue;  // blank line
    const size_t before = r.ids.size();
    try {
      size_t n = encode_line(line, s.doc, r.ids, r.mask);
      if (n == 0) {
        ++r.empty;
        continue;
      }
      if (n > UINT32_MAX)
        throw LineError("document of " + std::to_string(n) + " tokens is too long");
      // Targets: tokens with loss that something precedes (the first token is never predicted).
      uint32_t loss = 0;
      for (size_t i = before + 1; i < r.ids.size(); ++i) loss += r.mask[i];
      // A document that teaches nothing (e.g. a chat with no assistant reply) is left out.
      if (loss == 0) {
        ++r.no_loss;
        r.ids.resize(before);
        r.mask.resize(before);
        continue;
      }
      r.docs.push_back({this_line, static_cast<uint32_t>(n), loss});
    } catch (const std::exception& e) {
      r.ids.resize(before);
      r.mask.resize(before);
      r.bad.emplace_back(this_line, e.what());
      if (!s.skip_bad_lines) return;  // the first error stops the build
    }
  }
}

std::vector<Block> split_blocks(const MappedFile& f, uint32_t source) {
  std::vector<Block> out;
  std::string_view all = f.view();
  uint64_t line = 1;
  size_t pos = 0;
  while (pos < all.size()) {
    size_t end = std::min(all.size(), pos + kBlockBytes);
    if (end < all.size()) {
      size_t nl = all.find('\n', end);
      end = nl == std::string_view::npos ? all.size() : nl + 1;
    }
    std::string_view text = all.substr(pos, end - pos);
    out.push_back({source, line, text});
    line += static_cast<uint64_t>(std::count(text.begin(), text.end(), '\n'));
    pos = end;
  }
  return out;
}

class ShardWriter {
 public:
  ShardWriter(std::string dir, int64_t shard_bytes) : dir_(std::move(dir)), limit_(shard_bytes) {}

  // Appends one document; returns (shard, offset).
  std::pair<uint32_t, uint64_t> add(const uint32_t* ids, const uint8_t* mask, size_t n) {
    if (!ids_.empty() && static_cast<int64_t>((ids_.size() + n) * 5) > limit_) flush();
    uint64_t off = ids_.size();
    ids_.insert(ids_.end(), ids, ids + n);
    mask_.insert(mask_.end(), mask, mask + n);
    return {static_cast<uint32_t>(shards_.size()), off};
  }
  void flush() {
    if (ids_.empty() && !shards_.empty()) return;
    const uint64_t n = ids_.size();
    uint8_t header[kHeaderBytes] = {};
    const uint64_t ids_off = kHeaderBytes, mask_off = ids_off + n * 4;
    const uint64_t pad = (8 - (n % 8)) % 8;
    const uint64_t file_bytes = mask_off + n + pad;
    std::memcpy(header, kShardMagic, 8);
    const uint32_t version = kCacheFormatVersion, header_bytes = kHeaderBytes;
    std::memcpy(header + 8, &version, 4);
    std::memcpy(header + 12, &header_bytes, 4);
    std::memcpy(header + 16, &n, 8);
    std::memcpy(header + 24, &ids_off, 8);
    std::memcpy(header + 32, &mask_off, 8);
    std::memcpy(header + 40, &file_bytes, 8);
    static const uint8_t zeros[8] = {};
    Hash64 h;
    h.update(header, kHeaderBytes);
    h.update(ids_.data(), n * 4);
    h.update(mask_.data(), n);
    h.update(zeros, pad);
    char name[32];
    std::snprintf(name, sizeof name, "shard-%05zu.bin", shards_.size());
    write_file_synced(
        dir_ + "/" + name,
        {{header, kHeaderBytes}, {ids_.data(), n * 4}, {mask_.data(), n}, {zeros, pad}});
    shards_.push_back({{"file", name},
                       {"bytes", file_bytes},
                       {"xxh64", hex64(h.digest())},
                       {"tokens", n},
                       {"documents", docs_in_shard_}});
    ids_.clear();
    mask_.clear();
    docs_in_shard_ = 0;
  }
  void count_doc() { ++docs_in_shard_; }
  nlohmann::json shards() const { return shards_; }

 private:
  std::string dir_;
  int64_t limit_;
  std::vector<uint32_t> ids_;
  std::vector<uint8_t> mask_;
  uint64_t docs_in_shard_ = 0;
  nlohmann::json shards_ = nlohmann::json::array();
};

// Tokenizes every source into `tmp` (shards, index, manifest). Throws on bad input.
void build_cache(const CacheSettings& s, const nlohmann::json& inputs, const std::string& key,
                 const std::string& tmp, CacheStats& st, FileLock& lock) {
  const auto t0 = Clock::now();
  std::vector<std::string> files = s.train_files;
  files.insert(files.end(), s.eval_files.begin(), s.eval_files.end());
  std::vector<MappedFile> maps;
  std::vector<Block> blocks;
  uint64_t total_bytes = 0;
  for (uint32_t i = 0; i < files.size(); ++i) {
    maps.emplace_back(files[i]);
    maps.back().advise_sequential();
    total_bytes += maps.back().size();
    auto b = split_blocks(maps.back(), i);
    blocks.insert(blocks.end(), b.begin(), b.end());
  }
  const int threads = std::max(1, s.threads);
  log_info("data cache: tokenizing " + std::to_string(files.size()) + " file(s), " +
           mb(total_bytes) + ", with " + std::to_string(threads) + " thread(s) into " + tmp);

  Progress progress(s.progress, total_bytes);
  ShardWriter writer(tmp, s.shard_bytes);
  std::vector<DocRecord> index;
  std::vector<uint64_t> docs_per_source(files.size(), 0), bad_per_source(files.size(), 0);
  std::vector<std::string> bad_examples;
  uint64_t done_bytes = 0;

  const size_t round = static_cast<size_t>(threads) * 4;
  for (size_t first = 0; first < blocks.size(); first += round) {
    const size_t n = std::min(round, blocks.size() - first);
    std::vector<BlockResult> results(n);
    std::atomic<size_t> next{0};
    std::exception_ptr worker_error;
    std::mutex error_mu;
    auto work = [&] {
      try {
        for (size_t i; (i = next.fetch_add(1)) < n;)
          tokenize_block(blocks[first + i], s, results[i]);
      } catch (...) {
        std::lock_guard<std::mutex> l(error_mu);
        if (!worker_error) worker_error = std::current_exception();
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads && static_cast<size_t>(t) < n; ++t) pool.emplace_back(work);
    work();
    for (auto& th : pool) th.join();
    if (worker_error) std::rethrow_exception(worker_error);
    lock.alive();  // waiting ranks see the build progress

    for (size_t i = 0; i < n; ++i) {
      const Block& b = blocks[first + i];
      BlockResult& r = results[i];
      const std::string& file = files[b.source];
      for (auto& [line, msg] : r.bad) {
        if (!s.skip_bad_lines) throw Error(file + ":" + std::to_string(line) + ": " + msg);
        ++bad_per_source[b.source];
        ++st.skipped_lines;
        if (bad_examples.size() < 5)
          bad_examples.push_back(file + ":" + std::to_string(line) + ": " + msg);
      }
      st.empty_documents += r.empty;
      st.no_loss_documents += r.no_loss;
      size_t off = 0;
      for (const DocMeta& d : r.docs) {
        auto [shard, shard_off] = writer.add(r.ids.data() + off, r.mask.data() + off, d.num_tokens);
        writer.count_doc();
        const uint32_t split = b.source >= s.train_files.size() ? 1 : 0;
        index.push_back({shard_off, d.line, d.num_tokens, d.num_loss, shard, b.source, split, 0});
        ++docs_per_source[b.source];
        st.tokens += d.num_tokens;
        st.loss_tokens += d.num_loss;
        off += d.num_tokens;
      }
      done_bytes += b.text.size();
      progress.update(done_bytes, index.size());
    }
  }
  writer.flush();
  progress.finish(index.size());
  st.documents = index.size();

  // index.bin
  uint8_t header[kHeaderBytes] = {};
  std::memcpy(header, kIndexMagic, 8);
  const uint32_t version = kCacheFormatVersion, rec = sizeof(DocRecord);
  const uint64_t ndocs = index.size();
  std::memcpy(header + 8, &version, 4);
  std::memcpy(header + 12, &rec, 4);
  std::memcpy(header + 16, &ndocs, 8);
  Hash64 ih;
  ih.update(header, kHeaderBytes);
  ih.update(index.data(), index.size() * sizeof(DocRecord));
  write_file_synced(tmp + "/index.bin",
                    {{header, kHeaderBytes}, {index.data(), index.size() * sizeof(DocRecord)}});

  st.build_seconds = seconds_since(t0);
  nlohmann::json sources = nlohmann::json::array();
  for (size_t i = 0; i < files.size(); ++i)
    sources.push_back({{"path", files[i]},
                       {"split", i < s.train_files.size() ? "train" : "eval"},
                       {"documents", docs_per_source[i]},
                       {"skipped_lines", bad_per_source[i]}});
  nlohmann::json m = {
      {"format", "ciuic-token-cache"},
      {"version", kCacheFormatVersion},
      {"key", key},
      {"inputs", inputs},
      {"sources", sources},
      {"shards", writer.shards()},
      {"index",
       {{"file", "index.bin"},
        {"bytes", kHeaderBytes + index.size() * sizeof(DocRecord)},
        {"xxh64", hex64(ih.digest())},
        {"documents", ndocs}}},
      {"stats",
       {{"documents", st.documents},
        {"tokens", st.tokens},
        {"loss_tokens", st.loss_tokens},
        {"skipped_lines", st.skipped_lines},
        {"skipped_examples", bad_examples},
        {"empty_documents", st.empty_documents},
        {"no_loss_documents", st.no_loss_documents},
        {"source_bytes", total_bytes},
        {"build_seconds", st.build_seconds},
        {"threads", threads}}},
  };
  // Replace, not throw, should a quoted bad line still hold invalid UTF-8 (LineError bounds it).
  const std::string text = m.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  write_file_synced(tmp + "/manifest.json", {{text.data(), text.size()}});  // written last
  fsync_dir(tmp);
  log_info("data cache: tokenized " + std::to_string(st.documents) + " documents, " +
           std::to_string(st.tokens) + " tokens in " + std::to_string(st.build_seconds) + " s (" +
           std::to_string(total_bytes / 1e6 / std::max(st.build_seconds, 1e-9)) + " MB/s)");
  if (st.skipped_lines) {
    std::string ex;
    for (const auto& e : bad_examples) ex += "\n  " + e;
    log_warn("data cache: skipped " + std::to_string(st.skipped_lines) +
             " bad line(s) (on_error = \"skip\"), first ones:" + ex);
  }
}

// The manifest in `dir` when it is complete and has `key`; null otherwise.
nlohmann::json read_matching_manifest(const std::string& dir, const std::string& key) {
  const std::string path = dir + "/manifest.json";
  if (!file_exists(path)) return nullptr;
  const std::string text = read_text_file(path);
  if (const std::string deep = json_depth_problem(text); !deep.empty())
    throw Error("data cache manifest " + path + " is damaged (JSON " + deep + "; delete " + dir +
                " to rebuild it)");
  nlohmann::json m = nlohmann::json::parse(text, nullptr, false);
  if (m.is_discarded() || !m.is_object() || !m.contains("format") ||
      m["format"] != "ciuic-token-cache" || !m.contains("version") ||
      m["version"] != kCacheFormatVersion || !m.contains("key") || m["key"] != key)
    return nullptr;
  // Ours and for these inputs: every field the reader uses must be there with its type, so a
  // damaged manifest is reported as such (not as a JSON library exception).
  auto file_entry = [](const nlohmann::json& e) {
    return e.is_object() && e.contains("bytes") && e["bytes"].is_number_unsigned() &&
           e.contains("xxh64") && e["xxh64"].is_string();
  };
  bool ok = m.contains("sources") && m["sources"].is_array() && m.contains("shards") &&
            m["shards"].is_array() && m.contains("index") && file_entry(m["index"]) &&
            m["index"].contains("documents") && m["index"]["documents"].is_number_unsigned() &&
            m.contains("stats") && m["stats"].is_object();
  if (ok)
    for (const auto& sh : m["shards"])
      ok = ok && file_entry(sh) && sh.contains("file") && sh["file"].is_string() &&
           sh["file"].get<std::string>().find('/') == std::string::npos;
  if (ok)
    for (const auto& src : m["sources"]) ok = ok && src.is_object();
  for (const char* k : {"documents", "tokens", "loss_tokens", "skipped_lines", "empty_documents",
                        "no_loss_documents"})
    if (ok && m["stats"].contains(k)) ok = m["stats"][k].is_number_unsigned();
  if (!ok)
    throw Error("data cache manifest " + path +
                " is damaged (a field is missing or of the wrong type; delete " + dir +
                " to rebuild it)");
  return m;
}

void remove_stale(const std::string& cache_dir, const std::string& keep) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(cache_dir, ec)) {
    const std::string name = e.path().filename().string();
    if (name == keep) continue;
    if (name.rfind("tokens-", 0) == 0 || name.rfind(".tmp-", 0) == 0) {
      log_info("data cache: removing stale " + e.path().string());
      remove_tree(e.path().string());
    }
  }
}

}  // namespace

nlohmann::json cache_inputs(const CacheSettings& s, uint64_t* source_bytes) {
  nlohmann::json srcs = nlohmann::json::array();
  uint64_t total = 0;
  auto add = [&](const std::vector<std::string>& files, const char* split) {
    for (const auto& f : files) {
      uint64_t bytes = 0;
      uint64_t h = hash_file(f, &bytes);
      total += bytes;
      srcs.push_back({{"path", f}, {"split", split}, {"bytes", bytes}, {"xxh64", hex64(h)}});
    }
  };
  add(s.train_files, "train");
  add(s.eval_files, "eval");
  if (source_bytes) *source_bytes = total;
  const DocumentSettings& d = s.doc;
  nlohmann::json in = {
      {"cache_format", kCacheFormatVersion},
      {"sources", srcs},
      {"format", d.format == Format::kText ? "text" : "chat"},
      {"tokenizer", d.tokenizer ? d.tokenizer->fingerprint() : ""},
      {"probe", probe_hash(d)},
      {"on_error", s.skip_bad_lines ? "skip" : "error"},
  };
  if (d.format == Format::kText) {
    in["text_field"] = d.text_field;
    in["add_bos"] = d.add_bos;
    in["add_eos"] = d.add_eos;
  } else {
    in["messages_field"] = d.messages_field;
    in["chat_template"] = d.chat_template ? d.chat_template->name() : "";
    in["assistant_only_loss"] = d.assistant_only_loss;
  }
  return in;
}

// Who holds the lock, from the line its last builder recorded ("rank 0 (pid 12 on host h)"): that
// process when it still runs on this host, else someone else.
static std::string holder_text(const std::string& recorded) {
  if (recorded.empty()) return "it is held by another process";
  const size_t p = recorded.find("(pid "), h = recorded.find(" on host ");
  if (p != std::string::npos && h != std::string::npos && h > p) {
    const long pid = std::strtol(recorded.c_str() + p + 5, nullptr, 10);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    const std::string rec_host = recorded.substr(h + 9, recorded.find(')', h) - h - 9);
    if (pid > 0 && rec_host == host && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
      return "the lock file names " + recorded + ", which no longer runs: another process holds it";
  }
  return "it is held by " + recorded;
}

std::unique_ptr<TokenCache> TokenCache::open_or_build(const CacheSettings& s) {
  const auto t0 = Clock::now();
  std::unique_ptr<TokenCache> c(new TokenCache());
  CacheStats& st = c->stats_;
  nlohmann::json inputs = cache_inputs(s, &st.source_bytes);
  st.hash_seconds = seconds_since(t0);
  c->key_ = hex64(xxh64(inputs.dump().data(), inputs.dump().size()));
  const std::string name = "tokens-" + c->key_;
  c->dir_ = s.cache_dir + "/" + name;

  make_dirs(s.cache_dir);
  FileLock lock(s.cache_dir + "/.lock");
  // Waits for the lock; a holder that makes no progress for lock_patience is given up on.
  auto take = [&](bool exclusive) {
    if (exclusive ? lock.try_exclusive() : lock.try_shared()) return;
    const std::string holder = lock.holder();
    log_info("data cache: " + (holder.empty() ? std::string("another process") : holder) +
             " holds " + lock.path() + " (building or checking the cache); waiting for it");
    if (exclusive ? lock.lock_exclusive(s.lock_patience) : lock.lock_shared(s.lock_patience))
      return;
    const std::string now = lock.holder();
    char secs[32];
    std::snprintf(secs, sizeof secs, "%g", std::chrono::duration<double>(s.lock_patience).count());
    throw Error("data cache: " + s.who + " gave up waiting for the lock file " + lock.path() +
                " after " + secs + " s without progress ([cluster] timeout_s): " +
                holder_text(now) + "; it builds or checks the cache in " + s.cache_dir +
                ". If that process is stuck, stop it; if none runs, another run shares this "
                "cache_dir");
  };
  take(false);
  c->manifest_ = read_matching_manifest(c->dir_, c->key_);
  if (c->manifest_.is_null()) {
    lock.unlock();
    take(true);
    c->manifest_ = read_matching_manifest(c->dir_, c->key_);
    if (c->manifest_.is_null()) {
      lock.record_holder(s.who);
      static std::atomic<int> counter{0};
      const std::string tmp = s.cache_dir + "/.tmp-" + c->key_ + "-" + std::to_string(::getpid()) +
                              "-" + std::to_string(counter++);
      remove_tree(tmp);
      make_dirs(tmp);
      try {
        build_cache(s, inputs, c->key_, tmp, st, lock);
      } catch (...) {
        remove_tree(tmp);
        throw;
      }
      remove_tree(c->dir_);  // an incomplete or foreign folder with our name
      std::error_code ec;
      fs::rename(tmp, c->dir_, ec);
      if (ec) {
        remove_tree(tmp);
        throw Error("cannot rename " + tmp + " to " + c->dir_ + ": " + ec.message());
      }
      fsync_dir(s.cache_dir);
      remove_stale(s.cache_dir, name);
      st.built_here = true;
      c->manifest_ = read_matching_manifest(c->dir_, c->key_);
      if (c->manifest_.is_null())
        throw Error("data cache: " + c->dir_ + "/manifest.json vanished after the build");
    }
  }
  c->open_files(s);
  lock.unlock();
  c->verify(s);
  st.hit = !st.built_here;
  const auto& stats = c->manifest_["stats"];
  st.documents = stats.value("documents", uint64_t{0});
  st.tokens = stats.value("tokens", uint64_t{0});
  st.loss_tokens = stats.value("loss_tokens", uint64_t{0});
  st.skipped_lines = stats.value("skipped_lines", uint64_t{0});
  st.empty_documents = stats.value("empty_documents", uint64_t{0});
  st.no_loss_documents = stats.value("no_loss_documents", uint64_t{0});
  st.open_seconds = seconds_since(t0);
  if (st.hit)
    log_info("data cache: reusing " + c->dir_ + " (" + std::to_string(st.documents) +
             " documents, " + std::to_string(st.tokens) +
             " tokens; sources unchanged, no tokenization)" +
             (st.skipped_lines ? "; " + std::to_string(st.skipped_lines) +
                                     " bad line(s) were skipped when it was built"
                               : ""));
  return c;
}

void TokenCache::open_files(const CacheSettings& s) {
  for (const auto& src : manifest_["sources"]) source_paths_.push_back(src.value("path", "?"));
  for (const auto& sh : manifest_["shards"]) {
    shard_files_.emplace_back(dir_ + "/" + sh["file"].get<std::string>());
  }
  index_file_ = MappedFile(dir_ + "/index.bin");
}

void TokenCache::verify(const CacheSettings& s) {
  const auto t0 = Clock::now();
  const auto& shards = manifest_["shards"];
  auto check = [&](const MappedFile& f, const nlohmann::json& entry,
                   const char* what) -> std::string {
    const uint64_t want = entry["bytes"].get<uint64_t>();
    if (f.size() != want)
      return "data cache " + std::string(what) + " " + f.path() +
             " is truncated or damaged: " + std::to_string(f.size()) +
             " bytes, the manifest says " + std::to_string(want) + " (delete " + dir_ +
             " to rebuild it)";
    if (s.verify_checksums) {
      const std::string got = hex64(xxh64(f.data(), f.size()));
      if (got != entry["xxh64"].get<std::string>())
        return "data cache " + std::string(what) + " " + f.path() + " is corrupt: XXH64 " + got +
               ", the manifest says " + entry["xxh64"].get<std::string>() + " (delete " + dir_ +
               " to rebuild it)";
    }
    return "";
  };
  // Shards in parallel; the first failure (in shard order) is reported.
  std::vector<std::string> errors(shard_files_.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next.fetch_add(1)) < shard_files_.size();)
      errors[i] = check(shard_files_[i], shards[i], "shard");
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, s.threads) && static_cast<size_t>(t) < shard_files_.size(); ++t)
    pool.emplace_back(work);
  work();
  for (auto& th : pool) th.join();
  for (const auto& e : errors)
    if (!e.empty()) throw Error(e);
  if (auto e = check(index_file_, manifest_["index"], "index"); !e.empty()) throw Error(e);

  // Headers and the index's references, so that a damaged file never makes us read out of bounds
  // (also when checksums are off).
  for (size_t i = 0; i < shard_files_.size(); ++i) {
    const MappedFile& f = shard_files_[i];
    const uint64_t n = shards[i]["tokens"].get<uint64_t>();
    uint64_t hn = 0;
    if (f.size() >= kHeaderBytes) std::memcpy(&hn, f.data() + 16, 8);
    if (f.size() < kHeaderBytes || std::memcmp(f.data(), kShardMagic, 8) != 0 || hn != n ||
        f.size() < kHeaderBytes + n * 5)
      throw Error("data cache shard " + f.path() + " has a bad header (delete " + dir_ +
                  " to rebuild it)");
    shard_ids_.push_back(reinterpret_cast<const uint32_t*>(f.data() + kHeaderBytes));
    shard_mask_.push_back(f.data() + kHeaderBytes + n * 4);
  }
  num_docs_ = manifest_["index"]["documents"].get<uint64_t>();
  if (index_file_.size() != kHeaderBytes + num_docs_ * sizeof(DocRecord) ||
      std::memcmp(index_file_.data(), kIndexMagic, 8) != 0)
    throw Error("data cache index " + index_file_.path() + " has a bad header (delete " + dir_ +
                " to rebuild it)");
  docs_ = reinterpret_cast<const DocRecord*>(index_file_.data() + kHeaderBytes);
  std::vector<uint64_t> shard_tokens;
  for (const auto& sh : shards) shard_tokens.push_back(sh["tokens"].get<uint64_t>());
  for (size_t i = 0; i < num_docs_; ++i) {
    const DocRecord& d = docs_[i];
    if (d.shard >= shard_files_.size() || d.token_offset + d.num_tokens > shard_tokens[d.shard] ||
        d.source >= source_paths_.size())
      throw Error("data cache index " + index_file_.path() + ": document " + std::to_string(i) +
                  " points outside its shard (delete " + dir_ + " to rebuild it)");
  }
  stats_.verify_seconds = seconds_since(t0);
}

std::string TokenCache::provenance(size_t i) const {
  const DocRecord& d = docs_[i];
  return source_paths_[d.source] + ":" + std::to_string(d.line);
}

}  // namespace ciuic::data
