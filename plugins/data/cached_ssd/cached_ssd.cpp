// The `cached_ssd` data source: JSONL (text or chat) tokenized once into a memory-mapped cache,
// packed into rows, shuffled per epoch, sliced by rank, prefetched on a background thread.
// User documentation: docs/data.md. Pieces: documents.h (one line → tokens), cache.h (build,
// reuse, verify), layout.h (rows, labels, positions), prefetch.h (background producer).
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include <ATen/ops/empty.h>

#include <nlohmann/json.hpp>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/data.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <ciuic/plugin.h>
#include <ciuic/tokenizer.h>

#include "cache.h"
#include "files.h"
#include "layout.h"
#include "options.h"
#include "prefetch.h"

namespace ciuic::data {
namespace {

const OptionSpec kOptions[] = {
    {"sources", OptionType::kStringList, nullptr,
     "JSONL files or globs (relative to the recipe's folder), in order"},
    {"format", OptionType::kString, "\"text\"", "\"text\": {text_field: str}; \"chat\": {messages: [{role, content}]}",
     NAN, NAN, "text|chat"},
    {"text_field", OptionType::kString, "\"text\"", "field holding the document (format = \"text\")"},
    {"messages_field", OptionType::kString, "\"messages\"", "field holding the conversation (format = \"chat\")"},
    {"assistant_only_loss", OptionType::kBool, "true", "chat: loss on the assistant replies only"},
    {"add_bos", OptionType::kBool, "true", "text: add the tokenizer's BOS (its post-processor's special tokens)"},
    {"add_eos", OptionType::kBool, "true", "text: end every document with the tokenizer's EOS"},
    {"eval_sources", OptionType::kStringList, "[]", "held-out JSONL files or globs (eval split)"},
    {"eval_fraction", OptionType::kFloat, "0.0",
     "fraction of the documents of `sources` held out for eval (fixed by the data, not the seed)", 0.0, 0.5},
    {"cache_dir", OptionType::kString, "\"\"", "token cache folder; \"\" = <output_dir>/data-cache"},
    {"packing", OptionType::kBool, "true", "pack several documents per row (else one per row, padded)"},
    {"split_documents", OptionType::kBool, "false",
     "packing: cut documents at row ends and continue them in the next row (no padding) instead "
     "of starting a new row for a document that does not fit"},
    {"shuffle", OptionType::kBool, "true", "shuffle documents every epoch (from the run seed and the epoch)"},
    {"on_error", OptionType::kString, "\"error\"", "a bad JSONL line: \"error\" stops, \"skip\" skips and counts it",
     NAN, NAN, "error|skip"},
    {"prefetch_batches", OptionType::kInt, "4", "batches prepared ahead on a background thread (0 = none)", 0, 1024},
    {"build_threads", OptionType::kInt, "0", "tokenization threads when building the cache (0 = all cores)", 0, 1024},
    {"shard_size_mb", OptionType::kInt, "256", "target size of one cache shard", 1, 1 << 20},
    {"verify_checksums", OptionType::kBool, "true", "check every shard's XXH64 when opening the cache"},
    {"pad_id", OptionType::kInt, "-1", "token id of padding (-1 = the tokenizer's EOS, or 0)", -1, NAN},
};

struct Pos {
  int64_t epoch = 0;
  int64_t row = 0;  // global row of rank 0's next row in the epoch; rank k reads row + k
};

struct Item {
  Batch batch;
  Pos after;
  int64_t tokens = 0;
};

class CachedSsd final : public DataSource {
 public:
  CachedSsd(const Config& config, const RunContext& ctx) : ctx_(ctx) {
    OptionReader o(config, kOptions);
    sources_ = o.get_string_list("sources");
    if (sources_.empty()) config.fail("sources", "at least one JSONL file or glob is needed");
    eval_sources_ = o.get_string_list("eval_sources");
    doc_.format = o.get_string("format") == "chat" ? Format::kChat : Format::kText;
    doc_.text_field = o.get_string("text_field");
    doc_.messages_field = o.get_string("messages_field");
    doc_.assistant_only_loss = o.get_bool("assistant_only_loss");
    doc_.add_bos = o.get_bool("add_bos");
    doc_.add_eos = o.get_bool("add_eos");
    eval_fraction_ = o.get_float("eval_fraction");
    if (eval_fraction_ < 0 || eval_fraction_ > 0.5) config.fail("eval_fraction", "expected a value in [0, 0.5]");
    if (eval_fraction_ > 0 && !eval_sources_.empty())
      config.fail("eval_fraction", "give either eval_fraction or eval_sources, not both");
    cache_dir_ = o.get_string("cache_dir");
    const bool packing = o.get_bool("packing"), split = o.get_bool("split_documents");
    mode_ = !packing ? PackMode::kPad : split ? PackMode::kPackSplit : PackMode::kPackWhole;
    shuffle_ = o.get_bool("shuffle");
    skip_bad_ = o.get_string("on_error") == "skip";
    prefetch_ = o.get_int("prefetch_batches");
    build_threads_ = static_cast<int>(o.get_int("build_threads"));
    shard_mb_ = o.get_int("shard_size_mb");
    verify_ = o.get_bool("verify_checksums");
    pad_id_ = o.get_int("pad_id");
    config_ = std::make_unique<Config>(config);
  }

  ~CachedSsd() override {
    if (producer_) producer_->stop();
  }

  void open(const DataOpenArgs& a) override {
    if (a.seq_len < 1 || a.micro_batch_size < 1 || a.world_size < 1 || a.rank < 0 || a.rank >= a.world_size)
      throw Error("data plugin cached_ssd: bad open arguments (seq_len " + std::to_string(a.seq_len) +
                  ", micro_batch_size " + std::to_string(a.micro_batch_size) + ", rank " +
                  std::to_string(a.rank) + " of " + std::to_string(a.world_size) + ")");
    args_ = a;
    if (!a.tokenizer)
      throw UsageError("data plugin cached_ssd tokenizes its sources with the model's tokenizer, but the "
                       "recipe has none: set [model] tokenizer (a tokenizer.json) or [model] path");
    if (doc_.format == Format::kChat && !a.chat_template)
      throw UsageError("data plugin cached_ssd: format = \"chat\" needs the recipe's chat template "
                       "([model] chat_template), and none was given");
    doc_.tokenizer = a.tokenizer;
    doc_.chat_template = a.chat_template;
    if (pad_id_ < 0) pad_id_ = a.tokenizer->eos_id().value_or(0);

    CacheSettings s;
    s.train_files = resolve("sources", sources_);
    if (!eval_sources_.empty()) s.eval_files = resolve("eval_sources", eval_sources_);
    s.cache_dir = cache_dir_.empty() ? ctx_.output_dir + "/data-cache" : join_path(base_dir(), cache_dir_);
    if (cache_dir_.empty() && ctx_.output_dir.empty())
      throw UsageError("data plugin cached_ssd: cache_dir is not set and the run has no output_dir");
    s.doc = doc_;
    s.skip_bad_lines = skip_bad_;
    s.threads = build_threads_ > 0 ? build_threads_ : std::max(1u, std::thread::hardware_concurrency());
    s.shard_bytes = shard_mb_ << 20;
    s.verify_checksums = verify_;
    s.progress = ctx_.rank == 0;
    cache_ = TokenCache::open_or_build(s);

    // Splits.
    for (uint32_t i = 0; i < cache_->num_documents(); ++i)
      (cache_->doc(i).split == 0 ? train_docs_ : eval_docs_).push_back(i);
    if (eval_fraction_ > 0 && !train_docs_.empty()) hold_out();
    if (train_docs_.empty())
      throw Error("data plugin cached_ssd: the dataset is empty: no document with a training target in " +
                  join_list(s.train_files) + describe_dropped());
    if (!eval_sources_.empty() && eval_docs_.empty())
      throw Error("data plugin cached_ssd: eval_sources hold no document with a training target (" +
                  join_list(s.eval_files) + ")");
    if (!eval_docs_.empty()) {
      eval_plan_ = RowPlan(eval_docs_, length_fn(), a.seq_len, mode_);
      eval_batches_ = ceil_div(ceil_div(eval_plan_.num_rows(), a.world_size), a.micro_batch_size);
    }
    lookup_ = [c = cache_.get()](uint32_t d) {
      const DocRecord& r = c->doc(d);
      return DocView{c->ids(r), c->mask(r), r.num_tokens};
    };
    producer_ = std::make_unique<Producer<Item>>(static_cast<size_t>(prefetch_), [this] { return produce(); });
    seek_to(Pos{});
  }

  Batch next() override {
    check_open();
    Item it = producer_->pop(&wait_s_);
    next_ = it.after;
    tokens_delivered_ += it.tokens;
    ++batches_delivered_;
    return std::move(it.batch);
  }

  std::string cursor() const override {
    check_open();
    return nlohmann::json{{"epoch", next_.epoch}, {"row", next_.row}}.dump();
  }

  void seek(const std::string& cursor) override {
    check_open();
    nlohmann::json j = nlohmann::json::parse(cursor, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("epoch") || !j.contains("row") ||
        !j["epoch"].is_number_integer() || !j["row"].is_number_integer() || j["epoch"].get<int64_t>() < 0 ||
        j["row"].get<int64_t>() < 0)
      throw Error("data plugin cached_ssd: bad cursor '" + cursor +
                  "': expected {\"epoch\": <int >= 0>, \"row\": <int >= 0>}");
    seek_to(Pos{j["epoch"].get<int64_t>(), j["row"].get<int64_t>()});
  }

  int64_t epoch() const override { return next_.epoch; }

  bool has_eval() const override { return !eval_docs_.empty(); }
  void begin_eval() override { eval_next_ = 0; }
  std::optional<Batch> next_eval() override {
    check_open();
    if (eval_docs_.empty() || eval_next_ >= eval_batches_) return std::nullopt;
    const int64_t mb = args_.micro_batch_size, T = args_.seq_len;
    Batch b = alloc_batch();
    for (int64_t i = 0; i < mb; ++i) {
      const int64_t local = eval_next_ * mb + i;
      const int64_t row = local * args_.world_size + args_.rank;
      int64_t* ids = b.input_ids.data_ptr<int64_t>() + i * T;
      int64_t* lab = b.labels.data_ptr<int64_t>() + i * T;
      int64_t* pos = b.position_ids.data_ptr<int64_t>() + i * T;
      if (row < eval_plan_.num_rows()) {
        RowCounts c = fill_row(eval_plan_, row, lookup_, T, pad_id_, ids, lab, pos, eval_scratch_);
        b.num_label_tokens += c.label_tokens;
        b.num_documents += c.documents;
      } else {
        fill_padding_row(T, pad_id_, ids, lab, pos);  // this rank's part ran out: no loss
      }
    }
    ++eval_next_;
    return b;
  }

  void append_metrics(Metrics& m) const override {
    if (!cache_) return;
    const CacheStats& s = cache_->stats();
    m.set("data_epoch", static_cast<double>(next_.epoch));
    m.set("data_tokens", static_cast<double>(tokens_delivered_));
    m.set("data_batches", static_cast<double>(batches_delivered_));
    m.set("data_wait_s", wait_s_);
    const double busy = fill_s_.load();
    m.set("data_fill_tokens_per_s", busy > 0 ? tokens_filled_.load() / busy : 0.0);
    m.set("data_cache_hit", s.hit ? 1.0 : 0.0);
    m.set("data_cache_open_s", s.open_seconds);
    m.set("data_cache_build_s", s.build_seconds);
    m.set("data_tokenized_documents", s.built_here ? static_cast<double>(s.documents) : 0.0);
    m.set("data_skipped_lines", static_cast<double>(s.skipped_lines));
    m.set("data_truncated_tokens", static_cast<double>(truncated_tokens_.load()));
    m.set("data_train_documents", static_cast<double>(train_docs_.size()));
    m.set("data_eval_documents", static_cast<double>(eval_docs_.size()));
  }

 private:
  static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
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
      d += "; " + std::to_string(s.no_loss_documents) + " document(s) without a training target (e.g. no assistant reply)";
    if (s.skipped_lines) d += "; " + std::to_string(s.skipped_lines) + " bad line(s) skipped";
    return d;
  }
  std::string base_dir() const { return ctx_.recipe_dir.empty() ? "." : ctx_.recipe_dir; }
  void check_open() const {
    if (!cache_) throw Error("data plugin cached_ssd: used before open()");
  }
  std::function<uint32_t(uint32_t)> length_fn() const {
    return [c = cache_.get()](uint32_t d) { return c->doc(d).num_tokens; };
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
        config_->fail(key, p + " is not a regular file (expected a JSONL or text file, not a folder, FIFO or device)");
    }
    return out;
  }

  // Moves round(n * eval_fraction) documents (at least 1) of the train split to eval, chosen by a
  // hash of their position in the cache: fixed by the data, the same for every seed and rank.
  void hold_out() {
    const size_t n = train_docs_.size();
    if (n < 2) return;  // nothing to spare: no eval split
    const size_t k = std::clamp<size_t>(static_cast<size_t>(std::llround(n * eval_fraction_)), 1, n - 1);
    std::vector<std::pair<uint64_t, uint32_t>> keyed;
    keyed.reserve(n);
    for (uint32_t d : train_docs_) keyed.emplace_back(mix64(d ^ 0xE7A1C0DEULL), d);
    std::nth_element(keyed.begin(), keyed.begin() + static_cast<std::ptrdiff_t>(k), keyed.end());
    std::vector<uint32_t> eval;
    for (size_t i = 0; i < k; ++i) eval.push_back(keyed[i].second);
    std::sort(eval.begin(), eval.end());
    std::vector<uint32_t> train;
    train.reserve(n - k);
    std::set_difference(train_docs_.begin(), train_docs_.end(), eval.begin(), eval.end(), std::back_inserter(train));
    train_docs_ = std::move(train);
    eval_docs_ = std::move(eval);
  }

  Batch alloc_batch() const {
    const int64_t mb = args_.micro_batch_size, T = args_.seq_len;
    at::Tensor all = at::empty({3, mb, T}, at::TensorOptions().dtype(at::kLong).pinned_memory(args_.pin_memory));
    Batch b;
    b.input_ids = all[0];
    b.labels = all[1];
    b.position_ids = all[2];
    return b;
  }

  // Producer side (the prefetch thread, or the caller with prefetch_batches = 0).
  const RowPlan& plan_for(int64_t epoch) {
    if (plan_epoch_ != epoch) {
      std::vector<uint32_t> order = train_docs_;
      if (shuffle_) {
        auto perm = permutation(static_cast<uint32_t>(order.size()), args_.seed, static_cast<uint64_t>(epoch));
        for (size_t i = 0; i < order.size(); ++i) order[i] = train_docs_[perm[i]];
      }
      plan_ = RowPlan(std::move(order), length_fn(), args_.seq_len, mode_);
      plan_epoch_ = epoch;
      truncated_tokens_ = plan_.truncated_tokens();
      if (plan_.truncated_documents() && !warned_truncation_) {
        warned_truncation_ = true;
        log_warn("data plugin cached_ssd: " + std::to_string(plan_.truncated_documents()) +
                 " document(s) are longer than seq_len " + std::to_string(args_.seq_len) + " and lose " +
                 std::to_string(plan_.truncated_tokens()) +
                 " tokens per epoch (set split_documents = true to keep them)");
      }
    }
    return plan_;
  }

  Item produce() {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t mb = args_.micro_batch_size, T = args_.seq_len;
    Item it;
    it.batch = alloc_batch();
    for (int64_t i = 0; i < mb; ++i) {
      const RowPlan* p = &plan_for(prod_.epoch);
      const int64_t row = (prod_.row + args_.rank) % p->num_rows();  // past the end: wrap around
      RowCounts c = fill_row(*p, row, lookup_, T, pad_id_, it.batch.input_ids.data_ptr<int64_t>() + i * T,
                             it.batch.labels.data_ptr<int64_t>() + i * T,
                             it.batch.position_ids.data_ptr<int64_t>() + i * T, scratch_);
      it.batch.num_label_tokens += c.label_tokens;
      it.batch.num_documents += c.documents;
      it.tokens += c.tokens;
      prod_.row += args_.world_size;
      if (prod_.row >= p->num_rows()) prod_ = Pos{prod_.epoch + 1, 0};
    }
    it.after = prod_;
    tokens_filled_ += it.tokens;
    fill_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return it;
  }

  void seek_to(Pos p) {
    producer_->stop();
    // Normalise a row past the end of its epoch (e.g. a cursor saved with another dataset).
    const RowPlan& plan = plan_for(p.epoch);
    if (p.row >= plan.num_rows()) p = Pos{p.epoch + 1, 0};
    next_ = p;
    prod_ = p;
    producer_->start();
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
  DataOpenArgs args_;
  std::unique_ptr<TokenCache> cache_;
  std::vector<uint32_t> train_docs_, eval_docs_;
  DocLookup lookup_;
  RowPlan eval_plan_;
  int64_t eval_batches_ = 0, eval_next_ = 0;
  std::vector<RowPlan::Segment> eval_scratch_;
  // producer-side state (touched by the producer thread only while it runs)
  RowPlan plan_;
  int64_t plan_epoch_ = -1;
  Pos prod_;
  std::vector<RowPlan::Segment> scratch_;
  bool warned_truncation_ = false;
  std::unique_ptr<Producer<Item>> producer_;
  // consumer-side state
  Pos next_;
  int64_t tokens_delivered_ = 0, batches_delivered_ = 0;
  double wait_s_ = 0;
  std::atomic<int64_t> tokens_filled_{0};
  std::atomic<double> fill_s_{0};
  std::atomic<uint64_t> truncated_tokens_{0};
};

}  // namespace
}  // namespace ciuic::data

CIUIC_DEFINE_PLUGIN(ciuic::Slot::kData, "cached_ssd", "1.0.0",
                    "JSONL text/chat tokenized once into a memory-mapped token cache; packed, shuffled, "
                    "rank-sliced, prefetched",
                    ciuic::data::kOptions, [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
                      return new ciuic::data::CachedSsd(a.config, a.context);
                    })
