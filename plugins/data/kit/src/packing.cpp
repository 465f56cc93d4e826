// The data kit: rows from documents (ciuic/kit/packing.h).
#include <ciuic/kit/packing.h>

#include <algorithm>

namespace ciuic::kit {

RowPlan::RowPlan(std::vector<uint32_t> order, const std::function<uint32_t(uint32_t)>& length,
                 int64_t seq_len, PackMode mode)
    : order_(std::move(order)), seq_len_(seq_len), mode_(mode) {
  const size_t n = order_.size();
  lengths_.resize(n);
  for (size_t i = 0; i < n; ++i) lengths_[i] = length(order_[i]);
  const uint64_t T = static_cast<uint64_t>(seq_len);
  auto count_truncation = [&](uint32_t len) {
    if (len > T) {
      truncated_tokens_ += len - T;
      ++truncated_docs_;
    }
  };
  switch (mode) {
    case PackMode::kPad:
      for (uint32_t len : lengths_) count_truncation(len);
      num_rows_ = static_cast<int64_t>(n);
      break;
    case PackMode::kPackSplit: {
      starts_.resize(n + 1);
      uint64_t o = 0;
      for (size_t i = 0; i < n; ++i) {
        starts_[i] = o;
        o += lengths_[i];
      }
      starts_[n] = o;
      num_rows_ = static_cast<int64_t>((o + T - 1) / T);
      break;
    }
    case PackMode::kPackWhole: {
      uint64_t used = T;  // forces a new row for the first document
      for (size_t i = 0; i < n; ++i) {
        count_truncation(lengths_[i]);
        const uint64_t len = std::min<uint64_t>(lengths_[i], T);
        if (used + len > T) {
          row_first_.push_back(static_cast<uint32_t>(i));
          used = 0;
        }
        used += len;
      }
      num_rows_ = static_cast<int64_t>(row_first_.size());
      row_first_.push_back(static_cast<uint32_t>(n));
      break;
    }
  }
}

void RowPlan::segments(int64_t row, std::vector<Segment>& out) const {
  out.clear();
  const uint64_t T = static_cast<uint64_t>(seq_len_);
  switch (mode_) {
    case PackMode::kPad:
      out.push_back(
          {order_[row], 0, static_cast<uint32_t>(std::min<uint64_t>(lengths_[row], T)), false});
      break;
    case PackMode::kPackWhole:
      for (uint32_t i = row_first_[row]; i < row_first_[row + 1]; ++i)
        out.push_back(
            {order_[i], 0, static_cast<uint32_t>(std::min<uint64_t>(lengths_[i], T)), false});
      break;
    case PackMode::kPackSplit: {
      uint64_t o = static_cast<uint64_t>(row) * T;
      const uint64_t end = std::min(o + T, starts_.back());
      size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), o) -
                                     starts_.begin()) -
                 1;
      while (o < end) {
        while (starts_[i + 1] <= o) ++i;  // skips empty documents (none in a cache, but cheap)
        const uint64_t doc_end = starts_[i + 1];
        const uint64_t stop = std::min(end, doc_end);
        out.push_back({order_[i], static_cast<uint32_t>(o - starts_[i]),
                       static_cast<uint32_t>(stop - o), stop < doc_end});
        o = stop;
      }
      break;
    }
  }
}

void fill_padding_row(int64_t seq_len, int64_t pad_id, int64_t* ids, int64_t* labels,
                      int64_t* pos) {
  for (int64_t t = 0; t < seq_len; ++t) {
    ids[t] = pad_id;
    labels[t] = -100;
    pos[t] = t;
  }
}

RowCounts fill_row(const RowPlan& plan, int64_t row, const DocLookup& docs, int64_t seq_len,
                   int64_t pad_id, int64_t* ids, int64_t* labels, int64_t* pos,
                   std::vector<RowPlan::Segment>& scratch) {
  RowCounts c;
  plan.segments(row, scratch);
  int64_t t = 0;
  for (const auto& s : scratch) {
    const DocView d = docs(s.doc);
    const uint32_t* id = d.ids + s.begin;
    const uint8_t* m = d.mask + s.begin;
    const int64_t n = s.size;
    for (int64_t k = 0; k < n; ++k) {
      ids[t + k] = id[k];
      pos[t + k] = k;
    }
    for (int64_t k = 0; k + 1 < n; ++k)
      labels[t + k] = m[k + 1] ? static_cast<int64_t>(id[k + 1]) : -100;
    // The piece's last token: the document's next token when it continues in the next row.
    labels[t + n - 1] = (s.continues && m[n]) ? static_cast<int64_t>(id[n]) : -100;
    for (int64_t k = 0; k < n; ++k) c.label_tokens += labels[t + k] != -100;
    t += n;
    ++c.documents;
  }
  c.tokens = t;
  if (t < seq_len) fill_padding_row(seq_len - t, pad_id, ids + t, labels + t, pos + t);
  return c;
}

}  // namespace ciuic::kit
