// cpu_adam's gradient sink: how reduced gradient chunks reach the fp32 gradient shard in host
// memory (Optimizer::accumulate_grad, ciuic/optimizer.h).
//
// Each reduced bucket chunk crosses to pinned host memory in the reduce dtype (bf16 on bf16 runs:
// half the bytes of fp32) — into one of cpu_adam's landing slots, or straight into the gradient
// shard when nothing is to be added — and is folded into the fp32 gradient shard on the host by
// this object's background thread, while the GPU goes on with backward and the next micro-batches:
//
//   autograd thread (accumulate_grad)             accumulator thread
//   wait_slot(slot)    <- the slot's previous fold
//   D2H copy into the slot, record event
//   submit(job) --------------------------------->  wait event; dst = (assign ? 0 : dst) + src,
//                                                   in parallel; sum of squares of dst if asked
//   step(): wait_all() -> sum of squares  <-------  done
//
// Jobs run one at a time, each split over the team (ciuic/thread_pool.h; ATen's parallel_for on a
// thread it did not size ran single-threaded: 0.65 s for the 1B shard on H200, where 8 threads
// take ~0.05 s). Besides folds the thread runs tasks: cpu_adam's early update of a region
// (cpu_adam.cpp), queued behind the region's last fold. Order: a job never overtakes an earlier
// job of its own bucket; among the jobs free to run, folds go first (they gate finish_grads() and
// the landing slots backward may wait for), then tasks in submission order. So folds run in
// submission order (squares summed in the same order with or without tasks). Without
// it, the 8 micro-batches of the DeepSeek-7B recipe each waited on the GPU stream and added a
// 13.8 GB fp32 staging shard on the training thread (~1.1 s exposed per micro-batch on 2xH200).
//
// Threading: submit(), submit_task(), wait_free(), wait_folds() and wait_all() are called from the
// training or autograd thread (never concurrently with each other: the Sharding's
// accumulate_grad() and finish_grads() calls alternate); set_task_parts() from any thread;
// jobs run on the private thread. Failure: an exception inside a job is kept and rethrown by the
// next wait_free()/wait_folds()/wait_all(); the destructor waits for queued jobs.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>

#include <ciuic/thread_pool.h>

namespace ciuic_cpu_adam {

class HostAccumulator {
 public:
  // `buckets`: how many gradient regions wait_free() tracks; `threads`: the team share of a fold
  // (and of a task until set_task_parts()); `team`: the team's size (at least `threads`);
  // `slots`: how many landing slots wait_slot() tracks.
  HostAccumulator(int buckets, int threads, int team = 0, int slots = 0);
  ~HostAccumulator();
  HostAccumulator(const HostAccumulator&) = delete;
  HostAccumulator& operator=(const HostAccumulator&) = delete;

  // Blocks until every job submitted for `bucket` has run, so its source region may be
  // overwritten. Returns at once when it has.
  void wait_free(int bucket);

  // Queues dst = (assign ? 0 : dst) + src for a CPU fp32 `dst` and a CPU `src` of the same
  // length (fp32, bf16 or fp16), after `ready` (the copy that fills src; null: src is ready).
  // With `squares`, dst's sum of squares after the update is added to what wait_all() returns.
  // A gradient kept as it came (one chunk a step) is an `assign` job whose `dst` has src's dtype
  // (dst = src, copied) or is src itself (nothing to copy): its squares are those of src as
  // fp32, the same value an fp32 `dst` would give.
  // `slot` (>= 0): src lies in that landing slot, free again (wait_slot()) once this fold ran.
  void submit(int bucket, at::Tensor dst, at::Tensor src, std::unique_ptr<c10::Event> ready,
              bool assign, bool squares, int slot = -1);
  // Blocks until every fold submitted with `slot` has run, so the slot may be overwritten.
  void wait_slot(int slot);

  // Queues fn(team, parts) for `bucket`: it runs after every job submitted before it for the same
  // bucket, on the private thread, and may split its work over parts(<= team.size()) members of
  // the team (team.run(), calls with i >= parts doing nothing). `parts` is the value of
  // set_task_parts() when the task starts.
  using Task = std::function<void(ciuic::ThreadPool& team, int parts)>;
  void submit_task(int bucket, Task fn);
  // The team share of tasks that start from now on (clamped to [1, team size]).
  void set_task_parts(int parts);

  // Blocks until every fold submitted so far has run (tasks may still be queued or running);
  // returns the sum of squares of the `squares` jobs since the previous call and resets it.
  double wait_folds();
  // Blocks until every job (folds and tasks) has run; returns as wait_folds().
  double wait_all();

  // Seconds the thread spent in jobs (including waiting for their copies), and seconds callers
  // blocked in wait_free(), since the previous take_times().
  struct Times {
    double busy_s = 0, blocked_s = 0;
  };
  Times take_times();

 private:
  struct Job {
    int bucket = 0;
    at::Tensor dst, src;  // a fold (task empty)
    std::unique_ptr<c10::Event> ready;
    bool assign = false, squares = false;
    int slot = -1;
    Task task;
  };
  void loop();
  // Index in queue_ of the next job to run (mu_ held, queue_ not empty).
  size_t pick_locked();
  void rethrow_locked();
  // Blocks until counts[index] (pending_ or slot_pending_, guarded by mu_) is 0; counts the wait
  // as blocked time; rethrows a job's error.
  void wait_none_pending(const std::vector<int64_t>& counts, int index);
  double fold(const at::Tensor& dst, const at::Tensor& src, bool assign, bool squares);

  std::unique_ptr<ciuic::ThreadPool> team_;  // used by the accumulator thread only
  int fold_parts_ = 1;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;
  std::vector<int64_t> pending_;       // per bucket: jobs queued or running
  std::vector<int64_t> slot_pending_;  // per landing slot: folds queued or running that read it
  int64_t pending_folds_ = 0, pending_all_ = 0;
  int task_parts_ = 1;
  std::vector<char> seen_;  // pick_locked()'s scratch: buckets with an earlier queued job
  double squares_ = 0;
  Times times_;
  std::exception_ptr error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace ciuic_cpu_adam
