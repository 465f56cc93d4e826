// Elastic resume arithmetic (train/elastic.h) against brute force: every (micro-batch,
// accumulation) pair that gives the global batch on the new world size, the largest micro-batch
// within the recipe's wins; refusals name the nearest world sizes.
#include <gtest/gtest.h>

#include <ciuic/error.h>

#include "train/elastic.h"

namespace ciuic::train {
namespace {

TEST(Elastic, SplitIsTheLargestMicroBatchThatFits) {
  for (int64_t rows = 1; rows <= 96; ++rows)
    for (int64_t world = 1; world <= 12; ++world)
      for (int64_t max_micro = 1; max_micro <= 16; ++max_micro) {
        int64_t best_m = 0, best_a = 0;
        for (int64_t m = 1; m <= max_micro; ++m)
          for (int64_t a = 1; m * a * world <= rows; ++a)
            if (m * a * world == rows) best_m = m, best_a = a;
        const auto s = split_global_batch(rows, world, max_micro);
        if (best_m == 0) {
          EXPECT_FALSE(s.has_value()) << rows << " " << world << " " << max_micro;
        } else {
          ASSERT_TRUE(s.has_value()) << rows << " " << world << " " << max_micro;
          EXPECT_EQ(s->micro_batch, best_m) << rows << " " << world << " " << max_micro;
          EXPECT_EQ(s->accumulation, best_a) << rows << " " << world << " " << max_micro;
        }
      }
  EXPECT_FALSE(split_global_batch(0, 1, 1));
  EXPECT_FALSE(split_global_batch(8, 0, 1));
  EXPECT_FALSE(split_global_batch(8, 2, 0));
}

TEST(Elastic, NearestWorldSizes) {
  EXPECT_EQ(nearest_world_sizes(12, 5), (std::pair<int64_t, int64_t>{4, 6}));
  EXPECT_EQ(nearest_world_sizes(12, 7), (std::pair<int64_t, int64_t>{6, 12}));
  EXPECT_EQ(nearest_world_sizes(7, 3), (std::pair<int64_t, int64_t>{1, 7}));
  EXPECT_EQ(nearest_world_sizes(6, 13), (std::pair<int64_t, int64_t>{6, 0}));
  // A prime row count from a damaged trainer.json: the search above stops after
  // kNearestWorldSearch sizes (it went on to 10^12 divisions).
  EXPECT_EQ(nearest_world_sizes(1000000000039, 2), (std::pair<int64_t, int64_t>{1, 0}));
  EXPECT_EQ(nearest_world_sizes(2 * (kNearestWorldSearch + 3), 2),
            (std::pair<int64_t, int64_t>{1, 0}));
}

TEST(Elastic, OnlyAChangedWorldSizeIsAdapted) {
  // 3 ranks x 4 x 1 = 12 rows saved; the same recipe on 2 ranks: 6 rows per rank -> 3 x 2.
  ElasticSplit e = elastic_split(12, 3, 4, 1, 2, "ckpt/step_5");
  ASSERT_TRUE(e.changed);
  EXPECT_EQ(e.split.micro_batch, 3);
  EXPECT_EQ(e.split.accumulation, 2);
  EXPECT_EQ(e.message,
            "elastic resume of ckpt/step_5: 12 rows per step, written on 3 ranks, now on 2: "
            "micro_batch_size 4 -> 3, gradient_accumulation_steps 1 -> 2");
  // Already the same global batch (the user adjusted the keys): nothing to do.
  EXPECT_FALSE(elastic_split(12, 3, 6, 1, 2, "c").changed);
  // The recipe's keys are not the checkpoint's: left to the checkpoint load, which names both.
  EXPECT_FALSE(elastic_split(12, 3, 2, 1, 2, "c").changed);
  // Same world size, other keys: not elastic either.
  EXPECT_FALSE(elastic_split(12, 3, 2, 2, 3, "c").changed);
  // Nothing known about the checkpoint (written before trainer.json had a shape).
  EXPECT_FALSE(elastic_split(0, 0, 4, 1, 2, "c").changed);
  // A world size of a damaged trainer.json whose product with the recipe's keys overflows is not
  // the checkpoint's shape: 15 x 8608480567731124088 wrapped to 8 rows and was split.
  EXPECT_FALSE(elastic_split(8, 8608480567731124088, 3, 5, 1, "c").changed);
  EXPECT_FALSE(elastic_split(5, int64_t{1} << 62, 4, 2, 3, "c").changed);
}

TEST(Elastic, AWorldSizeThatCannotSplitTheBatchIsRefusedNamingTheNearest) {
  try {
    elastic_split(12, 3, 4, 1, 5, "ckpt/step_5");
    FAIL() << "no error";
  } catch (const UsageError& e) {
    EXPECT_EQ(std::string(e.what()),
              "cannot resume ckpt/step_5 on 5 ranks: its global batch of 12 rows per step "
              "(micro_batch_size 4 x gradient_accumulation_steps 1 x 3 ranks) does not split "
              "evenly over 5 "
              "ranks; world sizes next to 5 that keep it: 4 or 6");
  }
}

}  // namespace
}  // namespace ciuic::train
