// The `cached_ssd` data source: JSONL (text or chat) tokenized once into a memory-mapped cache,
// packed into rows, shuffled per epoch, sliced by rank, prefetched on a background thread.
// User documentation: docs/data.md. Pieces: documents.h (one line → tokens), cache.h (build,
// reuse, verify); the data kit's PackedStream (ciuic/kit/packed_stream.h: shuffling, packing,
// rank dealing, cursors, eval shares, prefetching) does the rest.
#define CIUIC_PLUGIN_API 7
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <thread>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/data.h>
#include <ciuic/error.h>
#include <ciuic/kit/packed_stream.h>
#include <ciuic/kit/sampler.h>
#include <ciuic/metrics.h>
#include <ciuic/plugin.h>
#include <ciuic/tokenizer.h>

#include "cache.h"
#include "files.h"

namespace ciuic::data {
namespace {

using kit::DocView;
using kit::mix64;
using kit::PackedStream;
using kit::PackMode;
using kit::StreamArgs;

constexpr Option<std::vector<std::string>> kSources{
    "sources", nullptr, "JSONL files or globs (relative to the recipe's folder), in order"};
constexpr Option<std::string> kFormat{
    "format", "\"text\"", "\"text\": {text_field: str}; \"chat\": {messages: [{role, content}]}",
    NAN,      NAN,        "text|chat"};
constexpr Option<std::string> kTextField{"text_field", "\"text\"",
                                         "field holding the document (format = \"text\")"};
constexpr Option<std::string> kMessagesField{"messages_field", "\"messages\"",
                                             "field holding the conversation (format = \"chat\")"};
constexpr Option<bool> kAssistantOnlyLoss{"assistant_only_loss", "true",
                                          "chat: loss on the assistant replies only"};
constexpr Option<bool> kAddBos{
    "add_bos", "true", "text: add the tokenizer's BOS (its post-processor's special tokens)"};
constexpr Option<bool> kAddEos{"add_eos", "true",
                               "text: end every document with the tokenizer's EOS"};
constexpr Option<std::vector<std::string>> kEvalSources{
    "eval_sources", "[]", "held-out JSONL files or globs (eval split)"};
constexpr Option<double> kEvalFraction{
    "eval_fraction", "0.0",
    "fraction of the documents of `sources` held out for eval (fixed by the data, not the seed)",
    0.0, 0.5};
constexpr Option<std::string> kCacheDir{"cache_dir", "\"\"",
                                        "token cache folder; \"\" = <output_dir>/data-cache"};
constexpr Option<bool> kPacking{"packing", "true",
                                "pack several documents per row (else one per row, padded)"};
constexpr Option<bool> kSplitDocuments{
    "split_documents", "false",
    "packing: cut documents at row ends and continue them in the next row (no padding) instead "
    "of starting a new row for a document that does not fit"};
constexpr Option<bool> kShuffle{"shuffle", "true",
                                "shuffle documents every epoch (from the run seed and the epoch)"};
constexpr Option<std::string> kOnError{
    "on_error", "\"error\"", "a bad JSONL line: \"error\" stops, \"skip\" skips and counts it",
    NAN,        NAN,         "error|skip"};
constexpr Option<int64_t> kPrefetchBatches{
    "prefetch_batches", "4", "batches prepared ahead on a background thread (0 = none)", 0, 1024};
constexpr Option<int64_t> kBuildThreads{
    "build_threads", "0", "tokenization threads when building the cache (0 = all cores)", 0, 1024};
constexpr Option<int64_t> kShardSizeMb{"shard_size_mb", "256", "target size of one cache shard", 1,
                                       1 << 20};
constexpr Option<bool> kVerifyChecksums{"verify_checksums", "true",
                                        "check every shard's XXH64 when opening the cache"};
constexpr Option<int64_t> kPadId{"pad_id", "-1",
                                 "token id of padding (-1 = the tokenizer's EOS, or 0)", -1, NAN};
const OptionSpec kOptions[] = {
    kSources,      kFormat,         kTextField,       kMessagesField, kAssistantOnlyLoss,
    kAddBos,       kAddEos,         kEvalSources,     kEvalFraction,  kCacheDir,
    kPacking,      kSplitDocuments, kShuffle,         kOnError,       kPrefetchBatches,
    kBuildThreads, kShardSizeMb,    kVerifyChecksums, kPadId};

class CachedSsd final : public DataSource {
 public:
  CachedSsd(const Config& config, const RunContext& ctx) : ctx_(ctx) {
    sources_ = config.get(kSources);
    if (sources_.empty()) config.fail(kSources.key(), "at least one JSONL file or glob is needed");
    eval_sources_ = config.get(kEvalSources);
    doc_.format = config.get(kFormat) == "chat" ? Format::kChat : Format::kText;
    doc_.text_field = config.get(kTextField);
    doc_.messages_field = config.get(kMessagesField);
    doc_.assistant_only_loss = config.get(kAssistantOnlyLoss);
    doc_.add_bos = config.get(kAddBos);
    doc_.add_eos = config.get(kAddEos);
    eval_fraction_ = config.get(kEvalFraction);
    if (eval_fraction_ < 0 || eval_fraction_ > 0.5)
      config.fail(kEvalFraction.key(), "expected a value in [0, 0.5]");
    if (eval_fraction_ > 0 && !eval_sources_.empty())
      config.fail(kEvalFraction.key(), "give either eval_fraction or eval_sources, not both");
    cache_dir_ = config.get(kCacheDir);
    const bool packing = config.get(kPacking), split = config.get(kSplitDocuments);
    mode_ = !packing ? PackMode::kPad : split ? PackMode::kPackSplit : PackMode::kPackWhole;
    shuffle_ = config.get(kShuffle);
    skip_bad_ = config.get(kOnError) == "skip";
    prefetch_ = config.get(kPrefetchBatches);
    build_threads_ = static_cast<int>(config.get(kBuildThreads));
    shard_mb_ = config.get(kShardSizeMb);
    verify_ = config.get(kVerifyChecksums);
    pad_id_ = config.get(kPadId);
    config_ = std::make_unique<Config>(config);
  }

  void open(const DataOpenArgs& a) override {
    if (a.seq_len < 1 || a.micro_batch_size < 1 || ctx_.world_size < 1 || ctx_.rank < 0 ||
        ctx_.rank >= ctx_.world_size)
      throw Error("data plugin cached_ssd: bad open arguments (seq_len " +
                  std::to_string(a.seq_len) + ", micro_batch_size " +
                  std::to_string(a.micro_batch_size) + ", rank " + std::to_string(ctx_.rank) +
                  " of " + std::to_string(ctx_.world_size) + ")");
    if (!a.tokenizer)
      throw UsageError(
          "data plugin cached_ssd tokenizes its sources with the model's tokenizer, but the "
          "recipe has none: set [model] tokenizer (a tokenizer.json) or [model] path");
    if (doc_.format == Format::kChat && !a.chat_template)
      throw UsageError(
          "data plugin cached_ssd: format = \"chat\" needs the recipe's chat template "
          "([model] chat_template), and none was given");
    doc_.tokenizer = a.tokenizer;
    doc_.chat_template = a.chat_template;
    if (pad_id_ < 0) pad_id_ = a.tokenizer->eos_id().value_or(0);

    CacheSettings s;
    s.train_files = resolve("sources", sources_);
    if (!eval_sources_.empty()) s.eval_files = resolve("eval_sources", eval_sources_);
    s.cache_dir =
        cache_dir_.empty() ? ctx_.output_dir + "/data-cache" : join_path(base_dir(), cache_dir_);
    if (cache_dir_.empty() && ctx_.output_dir.empty())
      throw UsageError(
          "data plugin cached_ssd: cache_dir is not set and the run has no output_dir");
    s.doc = doc_;
    s.skip_bad_lines = skip_bad_;
    s.threads =
        build_threads_ > 0 ? build_threads_ : std::max(1u, std::thread::hardware_concurrency());
    s.shard_bytes = shard_mb_ << 20;
    s.verify_checksums = verify_;
    s.progress = ctx_.rank == 0;
    s.lock_patience = ctx_.timeout;
    char host[256] = "?";
    gethostname(host, sizeof host - 1);
    s.who = "rank " + std::to_string(ctx_.rank) + " (pid " + std::to_string(getpid()) +
            " on host " + host + ")";
    cache_ = TokenCache::open_or_build(s);

    // Splits (document numbers in cache order); the stream keeps them.
    std::vector<uint32_t> train_docs, eval_docs;
    for (uint32_t i = 0; i < cache_->num_documents(); ++i)
      (cache_->doc(i).split == 0 ? train_docs : eval_docs).push_back(i);
    if (eval_fraction_ > 0 && !train_docs.empty()) hold_out(train_docs, eval_docs);
    if (train_docs.empty())
      throw Error(
          "data plugin cached_ssd: the dataset is empty: no document with a training target in " +
          join_list(s.train_files) + describe_dropped());
    if (!eval_sources_.empty() && eval_docs.empty())
      throw Error("data plugin cached_ssd: eval_sources hold no document with a training target (" +
                  join_list(s.eval_files) + ")");
    PackedStream::Settings ps;
    ps.who = "data plugin cached_ssd";
    ps.mode = mode_;
    ps.shuffle = shuffle_;
    ps.pad_id = pad_id_;
    ps.prefetch_batches = static_cast<size_t>(prefetch_);
    ps.truncation_hint = " (set split_documents = true to keep them)";
    stream_ =
        std::make_unique<PackedStream>(StreamArgs(a, ctx_), std::move(ps), std::move(train_docs),
                                       std::move(eval_docs), [c = cache_.get()](uint32_t d) {
                                         const DocRecord& r = c->doc(d);
                                         return DocView{c->ids(r), c->mask(r), r.num_tokens};
                                       });
  }

  Batch next() override { return stream().next(); }
  std::string cursor() const override { return stream().cursor(); }
  void seek(const std::string& cursor) override { stream().seek(cursor); }
  int64_t epoch() const override { return stream().epoch(); }

  bool has_eval() const override { return stream_ && stream_->has_eval(); }
  void begin_eval() override { stream().begin_eval(); }
  std::optional<Batch> next_eval() override { return stream().next_eval(); }

  void append_metrics(Metrics& m) const override {
    if (!cache_) return;
    if (stream_) stream_->append_metrics(m);
    const CacheStats& s = cache_->stats();
    m.set("data_cache_hit", s.hit ? 1.0 : 0.0);
    m.set("data_cache_open_s", s.open_seconds);
    m.set("data_cache_build_s", s.build_seconds);
    m.set("data_tokenized_documents", s.built_here ? static_cast<double>(s.documents) : 0.0);
    m.set("data_skipped_lines", static_cast<double>(s.skipped_lines));
  }

 private:
  static std::string join_list(const std::vector<std::string>& v) {
    std::string s;
    for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
    return s;
  }
  std::string describe_dropped() const {
    const CacheStats& s = cache_->stats();
    std::string d;
    if (s.empty_documents) d += "; " + std::to_string(s.empty_documents) + " empty document(s)";
    if (s.no_loss_documents)
      d += "; " + std::to_string(s.no_loss_documents) +
           " document(s) without a training target (e.g. no assistant reply)";
    if (s.skipped_lines) d += "; " + std::to_string(s.skipped_lines) + " bad line(s) skipped";
    return d;
  }
  std::string base_dir() const { return ctx_.recipe_dir.empty() ? "." : ctx_.recipe_dir; }
  PackedStream& stream() const {
    if (!stream_) throw Error("data plugin cached_ssd: used before open()");
    return *stream_;
  }

  std::vector<std::string> resolve(const char* key, const std::vector<std::string>& entries) const {
    std::vector<std::string> out;
    for (const auto& e : entries) {
      const std::string p = join_path(base_dir(), e);
      if (has_glob_chars(e)) {
        auto m = glob_sorted(p);
        if (m.empty()) config_->fail(key, "the glob \"" + e + "\" (" + p + ") matches no file");
        out.insert(out.end(), m.begin(), m.end());
      } else {
        if (!file_exists(p)) config_->fail(key, "no such file: " + p);
        out.push_back(p);
      }
    }
    // Sources are streamed: a FIFO would block the cache build forever and a device never end.
    for (const auto& p : out) {
      struct stat st {};
      if (::stat(p.c_str(), &st) == 0 && !S_ISREG(st.st_mode))
        config_->fail(key, p + " is not a regular file (expected a JSONL or text file, not a "
                               "folder, FIFO or device)");
    }
    return out;
  }

  // Moves round(n * eval_fraction) documents (at least 1) of the train split to eval, chosen by a
  // hash of their position in the cache: fixed by the data, the same for every seed and rank.
  void hold_out(std::vector<uint32_t>& train_docs, std::vector<uint32_t>& eval_docs) const {
    const size_t n = train_docs.size();
    if (n < 2) return;  // nothing to spare: no eval split
    const size_t k =
        std::clamp<size_t>(static_cast<size_t>(std::llround(n * eval_fraction_)), 1, n - 1);
    std::vector<std::pair<uint64_t, uint32_t>> keyed;
    keyed.reserve(n);
    for (uint32_t d : train_docs) keyed.emplace_back(mix64(d ^ 0xE7A1C0DEULL), d);
    std::nth_element(keyed.begin(), keyed.begin() + static_cast<std::ptrdiff_t>(k), keyed.end());
    std::vector<uint32_t> eval;
    for (size_t i = 0; i < k; ++i) eval.push_back(keyed[i].second);
    std::sort(eval.begin(), eval.end());
    std::vector<uint32_t> train;
    train.reserve(n - k);
    std::set_difference(train_docs.begin(), train_docs.end(), eval.begin(), eval.end(),
                        std::back_inserter(train));
    train_docs = std::move(train);
    eval_docs = std::move(eval);
  }

  const RunContext& ctx_;
  std::unique_ptr<Config> config_;
  // options
  std::vector<std::string> sources_, eval_sources_;
  DocumentSettings doc_;
  double eval_fraction_ = 0;
  std::string cache_dir_;
  PackMode mode_ = PackMode::kPackWhole;
  bool shuffle_ = true, skip_bad_ = false, verify_ = true;
  int64_t prefetch_ = 4, shard_mb_ = 256, pad_id_ = -1;
  int build_threads_ = 0;
  // state
  std::unique_ptr<TokenCache> cache_;
  std::unique_ptr<PackedStream> stream_;
};

}  // namespace
}  // namespace ciuic::data

CIUIC_DEFINE_PLUGIN(
    ciuic::Slot::kData, "cached_ssd", "1.0.0",
    "JSONL text/chat tokenized once into a memory-mapped token cache; packed, shuffled, "
    "rank-sliced, prefetched",
    ciuic::data::kOptions, [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
      return new ciuic::data::CachedSsd(a.config, a.context);
    })
