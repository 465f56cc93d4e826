#include <atomic>
#include <future>
#include <vector>

#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <ciuic/error.h>

#include "host_accumulator.h"

// cpu_adam's host gradient fold (plugins/optim/cpu_adam/host_accumulator.h), compiled into this
// test from the plugin's source.
// The fold against ATen: dst = (assign ? 0 : dst) + src in fp32, for each source dtype, split
// over a team of 3, and the sum of squares of the result against a fp64 reduction.
TEST(HostAccumulator, FoldMatchesAten) {
  at::manual_seed(3);
  const int64_t n = (1 << 18) * 3 + 777;  // uneven pieces and a ragged tail
  ciuic_cpu_adam::HostAccumulator acc(/*buckets=*/1, /*threads=*/3);
  for (at::ScalarType st : {at::kFloat, at::kBFloat16, at::kHalf}) {
    for (bool assign : {true, false}) {
      const at::Tensor dst0 = at::randn({n});
      const at::Tensor src = at::randn({n}).to(st);
      at::Tensor dst = dst0.clone();
      acc.submit(0, dst, src, nullptr, assign, /*squares=*/true);
      const double sq = acc.wait_all();
      const at::Tensor want = assign ? src.to(at::kFloat) : dst0 + src.to(at::kFloat);
      EXPECT_TRUE(at::equal(dst, want)) << c10::toString(st) << " assign " << assign;
      const double want_sq = want.to(at::kDouble).pow(2).sum().item<double>();
      EXPECT_NEAR(sq, want_sq, 1e-6 * want_sq) << c10::toString(st);
    }
  }
}

// A gradient kept as it came (one chunk a step): an assign job into a destination of the source's
// dtype copies it, one whose destination is the source itself copies nothing; either way the sum of
// squares is bit for bit the one the fp32 fold gives for the same chunk. Keeping needs assign and
// the same dtype.
TEST(HostAccumulator, KeptChunksGiveTheFoldsSquares) {
  at::manual_seed(4);
  const int64_t n = (1 << 18) * 3 + 777;
  ciuic_cpu_adam::HostAccumulator acc(/*buckets=*/1, /*threads=*/3);
  for (at::ScalarType st : {at::kFloat, at::kBFloat16, at::kHalf}) {
    const at::Tensor src = at::randn({n}).to(st);
    at::Tensor wide = at::full({n}, 5.0f);
    acc.submit(0, wide, src, nullptr, /*assign=*/true, /*squares=*/true);
    const double folded = acc.wait_all();
    at::Tensor copy = at::full({n}, 5.0).to(st);
    acc.submit(0, copy, src, nullptr, true, true);
    EXPECT_EQ(acc.wait_all(), folded) << c10::toString(st);
    EXPECT_TRUE(at::equal(copy, src)) << c10::toString(st);
    at::Tensor in_place = src.clone();
    acc.submit(0, in_place, in_place, nullptr, true, true);
    EXPECT_EQ(acc.wait_all(), folded) << c10::toString(st);
    EXPECT_TRUE(at::equal(in_place, src)) << c10::toString(st);
  }
  const at::Tensor b = at::ones({8}, at::kBFloat16);
  at::Tensor narrow_dst = at::zeros({8}, at::kBFloat16);
  EXPECT_THROW(acc.submit(0, narrow_dst, b, nullptr, /*assign=*/false, false), ciuic::Error);
  EXPECT_THROW(acc.submit(0, narrow_dst, b.to(at::kHalf), nullptr, true, false), ciuic::Error);
  at::Tensor same = at::ones({8});
  EXPECT_THROW(acc.submit(0, same, same, nullptr, /*assign=*/false, false), ciuic::Error);
}

// Jobs run in order (add after assign on the same region), squares are counted only for the
// jobs that ask and reset by wait_all(), wait_free() returns once a region's job ran, and a bad
// job is refused.
TEST(HostAccumulator, OrdersJobsAndCountsSquares) {
  ciuic_cpu_adam::HostAccumulator acc(/*buckets=*/2, /*threads=*/2);
  at::Tensor shard = at::full({10}, 99.0f);
  const at::Tensor a = at::arange(10, at::kFloat), b = at::ones({10});
  acc.submit(0, shard.narrow(0, 0, 5), a.narrow(0, 0, 5), nullptr, /*assign=*/true, false);
  acc.submit(1, shard.narrow(0, 5, 5), a.narrow(0, 5, 5), nullptr, /*assign=*/true, false);
  acc.wait_free(0);
  acc.submit(0, shard.narrow(0, 0, 5), b.narrow(0, 0, 5), nullptr, /*assign=*/false, true);
  acc.submit(1, shard.narrow(0, 5, 5), b.narrow(0, 5, 5).to(at::kBFloat16), nullptr, false, true);
  const double sq = acc.wait_all();
  EXPECT_TRUE(at::equal(shard, a + 1));
  EXPECT_DOUBLE_EQ(sq, (a + 1).pow(2).sum().item<double>());
  EXPECT_EQ(acc.wait_all(), 0.0);
  EXPECT_GE(acc.take_times().busy_s, 0.0);
  EXPECT_THROW(acc.submit(0, shard.narrow(0, 0, 5), b, nullptr, true, false), ciuic::Error);
  EXPECT_THROW(acc.submit(0, shard.to(at::kDouble), b, nullptr, true, false), ciuic::Error);
}

// Tasks (cpu_adam's early updates): a task runs after the jobs of its bucket submitted before it,
// folds of other buckets overtake queued tasks, and a fold waits for an earlier task of its
// bucket; wait_folds() does not wait for tasks, wait_all() and wait_free() do; a task gets the
// team share of set_task_parts() (clamped to the team); a failing task is rethrown.
TEST(HostAccumulator, TasksKeepTheirBucketsOrderAndFoldsGoFirst) {
  ciuic_cpu_adam::HostAccumulator acc(/*buckets=*/3, /*threads=*/1, /*team=*/4);
  at::Tensor shard = at::zeros({30});
  std::promise<void> open;
  std::shared_future<void> opened = open.get_future().share();
  std::promise<void> started;
  std::vector<int> parts_seen;
  // Task 0 holds the thread until `open`; meanwhile task 1, a fold of bucket 1 and a fold of
  // bucket 2 are queued, in that order.
  acc.submit_task(0, [&](ciuic::ThreadPool& team, int parts) {
    started.set_value();
    opened.wait();
    EXPECT_EQ(team.size(), 4);
    parts_seen.push_back(parts);
  });
  started.get_future().wait();
  float seen_by_task1[2] = {-1, -1};
  acc.submit_task(1, [&](ciuic::ThreadPool&, int parts) {
    seen_by_task1[0] = shard[15].item<float>();  // bucket 1: its later fold has not run
    seen_by_task1[1] = shard[25].item<float>();  // bucket 2: its fold ran first
    parts_seen.push_back(parts);
  });
  acc.submit(1, shard.narrow(0, 10, 10), at::full({10}, 1.0f), nullptr, /*assign=*/true, true);
  acc.submit(2, shard.narrow(0, 20, 10), at::full({10}, 2.0f), nullptr, /*assign=*/true, true);
  acc.set_task_parts(3);  // task 1 starts after this
  open.set_value();
  EXPECT_DOUBLE_EQ(acc.wait_folds(), 10 * 1.0 + 10 * 4.0);
  acc.wait_all();
  EXPECT_EQ(seen_by_task1[0], 0.0f);
  EXPECT_EQ(seen_by_task1[1], 2.0f);
  ASSERT_EQ(parts_seen.size(), 2u);
  EXPECT_EQ(parts_seen[0], 1);  // the fold share (threads) when task 0 started
  EXPECT_EQ(parts_seen[1], 3);

  // wait_folds() returns while a task still runs; wait_free() of its bucket waits for it.
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<bool> done{false};
  acc.submit(0, shard.narrow(0, 0, 10), at::full({10}, 3.0f), nullptr, true, true);
  acc.submit_task(0, [&](ciuic::ThreadPool&, int) {
    released.wait();
    done = true;
  });
  EXPECT_DOUBLE_EQ(acc.wait_folds(), 90.0);
  EXPECT_FALSE(done);
  release.set_value();
  acc.wait_free(0);
  EXPECT_TRUE(done);

  acc.set_task_parts(100);
  acc.submit_task(2, [&](ciuic::ThreadPool&, int parts) { parts_seen.push_back(parts); });
  acc.submit_task(2, [](ciuic::ThreadPool&, int) { throw ciuic::Error("task failed"); });
  EXPECT_THROW(acc.wait_all(), ciuic::Error);
  EXPECT_EQ(parts_seen.back(), 4);
}
