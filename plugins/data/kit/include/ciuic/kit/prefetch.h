// ciuic/kit/prefetch.h — part of the data kit: one background producer filling a bounded queue, in
// a fixed order.
//
// Producer<Item> runs `produce()` on its own thread and keeps at most `depth` finished items
// queued; pop() hands them out in production order. An exception thrown by produce() is kept and
// rethrown by the pop() that reaches it (items produced before it are delivered first). stop()
// joins the thread and drops the queue; start() may follow (after the owner repositioned what
// produce() reads). depth 0 means no thread: pop() calls produce() itself.
//
// Threading: start/stop/pop from one (the owner's) thread; produce() runs on the producer thread
// only (or the owner's, with depth 0), never concurrently with itself.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

namespace ciuic::kit {

template <class Item>
class Producer {
 public:
  Producer(size_t depth, std::function<Item()> produce)
      : depth_(depth), produce_(std::move(produce)) {}
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;
  ~Producer() { stop(); }

  void start() {
    stop();
    if (depth_ == 0) return;
    stopping_ = false;
    failed_ = false;
    thread_ = std::thread([this] { loop(); });
  }

  void stop() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
    queue_.clear();
    error_ = nullptr;
  }

  // The next item; *waited_s gets the seconds spent blocked.
  Item pop(double* waited_s) {
    if (depth_ == 0) return produce_();
    auto t0 = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return !queue_.empty() || failed_; });
    *waited_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (queue_.empty()) std::rethrow_exception(error_);
    Item it = std::move(queue_.front());
    queue_.pop_front();
    l.unlock();
    cv_.notify_all();
    return it;
  }

 private:
  void loop() {
    for (;;) {
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stopping_ || queue_.size() < depth_; });
        if (stopping_) return;
      }
      try {
        Item it = produce_();
        std::lock_guard<std::mutex> l(mu_);
        queue_.push_back(std::move(it));
      } catch (...) {
        std::lock_guard<std::mutex> l(mu_);
        error_ = std::current_exception();
        failed_ = true;
        cv_.notify_all();
        return;
      }
      cv_.notify_all();
    }
  }

  size_t depth_;
  std::function<Item()> produce_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  std::exception_ptr error_;
  bool stopping_ = false, failed_ = false;
};

}  // namespace ciuic::kit
