// The `synthetic` data source: generated tokens, no I/O — for benchmarks, tests and smoke runs.
//
// Row r of epoch e (r counts global rows; rank k of W reads rows k, k+W, ... like cached_ssd) is a
// pure function of (seed, e, r): batches are reproducible on any world size, and cursor()/seek()
// ({"epoch", "row"}) are exact. Each row holds `documents_per_row` documents at random cut points
// (positions restart at 0, the last token of each document has label -100). Patterns:
//   random     uniform ids in [0, vocab_size)
//   repeat     a random motif of `period` ids repeated (learnable: an induction-head task)
//   increment  a random start s, then s+1, s+2, ... mod vocab_size (learnable: "add one")
// Every other position has a label (the next id). The eval split (eval_rows > 0) is a separate
// fixed stream of rows.
#define CIUIC_PLUGIN_API 7
#include <algorithm>
#include <string>
#include <vector>

#include <ATen/ops/empty.h>

#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/data.h>
#include <ciuic/error.h>
#include <ciuic/kit/packing.h>
#include <ciuic/kit/sampler.h>
#include <ciuic/plugin.h>

namespace {

using namespace ciuic;
using kit::eval_batches_per_rank;
using kit::fill_padding_row;
using kit::mix64;
using kit::RowCursor;

constexpr Option<int64_t> kVocabSize{"vocab_size", nullptr, "ids are drawn from [0, vocab_size)", 2,
                                     NAN};
constexpr Option<std::string> kPattern{
    "pattern", "\"random\"", "random | repeat (a motif repeated) | increment (s, s+1, ...)",
    NAN,       NAN,          "random|repeat|increment"};
constexpr Option<int64_t> kPeriod{"period", "8", "motif length of pattern = \"repeat\"", 1, NAN};
constexpr Option<int64_t> kDocumentsPerRow{"documents_per_row", "1",
                                           "documents packed in each row (random lengths)", 1, NAN};
constexpr Option<int64_t> kRowsPerEpoch{"rows_per_epoch", "1048576", "global rows in one epoch", 1,
                                        NAN};
constexpr Option<int64_t> kEvalRows{"eval_rows", "0",
                                    "global rows of the eval split (0 = no eval split)", 0, NAN};
const OptionSpec kOptions[] = {kVocabSize,       kPattern,      kPeriod,
                               kDocumentsPerRow, kRowsPerEpoch, kEvalRows};

enum class Pattern { kRandom, kRepeat, kIncrement };

class Synthetic final : public DataSource {
 public:
  Synthetic(const Config& config, const RunContext& ctx)
      : rank_(ctx.rank), world_(ctx.world_size), seed_(ctx.seed) {
    vocab_ = config.get(kVocabSize);
    const std::string p = config.get(kPattern);
    if (p == "random")
      pattern_ = Pattern::kRandom;
    else if (p == "repeat")
      pattern_ = Pattern::kRepeat;
    else
      pattern_ = Pattern::kIncrement;  // the declared choices are checked by get
    period_ = config.get(kPeriod);
    docs_per_row_ = config.get(kDocumentsPerRow);
    rows_per_epoch_ = config.get(kRowsPerEpoch);
    eval_rows_ = config.get(kEvalRows);
  }

  void open(const DataOpenArgs& a) override {
    if (a.seq_len < 1 || a.micro_batch_size < 1 || world_ < 1 || rank_ < 0 || rank_ >= world_)
      throw Error("data plugin synthetic: bad open arguments (seq_len " +
                  std::to_string(a.seq_len) + ", micro_batch_size " +
                  std::to_string(a.micro_batch_size) + ", rank " + std::to_string(rank_) + " of " +
                  std::to_string(world_) + ")");
    args_ = a;
    opened_ = true;
  }

  Batch next() override {
    check_open();
    Batch b = alloc();
    for (int64_t i = 0; i < args_.micro_batch_size; ++i) {
      const int64_t global = (row_ + rank_) % rows_per_epoch_;  // past the end: wrap around
      fill(b, i, mix64(seed_) ^ mix64(static_cast<uint64_t>(epoch_) * 0x100000001B3ULL + global));
      row_ += world_;
      if (row_ >= rows_per_epoch_) {
        ++epoch_;
        row_ = 0;
      }
    }
    tokens_ += args_.micro_batch_size * args_.seq_len;
    return b;
  }

  std::string cursor() const override { return RowCursor{epoch_, row_}.to_json(); }

  void seek(const std::string& cursor) override {
    const RowCursor c = RowCursor::parse(cursor, "data plugin synthetic");
    epoch_ = c.epoch;
    row_ = c.row;
    if (row_ >= rows_per_epoch_) {
      ++epoch_;
      row_ = 0;
    }
  }

  int64_t epoch() const override { return epoch_; }

  bool has_eval() const override { return eval_rows_ > 0; }
  void begin_eval() override { eval_next_ = 0; }
  std::optional<Batch> next_eval() override {
    check_open();
    const int64_t batches = eval_batches_per_rank(eval_rows_, world_, args_.micro_batch_size);
    if (eval_rows_ == 0 || eval_next_ >= batches) return std::nullopt;
    Batch b = alloc();
    const int64_t T = args_.seq_len;
    for (int64_t i = 0; i < args_.micro_batch_size; ++i) {
      const int64_t global = (eval_next_ * args_.micro_batch_size + i) * world_ + rank_;
      if (global < eval_rows_) {
        fill(b, i, mix64(seed_ ^ 0xE7A1ULL) ^ mix64(~static_cast<uint64_t>(global)));
      } else {  // this rank's share ran out: an empty row (no loss) keeps batch counts equal
        fill_padding_row(T, 0, b.input_ids.data_ptr<int64_t>() + i * T,
                         b.labels.data_ptr<int64_t>() + i * T,
                         b.position_ids.data_ptr<int64_t>() + i * T);
      }
    }
    ++eval_next_;
    return b;
  }

  void append_metrics(Metrics& m) const override {
    m.set("data_tokens", static_cast<double>(tokens_));
  }

 private:
  void check_open() const {
    if (!opened_) throw Error("data plugin synthetic: used before open()");
  }

  Batch alloc() const {
    at::Tensor all =
        at::empty({3, args_.micro_batch_size, args_.seq_len},
                  at::TensorOptions().dtype(at::kLong).pinned_memory(args_.pin_memory));
    Batch b;
    b.input_ids = all[0];
    b.labels = all[1];
    b.position_ids = all[2];
    return b;
  }

  // Row i of batch b from the random stream `state`.
  void fill(Batch& b, int64_t i, uint64_t state) const {
    auto next = [&] { return mix64(state++); };
    const int64_t T = args_.seq_len;
    int64_t* ids = b.input_ids.data_ptr<int64_t>() + i * T;
    int64_t* labels = b.labels.data_ptr<int64_t>() + i * T;
    int64_t* pos = b.position_ids.data_ptr<int64_t>() + i * T;
    // Document starts: 0 and documents_per_row - 1 distinct random cuts in [1, T).
    std::vector<int64_t> starts{0};
    const int64_t cuts = std::min<int64_t>(docs_per_row_, T) - 1;
    while (static_cast<int64_t>(starts.size()) < cuts + 1) {
      int64_t c = 1 + static_cast<int64_t>(next() % static_cast<uint64_t>(T - 1));
      if (std::find(starts.begin(), starts.end(), c) == starts.end()) starts.push_back(c);
    }
    std::sort(starts.begin(), starts.end());
    starts.push_back(T);
    std::vector<int64_t> motif(static_cast<size_t>(period_));
    const uint64_t V = static_cast<uint64_t>(vocab_);
    for (size_t d = 0; d + 1 < starts.size(); ++d) {
      const int64_t b0 = starts[d], n = starts[d + 1] - b0;
      const uint64_t start = next() % V;
      if (pattern_ == Pattern::kRepeat)
        for (auto& m : motif) m = static_cast<int64_t>(next() % V);
      for (int64_t k = 0; k < n; ++k) {
        switch (pattern_) {
          case Pattern::kRandom: ids[b0 + k] = static_cast<int64_t>(next() % V); break;
          case Pattern::kRepeat: ids[b0 + k] = motif[static_cast<size_t>(k % period_)]; break;
          case Pattern::kIncrement:
            ids[b0 + k] = static_cast<int64_t>((start + static_cast<uint64_t>(k)) % V);
            break;
        }
        pos[b0 + k] = k;
      }
      for (int64_t k = 0; k + 1 < n; ++k) labels[b0 + k] = ids[b0 + k + 1];
      labels[b0 + n - 1] = -100;
    }
    b.num_label_tokens += T - static_cast<int64_t>(starts.size() - 1);
    b.num_documents += static_cast<int64_t>(starts.size() - 1);
  }

  int64_t vocab_ = 0, period_ = 8, docs_per_row_ = 1, rows_per_epoch_ = 1, eval_rows_ = 0;
  Pattern pattern_ = Pattern::kRandom;
  int rank_, world_;  // the RunContext's
  uint64_t seed_;
  DataOpenArgs args_;
  bool opened_ = false;
  int64_t epoch_ = 0, row_ = 0, eval_next_ = 0, tokens_ = 0;
};

}  // namespace

CIUIC_DEFINE_PLUGIN(ciuic::Slot::kData, "synthetic", "1.0.0",
                    "generated token rows (random, repeated motif or increment), no I/O", kOptions,
                    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
                      return new Synthetic(a.config, a.context);
                    })
