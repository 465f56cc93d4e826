// Elastic resume: the batch split on another world size (train/elastic.h).
#include "train/elastic.h"

#include <algorithm>

#include <ciuic/error.h>

namespace ciuic::train {

std::optional<BatchSplit> split_global_batch(int64_t global_rows, int64_t world,
                                             int64_t max_micro) {
  if (global_rows < 1 || world < 1 || max_micro < 1 || global_rows % world != 0)
    return std::nullopt;
  const int64_t per_rank = global_rows / world;
  for (int64_t m = std::min(max_micro, per_rank); m >= 1; --m)
    if (per_rank % m == 0) return BatchSplit{m, per_rank / m};
  return std::nullopt;  // not reached: m = 1 divides
}

std::pair<int64_t, int64_t> nearest_world_sizes(int64_t global_rows, int64_t world) {
  int64_t below = 0, above = 0;
  for (int64_t w = world - 1; w >= 1 && !below; --w)
    if (global_rows % w == 0) below = w;
  for (int64_t w = world + 1; w <= global_rows && w - world <= kNearestWorldSearch && !above; ++w)
    if (global_rows % w == 0) above = w;
  return {below, above};
}

namespace {
// a x b x c; -1 when it does not fit int64 (then it is no checkpoint's row count, which is >= 1).
int64_t product(int64_t a, int64_t b, int64_t c) {
  int64_t ab = 0, abc = 0;
  if (__builtin_mul_overflow(a, b, &ab) || __builtin_mul_overflow(ab, c, &abc)) return -1;
  return abc;
}
}  // namespace

ElasticSplit elastic_split(int64_t saved_rows, int64_t saved_world, int64_t micro,
                           int64_t accumulation, int64_t world, const std::string& checkpoint) {
  ElasticSplit out;
  // (A damaged trainer.json can give any world size: the products are checked for overflow.)
  if (saved_rows < 1 || saved_world < 1 || product(micro, accumulation, world) == saved_rows ||
      product(micro, accumulation, saved_world) != saved_rows)
    return out;
  const std::string keys = "micro_batch_size " + std::to_string(micro) +
                           " x gradient_accumulation_steps " + std::to_string(accumulation);
  const std::optional<BatchSplit> s = split_global_batch(saved_rows, world, micro);
  if (!s) {
    const auto [below, above] = nearest_world_sizes(saved_rows, world);
    std::string near;
    if (below) near = std::to_string(below);
    if (above) near += (near.empty() ? "" : " or ") + std::to_string(above);
    throw UsageError("cannot resume " + checkpoint + " on " + std::to_string(world) +
                     " ranks: its global batch of " + std::to_string(saved_rows) +
                     " rows per step (" + keys + " x " + std::to_string(saved_world) +
                     " ranks) does not split evenly over " + std::to_string(world) +
                     " ranks; world sizes next to " + std::to_string(world) +
                     " that keep it: " + near);
  }
  out.changed = true;
  out.split = *s;
  out.message = "elastic resume of " + checkpoint + ": " + std::to_string(saved_rows) +
                " rows per step, written on " + std::to_string(saved_world) + " ranks, now on " +
                std::to_string(world) + ": micro_batch_size " + std::to_string(micro) + " -> " +
                std::to_string(s->micro_batch) + ", gradient_accumulation_steps " +
                std::to_string(accumulation) + " -> " + std::to_string(s->accumulation);
  return out;
}

}  // namespace ciuic::train
