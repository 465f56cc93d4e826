// LR schedules against DeepSpeed's formulas (deepspeed/runtime/lr_schedules.py:
// WarmupLR._get_gamma, WarmupDecayLR._get_gamma, WarmupCosineLR.get_lr_ratio), re-derived here
// independently of schedule/schedule.cpp, plus hand-computed anchor values and every configuration
// error.
#include <cmath>
#include <numbers>
#include <string>

#include <gtest/gtest.h>

#include <ciuic/config.h>
#include <ciuic/error.h>

#include "schedule/schedule.h"

using ciuic::Config;
using ciuic::schedule::LrSchedule;

namespace {

std::unique_ptr<LrSchedule> make(const std::string& toml, double lr = 3e-4,
                                 int64_t max_steps = 100) {
  return LrSchedule::create(Config::from_toml("scheduler", toml, "sched.toml"), lr, max_steps);
}

std::string error_of(const std::string& toml, int64_t max_steps = 100) {
  try {
    make(toml, 3e-4, max_steps);
  } catch (const ciuic::UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// ---- DeepSpeed's schedules, step = last_batch_iteration
// ------------------------------------------

// WarmupLR / WarmupDecayLR: warmup_num_steps is clamped to at least 2; gamma during warmup is
// log(step + 1) / log(N) ("log") or step / N ("linear").
double ds_gamma_warmup(int64_t step, int64_t n, bool log_type) {
  n = std::max<int64_t>(2, n);
  return log_type ? std::log(step + 1.0) / std::log(static_cast<double>(n))
                  : static_cast<double>(step) / static_cast<double>(n);
}

double ds_warmup_lr(int64_t step, double min_lr, double max_lr, int64_t n, bool log_type) {
  const int64_t nn = std::max<int64_t>(2, n);
  const double gamma = step < nn ? ds_gamma_warmup(step, n, log_type) : 1.0;
  return min_lr + (max_lr - min_lr) * gamma;
}

double ds_warmup_decay_lr(int64_t step, double min_lr, double max_lr, int64_t n, bool log_type,
                          int64_t total) {
  const int64_t nn = std::max<int64_t>(2, n);
  double gamma;
  if (step < nn)
    gamma = ds_gamma_warmup(step, n, log_type);
  else
    gamma = std::max(0.0, double(total - step) / std::max(1.0, double(total - nn)));
  return min_lr + (max_lr - min_lr) * gamma;
}

double ds_warmup_cosine_lr(int64_t step, double lr, int64_t total, double warmup_min_ratio,
                           int64_t n, double cos_min_ratio, bool log_type) {
  const int64_t nn = std::max<int64_t>(2, n);
  double ratio;
  if (step < nn) {
    ratio = warmup_min_ratio + ds_gamma_warmup(step, n, log_type) * (1.0 - warmup_min_ratio);
  } else {
    const double real_last_step = double(step - nn + 1);
    const double real_total_steps = std::max(1.0, double(total - nn));
    const double progress = std::min(1.0, real_last_step / real_total_steps);
    const double c = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
    ratio = std::max(0.0, cos_min_ratio + (1.0 - cos_min_ratio) * c);
  }
  return lr * ratio;
}

void expect_close(double got, double want, int64_t step) {
  EXPECT_NEAR(got, want, 1e-12 * std::max(1.0, std::abs(want)) + 1e-18) << "step " << step;
}

}  // namespace

TEST(LrSchedule, Constant) {
  auto s = make("");  // type defaults to constant
  for (int64_t t : {0, 1, 50, 1000}) EXPECT_EQ(s->lr(t), 3e-4);
  EXPECT_EQ(make("type = \"constant\"")->lr(7), 3e-4);
  EXPECT_TRUE(contains(s->describe(), "constant"));
}

TEST(LrSchedule, WarmupLogAndLinear) {
  for (bool log_type : {true, false}) {
    const std::string type = log_type ? "log" : "linear";
    auto s = make(
        "type = \"warmup\"\nwarmup_min_lr = 1e-5\nwarmup_max_lr = 2e-4\n"
        "warmup_num_steps = 30\nwarmup_type = \"" +
        type + "\"");
    for (int64_t t = 0; t < 80; ++t)
      expect_close(s->lr(t), ds_warmup_lr(t, 1e-5, 2e-4, 30, log_type), t);
  }
  // Anchors: linear at half way; log starts at the minimum; warmup_max_lr defaults to the
  // optimizer's lr; the default warmup_type is log.
  auto lin = make("type = \"warmup\"\nwarmup_num_steps = 10\nwarmup_type = \"linear\"", 1e-3);
  EXPECT_DOUBLE_EQ(lin->lr(0), 0.0);
  EXPECT_DOUBLE_EQ(lin->lr(5), 0.5e-3);
  EXPECT_DOUBLE_EQ(lin->lr(10), 1e-3);
  auto log = make("type = \"warmup\"\nwarmup_num_steps = 100", 1e-3);
  EXPECT_DOUBLE_EQ(log->lr(0), 0.0);
  EXPECT_NEAR(log->lr(9), 1e-3 * std::log(10.0) / std::log(100.0), 1e-18);  // = 0.5e-3
  EXPECT_NEAR(log->lr(9), 0.5e-3, 1e-15);
}

TEST(LrSchedule, WarmupStepsBelowTwoAndZero) {
  // DeepSpeed clamps warmup_num_steps to >= 2.
  auto one = make("type = \"warmup\"\nwarmup_num_steps = 1\nwarmup_type = \"linear\"", 1e-3);
  for (int64_t t = 0; t < 4; ++t) expect_close(one->lr(t), ds_warmup_lr(t, 0, 1e-3, 1, false), t);
  EXPECT_DOUBLE_EQ(one->lr(1), 0.5e-3);
  // 0 means no warmup (a ciuic extension; DeepSpeed rejects it).
  auto none = make("type = \"warmup\"\nwarmup_min_lr = 1e-5", 1e-3);
  EXPECT_DOUBLE_EQ(none->lr(0), 1e-3);
  auto decay = make("type = \"warmup_decay\"\ntotal_num_steps = 10", 1e-3);
  EXPECT_DOUBLE_EQ(decay->lr(0), 1e-3);
  EXPECT_DOUBLE_EQ(decay->lr(5), 0.5e-3);
}

TEST(LrSchedule, WarmupDecay) {
  for (bool log_type : {true, false}) {
    const std::string type = log_type ? "log" : "linear";
    auto s = make(
        "type = \"warmup_decay\"\nwarmup_min_lr = 1e-6\nwarmup_num_steps = 20\n"
        "total_num_steps = 120\nwarmup_type = \"" +
            type + "\"",
        6e-4);
    for (int64_t t = 0; t < 150; ++t)
      expect_close(s->lr(t), ds_warmup_decay_lr(t, 1e-6, 6e-4, 20, log_type, 120), t);
    EXPECT_DOUBLE_EQ(s->lr(120), 1e-6);  // gamma 0: back at warmup_min_lr
    EXPECT_DOUBLE_EQ(s->lr(140), 1e-6);
  }
  // total_num_steps = 0: train.max_steps.
  auto s =
      make("type = \"warmup_decay\"\nwarmup_num_steps = 10\nwarmup_type = \"linear\"", 1e-3, 50);
  for (int64_t t = 0; t < 60; ++t)
    expect_close(s->lr(t), ds_warmup_decay_lr(t, 0, 1e-3, 10, false, 50), t);
  EXPECT_DOUBLE_EQ(s->lr(30), 1e-3 * 20.0 / 40.0);
}

TEST(LrSchedule, WarmupCosine) {
  for (bool log_type : {true, false}) {
    const std::string type = log_type ? "log" : "linear";
    auto s = make(
        "type = \"warmup_cosine\"\nwarmup_min_ratio = 0.1\nwarmup_num_steps = 15\n"
        "total_num_steps = 200\ncos_min_ratio = 0.05\nwarmup_type = \"" +
            type + "\"",
        2e-4);
    for (int64_t t = 0; t < 260; ++t)
      expect_close(s->lr(t), ds_warmup_cosine_lr(t, 2e-4, 200, 0.1, 15, 0.05, log_type), t);
    // After the end the ratio stays at cos_min_ratio.
    EXPECT_NEAR(s->lr(199), 2e-4 * 0.05, 1e-18);
    EXPECT_NEAR(s->lr(250), 2e-4 * 0.05, 1e-18);
  }
  // Defaults: warmup_min_ratio 0, cos_min_ratio 1e-4, total = max_steps; the cosine midpoint.
  auto s =
      make("type = \"warmup_cosine\"\nwarmup_num_steps = 10\nwarmup_type = \"linear\"", 1e-3, 110);
  EXPECT_DOUBLE_EQ(s->lr(0), 0.0);
  const double mid = 1e-4 + (1 - 1e-4) * 0.5;  // progress 1/2 at step 10 + 50 - 1
  EXPECT_NEAR(s->lr(59), 1e-3 * mid, 1e-15);
  for (int64_t t = 0; t < 120; ++t)
    expect_close(s->lr(t), ds_warmup_cosine_lr(t, 1e-3, 110, 0, 10, 1e-4, false), t);
}

TEST(LrSchedule, ConfigErrors) {
  std::string e = error_of("type = \"warmup_decay\"\nwarmup_num_steps = 50\ntotal_num_steps = 20");
  EXPECT_TRUE(contains(
      e, "sched.toml:3:19: [scheduler] total_num_steps = 20: is less than warmup_num_steps = 50"))
      << e;
  e = error_of("type = \"warmup_cosine\"\nwarmup_num_steps = 50", 40);
  EXPECT_TRUE(contains(e,
                       "total_num_steps: is 0, so train.max_steps = 40 is used, which is less than "
                       "warmup_num_steps = 50"))
      << e;
  e = error_of("type = \"cosine\"");
  EXPECT_TRUE(contains(
      e, "sched.toml:1:8: [scheduler] type = \"cosine\": expected one of \"constant\", \"warmup\""))
      << e;
  e = error_of("type = \"warmup\"\nwarmup_type = \"exp\"");
  EXPECT_TRUE(contains(e, "[scheduler] warmup_type = \"exp\": expected \"log\" or \"linear\""))
      << e;
  e = error_of("type = \"warmup\"\nwarmup_max_lr = -0.5");
  EXPECT_TRUE(contains(
      e, "warmup_max_lr = -0.5: expected a learning rate >= 0, or -1 for the optimizer's lr"))
      << e;
  e = error_of("type = \"warmup\"\nwarmup_min_lr = -1e-5");
  EXPECT_TRUE(contains(e, "warmup_min_lr = -1e-5: expected a learning rate >= 0")) << e;
  e = error_of("type = \"warmup\"\nwarmup_num_steps = -3");
  EXPECT_TRUE(contains(e, "warmup_num_steps = -3: expected an integer >= 0")) << e;
  e = error_of("type = \"warmup\"\nwarmup_num_steps = 1.5");
  EXPECT_TRUE(contains(e, "warmup_num_steps = 1.5: expected an integer")) << e;
  e = error_of("type = \"warmup_cosine\"\ncos_min_ratio = 1.5");
  EXPECT_TRUE(contains(e, "cos_min_ratio = 1.5: expected a ratio in [0, 1]")) << e;
  e = error_of("type = \"warmup_cosine\"\nwarmup_min_ratio = -0.1");
  EXPECT_TRUE(contains(e, "warmup_min_ratio = -0.1: expected a ratio in [0, 1]")) << e;
  e = error_of("type = \"warmup_decay\"\ntotal_num_steps = -1");
  EXPECT_TRUE(contains(e, "total_num_steps = -1: expected an integer >= 0")) << e;
  e = error_of("type = \"warmup\"\nwarmup_steps = 10");
  EXPECT_TRUE(contains(e, "[scheduler] warmup_steps = 10: unknown key")) << e;
  e = error_of("type = 3");
  EXPECT_TRUE(contains(e, "[scheduler] type = 3: expected a string")) << e;
  // A negative step is a programming error.
  EXPECT_THROW(make("")->lr(-1), ciuic::Error);
}
