// LR schedules (see schedule.h for the formulas and how they relate to DeepSpeed's).
#include "schedule/schedule.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <numbers>
#include <sstream>
#include <string_view>

#include <ciuic/error.h>

#include "sdk/toml_format.h"
#include <ciuic/log.h>

namespace ciuic::schedule {

LrSchedule::~LrSchedule() = default;

namespace {

constexpr std::array<std::string_view, 8> kKeys = {
    "type",        "warmup_min_lr",   "warmup_max_lr",    "warmup_num_steps",
    "warmup_type", "total_num_steps", "warmup_min_ratio", "cos_min_ratio"};

// Typed reads that fall back to the documented default when the key is absent (a section built
// with Config::from_toml has no defaults filled in) and report a wrong type as a recipe error.
double read_float(const Config& c, std::string_view key, double def) {
  if (!c.has(key)) return def;
  double v = 0;
  try {
    v = c.get_float(key);
  } catch (const UsageError&) {
    throw;
  } catch (const Error&) {
    c.fail(key, "expected a number");
  }
  if (!std::isfinite(v)) c.fail(key, "expected a finite number");
  return v;
}

int64_t read_int(const Config& c, std::string_view key, int64_t def) {
  if (!c.has(key)) return def;
  try {
    return c.get_int(key);
  } catch (const UsageError&) {
    throw;
  } catch (const Error&) {
    c.fail(key, "expected an integer");
  }
}

std::string read_string(const Config& c, std::string_view key, std::string def) {
  if (!c.has(key)) return def;
  try {
    return c.get_string(key);
  } catch (const UsageError&) {
    throw;
  } catch (const Error&) {
    c.fail(key, "expected a string");
  }
}

// True when the user wrote the key (not filled in from the schema's defaults).
bool written(const Config& c, std::string_view key) {
  return c.has(key) && c.location(key) != "<default>";
}

enum class WarmupType { kLog, kLinear };

// The warmup part shared by WarmupLR, WarmupDecayLR and WarmupCosineLR: gamma in [0, 1) for
// s < n (DeepSpeed's _get_gamma / the first branch of get_lr_ratio).
struct Warmup {
  int64_t n = 0;  // effective length: 0 (none) or max(2, warmup_num_steps)
  WarmupType type = WarmupType::kLog;
  double inverse_log_n = 0;

  Warmup(int64_t warmup_num_steps, WarmupType t) : type(t) {
    n = warmup_num_steps == 0 ? 0 : std::max<int64_t>(2, warmup_num_steps);
    if (n > 0) inverse_log_n = 1.0 / std::log(static_cast<double>(n));
  }
  bool active(int64_t s) const { return s < n; }
  double gamma(int64_t s) const {
    if (type == WarmupType::kLog) return inverse_log_n * std::log(static_cast<double>(s + 1));
    return static_cast<double>(s) / static_cast<double>(n);
  }
  std::string describe() const {
    if (n == 0) return "no warmup";
    return "warmup " + std::to_string(n) + " steps " +
           (type == WarmupType::kLog ? "log" : "linear");
  }
};

void check_step(int64_t step) {
  if (step < 0)
    throw Error("internal error: learning rate asked for optimizer step " + std::to_string(step) +
                " (steps are 0-based and non-negative)");
}

class ConstantLr final : public LrSchedule {
 public:
  explicit ConstantLr(double lr) : lr_(lr) {}
  double lr(int64_t step) const override {
    check_step(step);
    return lr_;
  }
  std::string describe() const override { return "constant (lr " + format_number(lr_) + ")"; }

 private:
  double lr_;
};

// WarmupLR, and WarmupDecayLR when total_steps >= 0.
class WarmupLr final : public LrSchedule {
 public:
  WarmupLr(double min_lr, double max_lr, Warmup warmup, int64_t total_steps)
      : min_lr_(min_lr), max_lr_(max_lr), warmup_(warmup), total_(total_steps) {}

  double lr(int64_t s) const override {
    check_step(s);
    double gamma = 1.0;
    if (warmup_.active(s)) {
      gamma = warmup_.gamma(s);
    } else if (total_ >= 0) {
      gamma = std::max(0.0, static_cast<double>(total_ - s) /
                                std::max<double>(1.0, static_cast<double>(total_ - warmup_.n)));
    }
    return min_lr_ + (max_lr_ - min_lr_) * gamma;
  }

  std::string describe() const override {
    std::string s = total_ >= 0 ? "warmup_decay (" : "warmup (";
    s +=
        warmup_.describe() + " from lr " + format_number(min_lr_) + " to " + format_number(max_lr_);
    if (total_ >= 0) s += ", then linear decay to 0 at step " + std::to_string(total_);
    return s + ")";
  }

 private:
  double min_lr_, max_lr_;
  Warmup warmup_;
  int64_t total_;  // -1: no decay (WarmupLR)
};

class WarmupCosineLr final : public LrSchedule {
 public:
  WarmupCosineLr(double base_lr, Warmup warmup, int64_t total_steps, double warmup_min_ratio,
                 double cos_min_ratio)
      : base_lr_(base_lr),
        warmup_(warmup),
        total_(total_steps),
        warmup_min_ratio_(warmup_min_ratio),
        cos_min_ratio_(cos_min_ratio) {}

  double lr(int64_t s) const override {
    check_step(s);
    double ratio;
    if (warmup_.active(s)) {
      ratio = warmup_min_ratio_ + warmup_.gamma(s) * (1.0 - warmup_min_ratio_);
    } else {
      double done = static_cast<double>(s - warmup_.n + 1);
      double span = std::max<double>(1.0, static_cast<double>(total_ - warmup_.n));
      double progress = std::min(1.0, done / span);
      double cosine = (1.0 + std::cos(std::numbers::pi * progress)) / 2.0;
      ratio = std::max(0.0, cos_min_ratio_ + (1.0 - cos_min_ratio_) * cosine);
    }
    return base_lr_ * ratio;
  }

  std::string describe() const override {
    return "warmup_cosine (" + warmup_.describe() + " from ratio " +
           format_number(warmup_min_ratio_) + ", cosine to ratio " + format_number(cos_min_ratio_) +
           " at step " + std::to_string(total_) + ", base lr " + format_number(base_lr_) + ")";
  }

 private:
  double base_lr_;
  Warmup warmup_;
  int64_t total_;
  double warmup_min_ratio_, cos_min_ratio_;
};

}  // namespace

std::unique_ptr<LrSchedule> LrSchedule::create(const Config& c, double optimizer_lr,
                                               int64_t max_steps) {
  for (const std::string& k : c.keys())
    if (std::find(kKeys.begin(), kKeys.end(), k) == kKeys.end())
      c.fail(k,
             "unknown key (known: type, warmup_min_lr, warmup_max_lr, warmup_num_steps, "
             "warmup_type, total_num_steps, warmup_min_ratio, cos_min_ratio)");

  const std::string type = read_string(c, "type", "constant");
  if (type != "constant" && type != "warmup" && type != "warmup_decay" && type != "warmup_cosine")
    c.fail("type", "expected one of \"constant\", \"warmup\", \"warmup_decay\", \"warmup_cosine\"");

  // Which keys each type reads; others written by the user are reported (they have no effect).
  std::vector<std::string_view> used;
  if (type == "warmup" || type == "warmup_decay")
    used = {"warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"};
  if (type == "warmup_decay") used.push_back("total_num_steps");
  if (type == "warmup_cosine")
    used = {"warmup_num_steps", "warmup_type", "total_num_steps", "warmup_min_ratio",
            "cos_min_ratio"};
  for (std::string_view k : kKeys)
    if (k != "type" && written(c, k) && std::find(used.begin(), used.end(), k) == used.end())
      log_warn(c.location(k) + ": [" + c.section() + "] " + std::string(k) +
               " has no effect with type = \"" + type + "\"");

  if (type == "constant") return std::make_unique<ConstantLr>(optimizer_lr);

  const int64_t warmup_num_steps = read_int(c, "warmup_num_steps", 0);
  if (warmup_num_steps < 0) c.fail("warmup_num_steps", "expected an integer >= 0");
  const std::string wt = read_string(c, "warmup_type", "log");
  if (wt != "log" && wt != "linear") c.fail("warmup_type", "expected \"log\" or \"linear\"");
  const Warmup warmup(warmup_num_steps, wt == "log" ? WarmupType::kLog : WarmupType::kLinear);

  int64_t total = -1;
  if (type == "warmup_decay" || type == "warmup_cosine") {
    const int64_t t = read_int(c, "total_num_steps", 0);
    if (t < 0) c.fail("total_num_steps", "expected an integer >= 0 (0 = train.max_steps)");
    total = t > 0 ? t : max_steps;
    if (total < warmup_num_steps) {
      std::string what = t > 0
                             ? "is less than warmup_num_steps = " + std::to_string(warmup_num_steps)
                             : "is 0, so train.max_steps = " + std::to_string(max_steps) +
                                   " is used, which is less than warmup_num_steps = " +
                                   std::to_string(warmup_num_steps);
      c.fail("total_num_steps", what + "; the schedule would never finish its warmup");
    }
    if (total < 1) c.fail("total_num_steps", "the schedule needs at least one step");
  }

  if (type == "warmup_cosine") {
    const double min_ratio = read_float(c, "warmup_min_ratio", 0.0);
    if (min_ratio < 0 || min_ratio > 1) c.fail("warmup_min_ratio", "expected a ratio in [0, 1]");
    const double cos_min = read_float(c, "cos_min_ratio", 1e-4);
    if (cos_min < 0 || cos_min > 1) c.fail("cos_min_ratio", "expected a ratio in [0, 1]");
    return std::make_unique<WarmupCosineLr>(optimizer_lr, warmup, total, min_ratio, cos_min);
  }

  const double min_lr = read_float(c, "warmup_min_lr", 0.0);
  if (min_lr < 0) c.fail("warmup_min_lr", "expected a learning rate >= 0");
  double max_lr = read_float(c, "warmup_max_lr", -1.0);
  if (max_lr == -1.0) {
    max_lr = optimizer_lr;
  } else if (max_lr < 0) {
    c.fail("warmup_max_lr", "expected a learning rate >= 0, or -1 for the optimizer's lr");
  }
  return std::make_unique<WarmupLr>(min_lr, max_lr, warmup, total);
}

}  // namespace ciuic::schedule
