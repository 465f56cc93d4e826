// HostAccumulator (host_accumulator.h).
#include "host_accumulator.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <ciuic/error.h>

namespace ciuic_cpu_adam {
namespace {

using Clock = std::chrono::steady_clock;
double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

inline float to_float(float x) { return x; }
inline float to_float(uint16_t bf16_bits) {  // bf16 -> fp32 is exact: the high half of the word
  const uint32_t u = static_cast<uint32_t>(bf16_bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline float to_float(c10::Half h) { return static_cast<float>(h); }

constexpr int64_t kBlock = 1024;  // fold a block, then square it while it is in cache

// lane[k] += x[i]^2 (as fp32 widened to fp64) for i in [b, e), element i into lane i % 8 from b on
// and the tail into lane 0: written so that the compiler vectorises it without reassociating, and
// the same order for every caller (the same sums bit for bit).
template <class S>
inline void add_squares(const S* x, int64_t b, int64_t e, double (&lane)[8]) {
  int64_t i = b;
  for (; i + 8 <= e; i += 8)
    for (int k = 0; k < 8; ++k) {
      const double v = to_float(x[i + k]);
      lane[k] += v * v;
    }
  for (; i < e; ++i) {
    const double v = to_float(x[i]);
    lane[0] += v * v;
  }
}

double lanes_total(const double (&lane)[8]) {
  double total = 0;
  for (double l : lane) total += l;
  return total;
}

// dst[0, n) = (assign ? 0 : dst) + src; returns the sum of squares of the result when asked, in
// fp64 over 8 lanes, block by block.
template <class S>
double fold_range(float* dst, const S* src, int64_t n, bool assign, bool squares) {
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t e = std::min(n, b + kBlock);
    if (assign) {
      for (int64_t i = b; i < e; ++i) dst[i] = to_float(src[i]);
    } else {
      for (int64_t i = b; i < e; ++i) dst[i] += to_float(src[i]);
    }
    if (squares) add_squares(dst, b, e, lane);
  }
  return lanes_total(lane);
}

// A gradient kept as it came (one chunk a step, dst of src's dtype): dst[0, n) = src (nothing to
// copy when dst is src); the sum of squares of the values as fp32, summed exactly as fold_range
// sums the fp32 values it assigns (the same lanes and order: the same result bit for bit).
template <class S>
double keep_range(S* dst, const S* src, int64_t n, bool squares) {
  if (dst != src) std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(S));
  if (!squares) return 0;
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  for (int64_t b = 0; b < n; b += kBlock) add_squares(src, b, std::min(n, b + kBlock), lane);
  return lanes_total(lane);
}

}  // namespace

double HostAccumulator::fold(const at::Tensor& dst_t, const at::Tensor& src, bool assign,
                             bool squares) {
  const int64_t n = src.numel();
  // Small jobs on one thread: waking the team costs more than it saves.
  const int parts = n < (1 << 16) ? 1 : fold_parts_;
  std::vector<double> partial(static_cast<size_t>(parts), 0.0);
  const at::ScalarType st = src.scalar_type();
  const void* s = src.const_data_ptr();
  void* d = dst_t.data_ptr();
  // A narrow destination keeps the chunk as it came (submit() checked: same dtype, assign).
  const bool kept = dst_t.scalar_type() != at::kFloat;
  auto body = [&](int i) {
    if (i >= parts) return;
    const auto [b, e] = ciuic::ThreadPool::piece(0, n, parts, i, /*align=*/64);
    if (b >= e) return;
    double r = 0;
    float* dst = static_cast<float*>(d);
    if (kept && st == at::kBFloat16)
      r = keep_range(static_cast<uint16_t*>(d) + b, static_cast<const uint16_t*>(s) + b, e - b,
                     squares);
    else if (kept)
      r = keep_range(static_cast<c10::Half*>(d) + b, static_cast<const c10::Half*>(s) + b, e - b,
                     squares);
    else if (d == s)  // fp32, already in place (assign: submit() checked)
      r = keep_range(dst + b, static_cast<const float*>(s) + b, e - b, squares);
    else if (st == at::kFloat)
      r = fold_range(dst + b, static_cast<const float*>(s) + b, e - b, assign, squares);
    else if (st == at::kBFloat16)
      r = fold_range(dst + b, static_cast<const uint16_t*>(s) + b, e - b, assign, squares);
    else
      r = fold_range(dst + b, static_cast<const c10::Half*>(s) + b, e - b, assign, squares);
    partial[static_cast<size_t>(i)] = r;
  };
  if (parts == 1)
    body(0);
  else
    team_->run(body);
  double total = 0;
  for (double p : partial) total += p;
  return total;
}

HostAccumulator::HostAccumulator(int buckets, int threads, int team, int slots)
    : team_(std::make_unique<ciuic::ThreadPool>(std::max({1, threads, team}))),
      fold_parts_(std::max(1, threads)),
      pending_(static_cast<size_t>(buckets), 0),
      slot_pending_(static_cast<size_t>(std::max(0, slots)), 0),
      task_parts_(fold_parts_),
      seen_(static_cast<size_t>(buckets), 0) {
  thread_ = std::thread([this] { loop(); });
}

HostAccumulator::~HostAccumulator() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void HostAccumulator::rethrow_locked() {
  if (error_) {
    std::exception_ptr e = error_;
    error_ = nullptr;
    std::rethrow_exception(e);
  }
}

void HostAccumulator::wait_none_pending(const std::vector<int64_t>& counts, int index) {
  const auto t0 = Clock::now();
  std::unique_lock<std::mutex> l(mu_);
  const int64_t& pending = counts.at(static_cast<size_t>(index));
  if (pending > 0) {
    cv_.wait(l, [&] { return pending == 0 || error_; });
    times_.blocked_s += since(t0);
  }
  rethrow_locked();
}

void HostAccumulator::wait_free(int bucket) { wait_none_pending(pending_, bucket); }

void HostAccumulator::wait_slot(int slot) { wait_none_pending(slot_pending_, slot); }

void HostAccumulator::submit(int bucket, at::Tensor dst, at::Tensor src,
                             std::unique_ptr<c10::Event> ready, bool assign, bool squares,
                             int slot) {
  if (slot >= static_cast<int>(slot_pending_.size()))
    throw ciuic::Error("optimizer cpu_adam: landing slot " + std::to_string(slot) + " of " +
                       std::to_string(slot_pending_.size()));
  const bool kept = dst.scalar_type() != at::kFloat ||
                    (dst.numel() > 0 && dst.const_data_ptr() == src.const_data_ptr());
  if (!dst.is_cpu() || !dst.is_contiguous() || !src.is_cpu() || !src.is_contiguous() ||
      src.numel() != dst.numel() ||
      (src.scalar_type() != at::kFloat && src.scalar_type() != at::kBFloat16 &&
       src.scalar_type() != at::kHalf) ||
      (kept && (!assign || dst.scalar_type() != src.scalar_type())))
    throw ciuic::Error(
        "optimizer cpu_adam: host gradient accumulation needs a contiguous CPU "
        "fp32/bf16/fp16 source and a destination of the same length: fp32, or, "
        "for a chunk kept as it came (assign), of the source's dtype or the source "
        "itself");
  {
    std::lock_guard<std::mutex> l(mu_);
    rethrow_locked();
    ++pending_.at(static_cast<size_t>(bucket));
    if (slot >= 0) ++slot_pending_[static_cast<size_t>(slot)];
    ++pending_folds_;
    ++pending_all_;
    Job job;
    job.bucket = bucket;
    job.dst = std::move(dst);
    job.src = std::move(src);
    job.ready = std::move(ready);
    job.assign = assign;
    job.squares = squares;
    job.slot = slot;
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void HostAccumulator::submit_task(int bucket, Task fn) {
  if (!fn) throw ciuic::Error("optimizer cpu_adam: empty host task");
  {
    std::lock_guard<std::mutex> l(mu_);
    rethrow_locked();
    ++pending_.at(static_cast<size_t>(bucket));
    ++pending_all_;
    Job job;
    job.bucket = bucket;
    job.task = std::move(fn);
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void HostAccumulator::set_task_parts(int parts) {
  std::lock_guard<std::mutex> l(mu_);
  task_parts_ = std::clamp(parts, 1, team_->size());
}

double HostAccumulator::wait_folds() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return pending_folds_ == 0 || error_; });
  rethrow_locked();
  const double s = squares_;
  squares_ = 0;
  return s;
}

double HostAccumulator::wait_all() {
  std::unique_lock<std::mutex> l(mu_);
  cv_.wait(l, [&] { return pending_all_ == 0 || error_; });
  rethrow_locked();
  const double s = squares_;
  squares_ = 0;
  return s;
}

size_t HostAccumulator::pick_locked() {
  // The first fold that no earlier job of its bucket holds back; else the oldest job (always
  // free to run: nothing of its bucket is before it).
  size_t pick = 0;
  bool found = false;
  for (size_t i = 0; i < queue_.size(); ++i) {
    char& seen = seen_[static_cast<size_t>(queue_[i].bucket)];
    if (!queue_[i].task && !seen) {
      pick = i;
      found = true;
      break;
    }
    seen = 1;
  }
  for (const Job& j : queue_) seen_[static_cast<size_t>(j.bucket)] = 0;
  return found ? pick : 0;
}

HostAccumulator::Times HostAccumulator::take_times() {
  std::lock_guard<std::mutex> l(mu_);
  Times t = times_;
  times_ = Times{};
  return t;
}

void HostAccumulator::loop() {
  for (;;) {
    Job job;
    int parts = 1;
    {
      std::unique_lock<std::mutex> l(mu_);
      cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop_ and nothing left
      const size_t i = pick_locked();
      job = std::move(queue_[i]);
      queue_.erase(queue_.begin() + static_cast<std::ptrdiff_t>(i));
      parts = task_parts_;
    }
    const bool is_task = static_cast<bool>(job.task);
    const auto t0 = Clock::now();
    double sq = 0;
    std::exception_ptr err;
    try {
      if (is_task) {
        job.task(*team_, parts);
      } else {
        if (job.ready) job.ready->synchronize();
        sq = fold(job.dst, job.src, job.assign, job.squares);
      }
    } catch (...) {
      err = std::current_exception();
    }
    job.dst = job.src = at::Tensor();
    job.ready.reset();
    job.task = nullptr;
    {
      std::lock_guard<std::mutex> l(mu_);
      --pending_.at(static_cast<size_t>(job.bucket));
      if (job.slot >= 0) --slot_pending_[static_cast<size_t>(job.slot)];
      --pending_all_;
      if (!is_task) {
        --pending_folds_;
        times_.busy_s += since(t0);
      }
      if (job.squares) squares_ += sq;
      if (err && !error_) error_ = err;
    }
    cv_.notify_all();
  }
}

}  // namespace ciuic_cpu_adam
