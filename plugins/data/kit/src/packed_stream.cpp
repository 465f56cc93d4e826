// The data kit: documents to batches (ciuic/kit/packed_stream.h).
#include <ciuic/kit/packed_stream.h>

#include <chrono>
#include <utility>

#include <ATen/ops/empty.h>

#include <ciuic/error.h>
#include <ciuic/log.h>
#include <ciuic/metrics.h>

namespace ciuic::kit {

PackedStream::PackedStream(const StreamArgs& args, Settings settings, std::vector<uint32_t> train,
                           std::vector<uint32_t> eval, DocLookup lookup)
    : args_(args),
      s_(std::move(settings)),
      train_docs_(std::move(train)),
      eval_docs_(std::move(eval)),
      lookup_(std::move(lookup)) {
  if (args_.seq_len < 1 || args_.micro_batch_size < 1 || args_.world_size < 1 || args_.rank < 0 ||
      args_.rank >= args_.world_size)
    throw Error(s_.who + ": bad open arguments (seq_len " + std::to_string(args_.seq_len) +
                ", micro_batch_size " + std::to_string(args_.micro_batch_size) + ", rank " +
                std::to_string(args_.rank) + " of " + std::to_string(args_.world_size) + ")");
  if (train_docs_.empty()) throw Error(s_.who + ": no training documents");
  if (!lookup_) throw Error(s_.who + ": PackedStream needs a document lookup");
  length_ = [this](uint32_t d) { return lookup_(d).size; };
  if (!eval_docs_.empty()) {
    eval_plan_ = RowPlan(eval_docs_, length_, args_.seq_len, s_.mode);
    eval_batches_ =
        eval_batches_per_rank(eval_plan_.num_rows(), args_.world_size, args_.micro_batch_size);
  }
  producer_ = std::make_unique<Producer<Item>>(s_.prefetch_batches, [this] { return produce(); });
  seek_to(RowCursor{});
}

PackedStream::~PackedStream() {
  if (producer_) producer_->stop();
}

Batch PackedStream::next() {
  Item it = producer_->pop(&wait_s_);
  next_ = it.after;
  tokens_delivered_ += it.tokens;
  ++batches_delivered_;
  return std::move(it.batch);
}

void PackedStream::seek(const std::string& cursor) { seek_to(RowCursor::parse(cursor, s_.who)); }

std::optional<Batch> PackedStream::next_eval() {
  if (eval_docs_.empty() || eval_next_ >= eval_batches_) return std::nullopt;
  const int64_t mb = args_.micro_batch_size, T = args_.seq_len;
  Batch b = alloc_batch();
  for (int64_t i = 0; i < mb; ++i) {
    const int64_t row = (eval_next_ * mb + i) * args_.world_size + args_.rank;
    int64_t* ids = b.input_ids.data_ptr<int64_t>() + i * T;
    int64_t* lab = b.labels.data_ptr<int64_t>() + i * T;
    int64_t* pos = b.position_ids.data_ptr<int64_t>() + i * T;
    if (row < eval_plan_.num_rows()) {
      const RowCounts c =
          fill_row(eval_plan_, row, lookup_, T, s_.pad_id, ids, lab, pos, eval_scratch_);
      b.num_label_tokens += c.label_tokens;
      b.num_documents += c.documents;
    } else {
      fill_padding_row(T, s_.pad_id, ids, lab, pos);  // this rank's part ran out: no loss
    }
  }
  ++eval_next_;
  return b;
}

void PackedStream::append_metrics(Metrics& m) const {
  m.set("data_tokens", static_cast<double>(tokens_delivered_));
  m.set("data_batches", static_cast<double>(batches_delivered_));
  m.set("data_wait_s", wait_s_);
  const double busy = fill_s_.load();
  m.set("data_fill_tokens_per_s",
        busy > 0 ? static_cast<double>(tokens_filled_.load()) / busy : 0.0);
  m.set("data_truncated_tokens", static_cast<double>(truncated_tokens_.load()));
  m.set("data_train_documents", static_cast<double>(train_docs_.size()));
  m.set("data_eval_documents", static_cast<double>(eval_docs_.size()));
}

Batch PackedStream::alloc_batch() const {
  const int64_t mb = args_.micro_batch_size, T = args_.seq_len;
  // One allocation for the three tensors (one pinned block on GPU runs).
  at::Tensor all =
      at::empty({3, mb, T}, at::TensorOptions().dtype(at::kLong).pinned_memory(args_.pin_memory));
  Batch b;
  b.input_ids = all[0];
  b.labels = all[1];
  b.position_ids = all[2];
  return b;
}

const RowPlan& PackedStream::plan_for(int64_t epoch) {
  if (plan_epoch_ != epoch) {
    std::vector<uint32_t> order = train_docs_;
    if (s_.shuffle) {
      const auto perm = permutation(static_cast<uint32_t>(order.size()), args_.seed,
                                    static_cast<uint64_t>(epoch));
      for (size_t i = 0; i < order.size(); ++i) order[i] = train_docs_[perm[i]];
    }
    plan_ = RowPlan(std::move(order), length_, args_.seq_len, s_.mode);
    plan_epoch_ = epoch;
    truncated_tokens_ = plan_.truncated_tokens();
    if (plan_.truncated_documents() && !warned_truncation_) {
      warned_truncation_ = true;
      log_warn(s_.who + ": " + std::to_string(plan_.truncated_documents()) +
               " document(s) are longer than seq_len " + std::to_string(args_.seq_len) +
               " and lose " + std::to_string(plan_.truncated_tokens()) + " tokens per epoch" +
               s_.truncation_hint);
    }
  }
  return plan_;
}

PackedStream::Item PackedStream::produce() {
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t mb = args_.micro_batch_size, T = args_.seq_len;
  Item it;
  it.batch = alloc_batch();
  for (int64_t i = 0; i < mb; ++i) {
    const RowPlan* p = &plan_for(prod_.epoch);
    const int64_t row = (prod_.row + args_.rank) % p->num_rows();  // past the end: wrap around
    const RowCounts c =
        fill_row(*p, row, lookup_, T, s_.pad_id, it.batch.input_ids.data_ptr<int64_t>() + i * T,
                 it.batch.labels.data_ptr<int64_t>() + i * T,
                 it.batch.position_ids.data_ptr<int64_t>() + i * T, scratch_);
    it.batch.num_label_tokens += c.label_tokens;
    it.batch.num_documents += c.documents;
    it.tokens += c.tokens;
    prod_.row += args_.world_size;
    if (prod_.row >= p->num_rows()) prod_ = RowCursor{prod_.epoch + 1, 0};
  }
  it.after = prod_;
  tokens_filled_ += it.tokens;
  fill_s_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return it;
}

void PackedStream::seek_to(RowCursor c) {
  producer_->stop();
  // A row past the end of its epoch (e.g. a cursor saved with another dataset) starts the next.
  if (c.row >= plan_for(c.epoch).num_rows()) c = RowCursor{c.epoch + 1, 0};
  next_ = c;
  prod_ = c;
  producer_->start();
}

}  // namespace ciuic::kit
