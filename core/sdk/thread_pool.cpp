#include <ciuic/thread_pool.h>

#include <algorithm>

namespace ciuic {

ThreadPool::ThreadPool(int threads) {
  for (int i = 1; i < std::max(1, threads); ++i) workers_.emplace_back([this, i] { worker(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> l(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::run(const std::function<void(int)>& fn) {
  if (workers_.empty()) {
    fn(0);
    return;
  }
  {
    std::lock_guard<std::mutex> l(mu_);
    job_ = &fn;
    running_ = static_cast<int>(workers_.size());
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  std::exception_ptr mine;
  try {
    fn(0);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock<std::mutex> l(mu_);
  done_.wait(l, [&] { return running_ == 0; });
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int)>* job;
    {
      std::unique_lock<std::mutex> l(mu_);
      wake_.wait(l, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
    }
    std::exception_ptr err;
    try {
      (*job)(index);
    } catch (...) {
      err = std::current_exception();
    }
    std::lock_guard<std::mutex> l(mu_);
    if (err && !error_) error_ = err;
    if (--running_ == 0) done_.notify_one();
  }
}

std::pair<int64_t, int64_t> ThreadPool::piece(int64_t begin, int64_t end, int parts, int index,
                                              int64_t align) {
  const int64_t n = end - begin;
  int64_t chunk = (n + parts - 1) / parts;
  chunk = (chunk + align - 1) / align * align;
  const int64_t b = std::min(end, begin + chunk * index);
  const int64_t e = std::min(end, b + chunk);
  return {b, e};
}

}  // namespace ciuic
