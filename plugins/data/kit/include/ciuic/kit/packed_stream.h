// ciuic/kit/packed_stream.h — part of the data kit (libciuic_data_kit.a; a static library data
// plugins link, not part of the SDK's ABI): everything a data source does after it has documents.
//
// A data plugin that can list its documents (token ids plus a per-token loss mask) hands them to a
// PackedStream and forwards the DataSource calls (ciuic/data.h) to it: next(), cursor(), seek(),
// epoch(), has_eval(), begin_eval(), next_eval(), append_metrics(). The stream
//   - shuffles the training documents every epoch with permutation(n, seed, epoch)
//     (ciuic/kit/sampler.h), unless Settings::shuffle is false;
//   - packs them into rows of seq_len tokens by Settings::mode (ciuic/kit/packing.h: labels
//     shifted, -100 where no loss is taken, position_ids restarting at every document);
//   - deals global rows to ranks and keeps the global cursor {"epoch","row"} (sampler.h), so a
//     checkpoint resumes exactly, on any world size and micro-batch size;
//   - lays the eval documents out in their given order, the same number of batches on every rank;
//   - prepares Settings::prefetch_batches batches ahead on one background thread.
// `cached_ssd` is this plus a token cache; examples/lines_plugin is this plus a text file.
//
// Ownership: `lookup` must stay valid, and the token memory it points into unchanged, for the
// stream's lifetime; it is called from the prefetch thread (so it must be safe to call
// concurrently with the owner's thread) and must return the same tokens for a document every time.
// Threading: one owner thread calls every member; the stream runs its own prefetch thread.
// Failure: ciuic::Error starting with Settings::who (e.g. "data plugin lines: ..."): no training
// documents, a bad cursor, bad open arguments; an exception from `lookup` reaches next().
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ciuic/context.h>
#include <ciuic/data.h>
#include <ciuic/kit/packing.h>
#include <ciuic/kit/prefetch.h>
#include <ciuic/kit/sampler.h>
#include <ciuic/metrics.h>

namespace ciuic::kit {

// DataSource::open's arguments with the rank, world size and seed of the RunContext: what a
// stream needs to deal global rows.
struct StreamArgs : DataOpenArgs {
  uint64_t seed = 0;
  int rank = 0;
  int world_size = 1;
  StreamArgs() = default;
  StreamArgs(const DataOpenArgs& a, const RunContext& ctx)
      : DataOpenArgs(a), seed(ctx.seed), rank(ctx.rank), world_size(ctx.world_size) {}
};

class PackedStream {
 public:
  struct Settings {
    std::string who = "data plugin";  // prefix of messages: "data plugin <name>"
    PackMode mode = PackMode::kPackWhole;
    bool shuffle = true;
    int64_t pad_id = 0;           // token id written into padding (labels there are -100)
    size_t prefetch_batches = 4;  // 0: batches are made on the caller's thread
    std::string truncation_hint;  // appended to the warning about documents longer than seq_len
  };

  // `args`: DataSource::open's (seq_len, micro_batch_size, pin_memory) and the context's seed,
  // rank and world_size.
  // `train`, `eval`: document numbers (as `lookup` knows them) in their unshuffled order; `eval`
  // may be empty (no held-out split). Starts at cursor {"epoch":0,"row":0}.
  PackedStream(const StreamArgs& args, Settings settings, std::vector<uint32_t> train,
               std::vector<uint32_t> eval, DocLookup lookup);
  ~PackedStream();
  PackedStream(const PackedStream&) = delete;
  PackedStream& operator=(const PackedStream&) = delete;

  Batch next();
  std::string cursor() const { return next_.to_json(); }
  void seek(const std::string& cursor);
  int64_t epoch() const { return next_.epoch; }

  bool has_eval() const { return !eval_docs_.empty(); }
  void begin_eval() { eval_next_ = 0; }
  std::optional<Batch> next_eval();

  // data_tokens, data_batches, data_wait_s, data_fill_tokens_per_s,
  // data_truncated_tokens, data_train_documents, data_eval_documents.
  void append_metrics(Metrics& m) const;

 private:
  struct Item {
    Batch batch;
    RowCursor after;
    int64_t tokens = 0;
  };
  Batch alloc_batch() const;
  const RowPlan& plan_for(int64_t epoch);
  Item produce();
  void seek_to(RowCursor c);

  StreamArgs args_;
  Settings s_;
  std::vector<uint32_t> train_docs_, eval_docs_;
  DocLookup lookup_;
  std::function<uint32_t(uint32_t)> length_;
  RowPlan eval_plan_;
  int64_t eval_batches_ = 0, eval_next_ = 0;
  std::vector<RowPlan::Segment> eval_scratch_;
  // producer side (the prefetch thread while it runs)
  RowPlan plan_;
  int64_t plan_epoch_ = -1;
  RowCursor prod_;
  std::vector<RowPlan::Segment> scratch_;
  bool warned_truncation_ = false;
  std::unique_ptr<Producer<Item>> producer_;
  // owner side
  RowCursor next_;
  int64_t tokens_delivered_ = 0, batches_delivered_ = 0;
  double wait_s_ = 0;
  std::atomic<int64_t> tokens_filled_{0};
  std::atomic<double> fill_s_{0};
  std::atomic<uint64_t> truncated_tokens_{0};
};

}  // namespace ciuic::kit
