// ciuic/kit/sampler.h — part of the data kit (libciuic_data_kit.a; a static library data plugins
// link, not part of the SDK's ABI): deterministic shuffling and the global row cursor.
//
// The data slot's sampling rules (ciuic/data.h), which every in-tree source follows and which a
// plugin gets for free from PackedStream (ciuic/kit/packed_stream.h):
//   - an epoch is a sequence of global rows 0..R-1 (R may differ per epoch); training reads it in
//     global order, `world_size` rows at a time: rank k takes global row g + k, then g advances by
//     world_size, once per row of its micro-batch; a rank past the last row wraps to the start of
//     the same epoch (the last step of an epoch may reuse a few early rows), and the epoch ends
//     when g reaches R;
//   - the cursor is {"epoch": e, "row": g}: the same string on every rank after the same number
//     of next() calls, so a checkpoint resumes on any world size and micro-batch size;
//   - eval (a fixed order, no shuffling): every rank yields the same number of batches,
//     ceil(ceil(R / world_size) / micro_batch_size); its i-th row of batch b is global row
//     (b * micro_batch_size + i) * world_size + rank, or an all-padding row (labels -100) past R.
//
// Threading: everything here is a pure function or a value type.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ciuic::kit {

// SplitMix64's finaliser of x (a good 64-bit mix).
uint64_t mix64(uint64_t x);

// A deterministic permutation of 0..n-1 from (seed, stream): Fisher–Yates driven by a SplitMix64
// stream with Lemire's unbiased bounded draws — the same on every platform and standard library.
// The in-tree sources shuffle epoch e with permutation(n, seed, e).
std::vector<uint32_t> permutation(uint32_t n, uint64_t seed, uint64_t stream);

// The global position of the next training row (see above).
struct RowCursor {
  int64_t epoch = 0;
  int64_t row = 0;  // global row of rank 0's next row in the epoch; rank k reads row + k

  // {"epoch":e,"row":g} (compact JSON).
  std::string to_json() const;
  // Parses to_json()'s text. Throws ciuic::Error "<who>: bad cursor '...': expected ..." on
  // anything else (not JSON, missing keys, negative or non-integer values).
  static RowCursor parse(const std::string& text, const std::string& who);
};

// Eval batches per rank for an eval split of `rows` global rows (the same on every rank).
int64_t eval_batches_per_rank(int64_t rows, int64_t world_size, int64_t micro_batch_size);

}  // namespace ciuic::kit
