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

