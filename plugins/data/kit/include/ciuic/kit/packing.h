// ciuic/kit/packing.h — part of the data kit (libciuic_data_kit.a; a static library data plugins
// link, not part of the SDK's ABI): how documents become rows of seq_len tokens.
//
// An epoch lays the split's documents out in an order (shuffled from (seed, epoch), or fixed for
// eval) and cuts the sequence into rows by one of three modes:
//   kPad        one document per row, truncated to seq_len, the rest padded
//   kPackWhole  documents placed whole, in order, into the current row while they fit; a document
//               that does not fit starts the next row (the rest of the row is padding); documents
//               longer than seq_len are truncated
//   kPackSplit  documents concatenated and cut every seq_len tokens (no padding but in the last
//               row); a document cut at a row end continues at the start of the next row
// Truncated tokens are counted (RowPlan::truncated_tokens).
//
// fill_row() writes one row: input_ids, labels (labels[t] = input_ids[t+1] of the same document
// when that token carries loss, else -100; the last token of a document is -100; the last token
// of a piece that continues in the next row keeps its label: the document's next token) and
// position_ids (0 at the start of every document or piece, counting up; padding is a pseudo
// document of its own with position_ids restarting at 0 and labels -100).
//
// Thread-safety: RowPlan is immutable after construction; fill_row is reentrant.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace ciuic::kit {

enum class PackMode { kPad, kPackWhole, kPackSplit };

struct DocView {
  const uint32_t* ids;
  const uint8_t* mask;  // 1 = the token is a training target
  uint32_t size;
};
using DocLookup = std::function<DocView(uint32_t doc)>;

class RowPlan {
 public:
  RowPlan() = default;
  // `order`: document numbers in layout order; `length(doc)` their token counts.
  RowPlan(std::vector<uint32_t> order, const std::function<uint32_t(uint32_t)>& length,
          int64_t seq_len, PackMode mode);

  int64_t num_rows() const { return num_rows_; }
  uint64_t truncated_tokens() const { return truncated_tokens_; }
  uint64_t truncated_documents() const { return truncated_docs_; }

  struct Segment {
    uint32_t doc;
    uint32_t begin;  // first token of the document in this row
    uint32_t size;
    bool continues;  // the document goes on in the next row (kPackSplit)
  };
  // The pieces of documents in row `row` (0 <= row < num_rows()), in order.
  void segments(int64_t row, std::vector<Segment>& out) const;

 private:
  std::vector<uint32_t> order_;
  std::vector<uint32_t> lengths_;  // per position in order_
  std::vector<uint64_t> starts_;   // kPackSplit: stream offset of order_[i]; size n+1
  std::vector<uint32_t>
      row_first_;  // kPackWhole: first position in order_ of each row; size rows+1
  int64_t seq_len_ = 0;
  PackMode mode_ = PackMode::kPackSplit;
  int64_t num_rows_ = 0;
  uint64_t truncated_tokens_ = 0, truncated_docs_ = 0;
};

struct RowCounts {
  int64_t label_tokens = 0;  // labels != -100
  int64_t documents = 0;     // documents or pieces of documents
  int64_t tokens = 0;        // non-padding tokens
};

// Writes row `row` of `plan` into ids/labels/pos (seq_len entries each).
RowCounts fill_row(const RowPlan& plan, int64_t row, const DocLookup& docs, int64_t seq_len,
                   int64_t pad_id, int64_t* ids, int64_t* labels, int64_t* pos,
                   std::vector<RowPlan::Segment>& scratch);

// Fills an all-padding row (labels -100): eval batches past the end of the split.
void fill_padding_row(int64_t seq_len, int64_t pad_id, int64_t* ids, int64_t* labels, int64_t* pos);

}  // namespace ciuic::kit
