// ciuic/thread_pool.h — a fixed team of threads that runs one parallel job at a time together
// with the caller (cpu_adam's update, the sharding's host gradient fold). Its own threads, not
// ATen's: a job run from a thread ATen did not size (a plugin's or the core's background thread)
// gets exactly the parallelism asked for.
//
// run(fn) calls fn(i) for every i in [0, size()) concurrently — i = 0 on the calling thread,
// the others on the team's workers — and returns when all calls have returned. Workers sleep on a
// condition variable between jobs (an optimizer step is far longer than a wake-up).
//
// Threading: run() must not be called concurrently or re-entrantly (one owner thread).
// Failure: the first exception thrown by any fn(i) is rethrown by run() after all have finished.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include <ciuic/export.h>

namespace ciuic {

class CIUIC_API ThreadPool {
 public:
  explicit ThreadPool(int threads);  // threads >= 1; starts threads - 1 workers
  ~ThreadPool();                     // stops and joins the workers
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  void run(const std::function<void(int)>& fn);

  // [begin, end) cut into size() consecutive pieces whose boundaries are multiples of `align`
  // (except `end`); piece i of `index`. Some pieces may be empty.
  static std::pair<int64_t, int64_t> piece(int64_t begin, int64_t end, int parts, int index,
                                           int64_t align);

 private:
  void worker(int index);

  std::vector<std::thread> workers_;
  std::mutex mu_;
  std::condition_variable wake_, done_;
  const std::function<void(int)>* job_ = nullptr;
  uint64_t generation_ = 0;
  int running_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace ciuic
