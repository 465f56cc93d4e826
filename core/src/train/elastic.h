// Internal: elastic resume — a checkpoint's global batch kept on another number of ranks.
//
// A resumed run must keep the checkpoint's global batch (rows per optimizer step:
// micro_batch_size x gradient_accumulation_steps x world size): the data position and the
// optimizer's trajectory are counted in it. When the recipe's batch keys are the ones the
// checkpoint was written with and only the world size changed, the run splits the same global
// batch over its ranks — the largest micro-batch not above the recipe's that divides the rows per
// rank, the rest as gradient accumulation — and says so in one log line. A world size that cannot
// split it is refused, naming the nearest that can.
//
// Pure arithmetic (no I/O); thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>

#include <ciuic/export.h>

namespace ciuic::train {

struct BatchSplit {
  int64_t micro_batch = 0;
  int64_t accumulation = 0;
};

// `global_rows` over `world` ranks with micro-batches of at most `max_micro` rows: the largest
// micro-batch <= max_micro that divides global_rows / world. nullopt when world does not divide
// global_rows or an argument is < 1.
CIUIC_API std::optional<BatchSplit> split_global_batch(int64_t global_rows, int64_t world,
                                                       int64_t max_micro);

// The world sizes next to `world` that divide `global_rows`: the largest below it and the smallest
// above it (at most global_rows, and at most kNearestWorldSearch above `world`: the search costs
// one division per size, and a damaged trainer.json's prime row count near 2^63 would take hours);
// 0 where there is none.
inline constexpr int64_t kNearestWorldSearch = int64_t{1} << 16;
CIUIC_API std::pair<int64_t, int64_t> nearest_world_sizes(int64_t global_rows, int64_t world);

struct ElasticSplit {
  bool changed = false;  // false: keep the recipe's micro_batch_size and accumulation
  BatchSplit split;      // when changed
  std::string message;   // when changed: the log line
};

// The batch split of a run resumed from `checkpoint`, written with `saved_rows` rows per step on
// `saved_world` ranks, with the recipe's `micro` and `accumulation` on `world` ranks. Unchanged
// when the recipe already gives saved_rows on `world` ranks, or when its batch keys are not the
// checkpoint's (saved_rows != micro x accumulation x saved_world: the checkpoint load refuses
// that, naming both) or the checkpoint says nothing (saved_rows or saved_world < 1). Throws
// UsageError (exit 2) naming the nearest world sizes when `world` cannot split saved_rows.
CIUIC_API ElasticSplit elastic_split(int64_t saved_rows, int64_t saved_world, int64_t micro,
                                     int64_t accumulation, int64_t world,
                                     const std::string& checkpoint);

}  // namespace ciuic::train
