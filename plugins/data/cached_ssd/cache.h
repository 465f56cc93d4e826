// cache.h — the tokenized cache: built once from JSONL sources, then memory-mapped.
//
// Layout under cache_dir (see docs/data.md):
//   .lock                      flock(2) file: shared while a process checks/opens, exclusive while
//   one builds tokens-<key>/manifest.json what was tokenized (the key's inputs), the files with
//   sizes and XXH64 tokens-<key>/index.bin     one 40-byte DocRecord per document, in source order
//   tokens-<key>/shard-NNNNN.bin  64-byte header, uint32 ids[n], uint8 loss_mask[n] (padded to 8)
//   .tmp-<key>-<pid>-<n>/      a build in progress (renamed to tokens-<key> when complete)
// <key> = XXH64 of the manifest's "inputs": the sources' contents (bytes), the tokenizer's
// fingerprint and encodings of a probe text and conversation, the chat template's name, and every
// option that changes the tokens. A cache whose key matches is reused; the build of another key
// removes the stale tokens-* folders (their readers keep their maps: unlinked files stay readable).
//
// Concurrency: any number of processes (ranks, nodes sharing the file system, separate jobs) may
// call open_or_build() on one cache_dir at once; exactly one builds, the others block on the lock
// and then open the finished cache. A build that fails or is killed leaves only a .tmp-* folder
// (removed by the next build), never a half-written tokens-* folder.
//
// Failure: ciuic::Error. Bad input names the file and line; a truncated or corrupt shard or index
// is named with what was expected and found.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "documents.h"
#include "files.h"

namespace ciuic::data {

inline constexpr uint32_t kCacheFormatVersion = 1;

// One document of the cache (index.bin record; little-endian, 40 bytes).
struct DocRecord {
  uint64_t token_offset;  // first token within its shard
  uint64_t line;          // 1-based line of the source file
  uint32_t num_tokens;
  uint32_t num_loss_tokens;  // training targets: tokens after the first with loss_mask = 1
  uint32_t shard;
  uint32_t source;  // index into the manifest's "sources"
  uint32_t split;   // 0 = from `sources`, 1 = from `eval_sources`
  uint32_t reserved;
};
static_assert(sizeof(DocRecord) == 40);

struct CacheSettings {
  std::string cache_dir;
  std::vector<std::string> train_files;  // resolved paths, in order
  std::vector<std::string> eval_files;
  DocumentSettings doc;
  bool skip_bad_lines = false;  // on_error = "skip"
  int threads = 1;              // tokenization threads
  int64_t shard_bytes = 256 << 20;
  bool verify_checksums = true;
  bool progress = false;  // progress bar on stderr (rank 0)
  // How long to wait for the cache's lock while its holder shows no progress ([cluster]
  // timeout_s, RunContext::timeout); then open_or_build gives up naming the lock file and holder.
  std::chrono::milliseconds lock_patience{std::chrono::minutes(10)};
  std::string who = "a process";  // this process in the lock file: "rank 0 (pid 12 on host gpu03)"
};

struct CacheStats {
  bool hit = false;           // reused a complete cache (no tokenization in this process)
  bool built_here = false;    // this process tokenized the sources
  double open_seconds = 0;    // hashing + (build) + verification
  double build_seconds = 0;   // tokenization and writing, 0 on a hit
  double hash_seconds = 0;    // hashing the sources' bytes
  double verify_seconds = 0;  // checksums of shards and index
  uint64_t source_bytes = 0;
  uint64_t documents = 0, tokens = 0, loss_tokens = 0;
  uint64_t skipped_lines = 0, empty_documents = 0, no_loss_documents = 0;
};

class TokenCache {
 public:
  // Finds the cache matching `s` under s.cache_dir or builds it. Call from one thread.
  static std::unique_ptr<TokenCache> open_or_build(const CacheSettings& s);

  size_t num_documents() const { return num_docs_; }
  const DocRecord& doc(size_t i) const { return docs_[i]; }
  const uint32_t* ids(const DocRecord& d) const { return shard_ids_[d.shard] + d.token_offset; }
  const uint8_t* mask(const DocRecord& d) const { return shard_mask_[d.shard] + d.token_offset; }
  const std::string& dir() const { return dir_; }
  const std::string& key() const { return key_; }
  const CacheStats& stats() const { return stats_; }
  const nlohmann::json& manifest() const { return manifest_; }
  // "<file>:<line>" of document i, for messages.
  std::string provenance(size_t i) const;

 private:
  TokenCache() = default;
  void open_files(const CacheSettings& s);  // maps shards and index (under the lock)
  void verify(const CacheSettings& s);      // sizes always, checksums when asked

  std::string dir_, key_;
  nlohmann::json manifest_;
  std::vector<MappedFile> shard_files_;
  MappedFile index_file_;
  std::vector<const uint32_t*> shard_ids_;
  std::vector<const uint8_t*> shard_mask_;
  const DocRecord* docs_ = nullptr;
  size_t num_docs_ = 0;
  std::vector<std::string> source_paths_;
  CacheStats stats_;
};

// The manifest "inputs" of `s` (hashes every source: reads all their bytes). Exposed for tests.
nlohmann::json cache_inputs(const CacheSettings& s, uint64_t* source_bytes = nullptr);

}  // namespace ciuic::data
