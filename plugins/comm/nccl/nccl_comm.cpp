// [comm] plugin = "nccl": collectives on CUDA tensors through NCCL's C API (not c10d's
// ProcessGroupNCCL).
//
// Set-up: `transport` is applied to NCCL's environment variables (see kTransports) before the
// first NCCL call of this process; rank 0 creates the unique id and shares it through the run's
// Store ("comm/nccl/<n>/uid", n counting communicators of this process); the communicator is
// created non-blocking (ncclConfig_t.blocking = 0) so that every wait on it is bounded.
//
// Streams: collectives run on one dedicated CUDA stream of the highest priority. Each collective
// records an event on the caller's current (compute) stream and makes the comm stream wait for
// it, so it sees everything queued before it; after the NCCL call it records an event on the comm
// stream, and Work::wait() makes the then-current stream wait for that event (no host block).
// Caching-allocator safety: every tensor handed to a collective is record_stream()'ed onto the
// comm stream, so its memory is not reused before the collective is done even when the caller
// drops it early.
//
// Failure: a watchdog thread checks every 100 ms for NCCL asynchronous errors and for collectives
// that have not completed within the run's timeout. On either it logs the cause, calls
// ncclCommAbort (which also ends the NCCL kernels, so the streams drain), and the next call into
// the communicator (or Work::wait) throws ciuic::Error with that message. If the process does not
// pick the error up within 10 s (e.g. it waits elsewhere), the watchdog ends the process with exit
// code 1 rather than let it hang.
//
// Counters: calls and input bytes when issued; busy time from timing events around each NCCL
// call on the comm stream, read lazily (counters() collects the completed ones).
#define CIUIC_PLUGIN_API 7
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <ciuic/comm.h>
#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <ciuic/plugin.h>
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/comm_checks.h"

namespace {

using Clock = std::chrono::steady_clock;
using ciuic::Error;
using ciuic::comm_common::nbytes;
using ciuic::comm_common::op_name;
using ciuic::comm_common::seconds_str;

std::atomic<int> g_instances{0};

void cuda_check(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess)
    throw Error(std::string("comm nccl: ") + what + ": " + cudaGetErrorString(rc));
}

// ---- transports ---------------------------------------------------------------------------------
struct EnvSetting {
  const char* name;
  const char* value;
};
struct Transport {
  const char* name;
  std::vector<EnvSetting> env;
  const char* meaning;
};
// NCCL reads these once, when it initialises in this process (docs/performance/comm.md,
// docs/launch.md). NCCL_NVLS_ENABLE is only ever set to 0 (NVLink SHARP/multicast off).
const std::vector<Transport> kTransports = {
    {"auto", {}, "NCCL's own choice of transport"},
    {"nvlink", {{"NCCL_P2P_LEVEL", "NVL"}}, "peer-to-peer only between GPUs linked by NVLink"},
    {"pcie",
     {{"NCCL_P2P_DISABLE", "1"}, {"NCCL_NVLS_ENABLE", "0"}},
     "no peer-to-peer: transfers staged through host memory (as on GPUs without P2P, e.g. RTX "
     "4090)"},
    {"shm",
     {{"NCCL_P2P_DISABLE", "1"}, {"NCCL_SHM_DISABLE", "0"}, {"NCCL_NVLS_ENABLE", "0"}},
     "no peer-to-peer, shared-memory transport forced on"},
};

void apply_transport(const std::string& name, int rank) {
  for (const auto& t : kTransports) {
    if (name != t.name) continue;
    std::string set;
    for (const auto& e : t.env) {
      const char* old = std::getenv(e.name);
      if (old && std::string(old) != e.value && rank == 0)
        ciuic::log_warn(std::string("comm nccl: transport ") + t.name + " overrides " + e.name +
                        "=" + old + " from the environment with " + e.value);
      setenv(e.name, e.value, 1);
      set += std::string(" ") + e.name + "=" + e.value;
    }
    if (rank == 0)
      ciuic::log_info(std::string("comm nccl: transport ") + t.name + " (" + t.meaning + ")" +
                      (set.empty() ? "" : ":" + set));
    return;
  }
  throw ciuic::UsageError("comm nccl: unknown transport \"" + name +
                          "\" (expected auto, nvlink, pcie or shm)");
}

ncclDataType_t nccl_type(at::ScalarType t, const char* op) {
  switch (t) {
    case at::kFloat: return ncclFloat32;
    case at::kHalf: return ncclFloat16;
    case at::kBFloat16: return ncclBfloat16;
    case at::kDouble: return ncclFloat64;
    case at::kInt: return ncclInt32;
    case at::kLong: return ncclInt64;
    case at::kByte: return ncclUint8;
    case at::kChar: return ncclInt8;
    default:
      throw Error(std::string("comm backend nccl does not support ") + op + " on " +
                  c10::toString(t) + " tensors");
  }
}

ncclRedOp_t nccl_op(ciuic::ReduceOp op) {
  switch (op) {
    case ciuic::ReduceOp::kSum: return ncclSum;
    case ciuic::ReduceOp::kAvg: return ncclAvg;
    case ciuic::ReduceOp::kMax: return ncclMax;
    case ciuic::ReduceOp::kMin: return ncclMin;
  }
  throw Error("comm nccl: unknown reduce op");
}

// ---- events
// -------------------------------------------------------------------------------------- A pair of
// timing events around one NCCL call; `end` also marks completion. Pooled.
struct EventPair {
  cudaEvent_t start = nullptr, end = nullptr;
};

class EventPool {
 public:
  ~EventPool() {
    for (auto* p : free_) {
      cudaEventDestroy(p->start);
      cudaEventDestroy(p->end);
      delete p;
    }
  }
  std::shared_ptr<EventPair> get(const std::shared_ptr<EventPool>& self) {
    EventPair* p = nullptr;
    {
      std::lock_guard<std::mutex> l(mu_);
      if (!free_.empty()) {
        p = free_.back();
        free_.pop_back();
      }
    }
    if (!p) {
      p = new EventPair;
      cuda_check(cudaEventCreate(&p->start), "cudaEventCreate");
      cuda_check(cudaEventCreate(&p->end), "cudaEventCreate");
    }
    std::weak_ptr<EventPool> weak = self;
    return std::shared_ptr<EventPair>(p, [weak](EventPair* e) {
      if (auto pool = weak.lock()) {
        std::lock_guard<std::mutex> l(pool->mu_);
        pool->free_.push_back(e);
      } else {
        cudaEventDestroy(e->start);
        cudaEventDestroy(e->end);
        delete e;
      }
    });
  }

 private:
  std::mutex mu_;
  std::vector<EventPair*> free_;
};

// Error state shared by the communicator, its Works and the watchdog.
struct Health {
  std::mutex mu;
  std::string error;                  // non-empty once failed
  std::atomic<bool> reported{false};  // the error was thrown to the caller at least once

  bool failed() {
    std::lock_guard<std::mutex> l(mu);
    return !error.empty();
  }
  void throw_if_failed() {
    std::string e;
    {
      std::lock_guard<std::mutex> l(mu);
      e = error;
    }
    if (!e.empty()) {
      reported = true;
      throw Error(e);
    }
  }
};

class NcclWork final : public ciuic::Work {
 public:
  NcclWork(std::shared_ptr<EventPair> ev, std::shared_ptr<Health> health, c10::DeviceIndex dev)
      : ev_(std::move(ev)), health_(std::move(health)), dev_(dev) {}

  void wait() override {
    health_->throw_if_failed();
    auto current = c10::cuda::getCurrentCUDAStream(dev_);
    cuda_check(cudaStreamWaitEvent(current.stream(), ev_->end, 0), "cudaStreamWaitEvent");
  }
  bool is_completed() override {
    if (health_->failed()) return true;
    return cudaEventQuery(ev_->end) == cudaSuccess;
  }

 private:
  std::shared_ptr<EventPair> ev_;
  std::shared_ptr<Health> health_;
  c10::DeviceIndex dev_;
};

constexpr ciuic::Option<std::string> kTransport{
    "transport",
    "\"auto\"",
    "auto: NCCL decides; nvlink: P2P only over NVLink (NCCL_P2P_LEVEL=NVL); pcie: no P2P, via "
    "host memory (NCCL_P2P_DISABLE=1, NCCL_NVLS_ENABLE=0); shm: as pcie plus NCCL_SHM_DISABLE=0",
    NAN,
    NAN,
    "auto|nvlink|pcie|shm"};

class NcclComm final : public ciuic::Comm {
 public:
  NcclComm(const ciuic::Config& cfg, const ciuic::RunContext& ctx)
      : rank_(ctx.rank),
        size_(ctx.world_size),
        timeout_(ctx.timeout),
        args_("nccl", size_),
        health_(std::make_shared<Health>()),
        events_(std::make_shared<EventPool>()) {
    if (!ctx.device.is_cuda())
      throw ciuic::UsageError(
          "comm nccl needs CUDA tensors; the run's device is " + ctx.device.str() +
          " (set [cluster] device = \"cuda\", or use [comm] plugin = \"gloo\")");
    device_ = ctx.device.has_index() ? ctx.device.index() : c10::cuda::current_device();
    c10::cuda::CUDAGuard guard(device_);
    const std::string transport = cfg.get(kTransport);
    apply_transport(transport, rank_);
    transport_ = transport;

    // Unique id through the run's store.
    const int instance = g_instances.fetch_add(1);
    const std::string key = "comm/nccl/" + std::to_string(instance) + "/uid";
    ncclUniqueId id;
    if (rank_ == 0) {
      nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId", nullptr);
      ctx.store->set(key, std::string(id.internal, sizeof id.internal));
    } else {
      std::string v = ctx.store->get(key);
      if (v.size() != sizeof id.internal)
        throw Error("comm nccl: the unique id in the store (" + key + ") has " +
                    std::to_string(v.size()) + " bytes, expected " +
                    std::to_string(sizeof id.internal));
      std::memcpy(id.internal, v.data(), sizeof id.internal);
    }

    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    config.commName = "ciuic";
    ncclResult_t rc = ncclCommInitRankConfig(&comm_, size_, id, rank_, &config);
    if (rc != ncclSuccess && rc != ncclInProgress) {
      std::string msg = "comm nccl: rank " + std::to_string(rank_) +
                        ": ncclCommInitRankConfig failed: " + ncclGetErrorString(rc);
      if (comm_) ncclCommAbort(comm_);
      throw Error(msg);
    }
    try {
      wait_ready("communicator set-up (ncclCommInitRankConfig; are all " + std::to_string(size_) +
                 " ranks running, each on its own GPU?)");
    } catch (...) {
      ncclCommAbort(comm_);
      comm_ = nullptr;
      throw;
    }

    int lo = 0, hi = 0;
    cuda_check(cudaDeviceGetStreamPriorityRange(&lo, &hi), "cudaDeviceGetStreamPriorityRange");
    cuda_check(cudaStreamCreateWithPriority(&raw_stream_, cudaStreamNonBlocking, hi),
               "cudaStreamCreateWithPriority");
    stream_.emplace(c10::cuda::getStreamFromExternal(raw_stream_, device_));
    cuda_check(cudaEventCreateWithFlags(&ready_, cudaEventDisableTiming), "cudaEventCreate");
    cuda_check(cudaMalloc(&barrier_buf_, sizeof(int32_t)), "cudaMalloc");
    watchdog_ = std::thread([this] { watch(); });
    ciuic::log_debug("comm nccl: rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                     " on cuda:" + std::to_string(device_) + ", transport " + transport_);
  }

  ~NcclComm() override {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    if (comm_) {
      // Let issued collectives finish (bounded by the timeout), then finalize; abort otherwise.
      bool clean = !health_->failed() && wait_stream_idle();
      if (clean) {
        ncclResult_t rc = ncclCommFinalize(comm_);
        clean = (rc == ncclSuccess || rc == ncclInProgress) && try_wait_ready();
      }
      if (clean)
        ncclCommDestroy(comm_);
      else
        ncclCommAbort(comm_);
    }
    if (barrier_buf_) cudaFree(barrier_buf_);
    if (ready_) cudaEventDestroy(ready_);
    if (raw_stream_) cudaStreamDestroy(raw_stream_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  c10::Device device() const override { return c10::Device(c10::kCUDA, device_); }
  std::string backend_name() const override { return "nccl"; }

  std::unique_ptr<ciuic::Work> all_reduce(at::Tensor& tensor, ciuic::ReduceOp op) override {
    check_tensor(tensor, "all_reduce", "tensor");
    auto type = nccl_type(tensor.scalar_type(), "all_reduce");
    auto rop = nccl_op(op);
    return issue("all_reduce(" + std::string(op_name(op)) + ")", nbytes(tensor), {tensor},
                 [&](cudaStream_t s) {
                   return ncclAllReduce(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), type,
                                        rop, comm_, s);
                 });
  }

  std::unique_ptr<ciuic::Work> reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                              ciuic::ReduceOp op) override {
    check_tensor(output, "reduce_scatter", "output");
    check_tensor(input, "reduce_scatter", "input");
    args_.same_dtype(output, input, "reduce_scatter");
    args_.scatter_sizes(output, input);
    auto type = nccl_type(output.scalar_type(), "reduce_scatter");
    auto rop = nccl_op(op);
    return issue("reduce_scatter(" + std::string(op_name(op)) + ")", nbytes(input), {output, input},
                 [&](cudaStream_t s) {
                   return ncclReduceScatter(input.data_ptr(), output.data_ptr(), output.numel(),
                                            type, rop, comm_, s);
                 });
  }

  std::unique_ptr<ciuic::Work> all_gather(at::Tensor& output, const at::Tensor& input) override {
    check_tensor(output, "all_gather", "output");
    check_tensor(input, "all_gather", "input");
    args_.same_dtype(output, input, "all_gather");
    args_.gather_sizes(output, input);
    auto type = nccl_type(output.scalar_type(), "all_gather");
    return issue("all_gather", nbytes(input), {output, input}, [&](cudaStream_t s) {
      return ncclAllGather(input.data_ptr(), output.data_ptr(), input.numel(), type, comm_, s);
    });
  }

  std::unique_ptr<ciuic::Work> broadcast(at::Tensor& tensor, int root) override {
    check_tensor(tensor, "broadcast", "tensor");
    args_.root(root);
    auto type = nccl_type(tensor.scalar_type(), "broadcast");
    return issue("broadcast(root " + std::to_string(root) + ")", nbytes(tensor), {tensor},
                 [&](cudaStream_t s) {
                   return ncclBroadcast(tensor.data_ptr(), tensor.data_ptr(), tensor.numel(), type,
                                        root, comm_, s);
                 });
  }

  void barrier() override {
    c10::cuda::CUDAGuard guard(device_);
    auto work = issue("barrier", 0, {}, [&](cudaStream_t s) {
      return ncclAllReduce(barrier_buf_, barrier_buf_, 1, ncclInt32, ncclSum, comm_, s);
    });
    // Host wait, bounded by the watchdog (which aborts after the timeout).
    auto pause = std::chrono::microseconds(20);
    while (!work->is_completed()) {
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
    health_->throw_if_failed();
  }

  ciuic::CommCounters counters() const override {
    std::lock_guard<std::mutex> l(timing_mu_);
    while (!timings_.empty() && cudaEventQuery(timings_.front()->end) == cudaSuccess) {
      float ms = 0.f;
      if (cudaEventElapsedTime(&ms, timings_.front()->start, timings_.front()->end) == cudaSuccess)
        busy_seconds_ += ms / 1000.0;
      timings_.pop_front();
    }
    ciuic::CommCounters c;
    c.calls = calls_.load();
    c.bytes = bytes_.load();
    c.busy_seconds = busy_seconds_;
    return c;
  }

 private:
  void check_tensor(const at::Tensor& t, const char* op, const char* which) const {
    args_.defined_contiguous(t, op, which);
    if (!t.is_cuda() || t.device().index() != device_)
      args_.fail(op, std::string(which) + " is on " + t.device().str() +
                         ", expected cuda:" + std::to_string(device_));
  }

  // "comm nccl: rank R: <what>", unless `what` already names the plugin (collectives' names do).
  std::string about(const std::string& what) const {
    if (what.rfind("comm nccl:", 0) == 0) return what;
    return "comm nccl: rank " + std::to_string(rank_) + ": " + what;
  }

  void nccl_check(ncclResult_t rc, const std::string& what, ncclComm_t comm) {
    if (rc == ncclSuccess || rc == ncclInProgress) return;
    std::string last = comm ? ncclGetLastError(comm) : "";
    throw Error(about(what) + " failed: " + ncclGetErrorString(rc) +
                (last.empty() ? "" : " (" + last + ")"));
  }

  // Polls the non-blocking communicator until its last operation finished; throws (without
  // aborting) on an error or after the timeout.
  void wait_ready(const std::string& what) {
    const auto start = Clock::now();
    const auto deadline = start + timeout_;
    // An enqueue that returned ncclInProgress is usually done within microseconds: spin (yielding)
    // briefly before sleeping, since a sleep costs ~60 us at least and collectives are issued
    // from the backward pass's thread.
    const auto spin_until = start + std::chrono::microseconds(300);
    auto pause = std::chrono::microseconds(10);
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclResult_t rc = ncclCommGetAsyncError(comm_, &state);
      if (rc != ncclSuccess) state = rc;
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) nccl_check(state, what, comm_);
      const auto now = Clock::now();
      if (now > deadline)
        throw Error(about(what) + " did not complete within " + seconds_str(timeout_));
      if (now < spin_until) {
        std::this_thread::yield();
        continue;
      }
      std::this_thread::sleep_for(pause);
      pause = std::min(pause * 2, std::chrono::microseconds(10000));
    }
  }
  bool try_wait_ready() {
    try {
      wait_ready("ncclCommFinalize");
      return true;
    } catch (const Error& e) {
      ciuic::log_warn(e.what());
      return false;
    }
  }
  bool wait_stream_idle() {
    const auto deadline = Clock::now() + timeout_;
    while (cudaStreamQuery(raw_stream_) == cudaErrorNotReady) {
      if (Clock::now() > deadline) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return true;
  }

  template <class Call>
  std::unique_ptr<ciuic::Work> issue(const std::string& name, int64_t bytes,
                                     std::initializer_list<at::Tensor> tensors, Call&& call) {
    health_->throw_if_failed();
    c10::cuda::CUDAGuard guard(device_);
    cudaStream_t comm = raw_stream_;
    // Order after the caller's queued work.
    auto current = c10::cuda::getCurrentCUDAStream(device_);
    cuda_check(cudaEventRecord(ready_, current.stream()), "cudaEventRecord");
    cuda_check(cudaStreamWaitEvent(comm, ready_, 0), "cudaStreamWaitEvent");
    auto ev = events_->get(events_);
    cuda_check(cudaEventRecord(ev->start, comm), "cudaEventRecord");
    const std::string what = "comm nccl: " + name + " of " + std::to_string(bytes) +
                             " bytes on rank " + std::to_string(rank_);
    ncclResult_t rc = call(comm);
    if (rc == ncclInProgress) {
      wait_ready(what);
    } else if (rc != ncclSuccess) {
      nccl_check(rc, what, comm_);
    }
    cuda_check(cudaEventRecord(ev->end, comm), "cudaEventRecord");
    for (const auto& t : tensors)
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), *stream_);
    calls_.fetch_add(1);
    bytes_.fetch_add(static_cast<uint64_t>(bytes));
    {
      std::lock_guard<std::mutex> l(timing_mu_);
      timings_.push_back(ev);
    }
    {
      std::lock_guard<std::mutex> l(mu_);
      pending_.push_back({ev, Clock::now() + timeout_, what});
    }
    return std::make_unique<NcclWork>(std::move(ev), health_, device_);
  }

  // ---- watchdog ----
  struct Watched {
    std::shared_ptr<EventPair> ev;
    Clock::time_point deadline;
    std::string what;
  };

  void watch() {
    c10::cuda::CUDAGuard guard(device_);
    std::unique_lock<std::mutex> l(mu_);
    while (!stop_) {
      cv_.wait_for(l, std::chrono::milliseconds(100));
      if (stop_ || health_->failed()) continue;
      std::string failure;
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        failure = "comm nccl: rank " + std::to_string(rank_) +
                  ": NCCL reported an asynchronous error: " + ncclGetErrorString(state) + " (" +
                  ncclGetLastError(comm_) + ")";
      }
      while (failure.empty() && !pending_.empty()) {
        cudaError_t q = cudaEventQuery(pending_.front().ev->end);
        if (q == cudaSuccess) {
          pending_.pop_front();
          continue;
        }
        if (q != cudaErrorNotReady) {
          failure = pending_.front().what + " failed on the device: " + cudaGetErrorString(q);
        } else if (Clock::now() > pending_.front().deadline) {
          failure = pending_.front().what + " did not complete within " + seconds_str(timeout_) +
                    " (a peer is probably dead or stuck); the communicator was aborted";
        }
        break;
      }
      if (failure.empty()) continue;
      l.unlock();
      fail(failure);
      l.lock();
      pending_.clear();
    }
  }

  void fail(const std::string& message) {
    {
      std::lock_guard<std::mutex> l(health_->mu);
      health_->error = message;
    }
    ciuic::log_error(message);
    ncclCommAbort(comm_);
    comm_ = nullptr;
    // The error reaches the caller at its next call into the communicator. If it never comes
    // (the training thread waits on something else), end the process instead of hanging.
    std::unique_lock<std::mutex> l(mu_);
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (!stop_ && !health_->reported && Clock::now() < deadline)
      cv_.wait_for(l, std::chrono::milliseconds(100));
    if (!stop_ && !health_->reported) {
      ciuic::log_error("comm nccl: rank " + std::to_string(rank_) +
                       ": the communication failure was not handled within 10 s; exiting");
      std::_Exit(ciuic::kExitRuntime);
    }
  }

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  ciuic::comm_common::ArgChecker args_;
  c10::DeviceIndex device_ = 0;
  std::string transport_;
  std::shared_ptr<Health> health_;
  std::shared_ptr<EventPool> events_;
  ncclComm_t comm_ = nullptr;
  cudaStream_t raw_stream_ = nullptr;
  std::optional<c10::cuda::CUDAStream> stream_;
  cudaEvent_t ready_ = nullptr;
  void* barrier_buf_ = nullptr;

  std::atomic<uint64_t> calls_{0}, bytes_{0};
  mutable std::mutex timing_mu_;
  mutable std::deque<std::shared_ptr<EventPair>> timings_;
  mutable double busy_seconds_ = 0.0;

  std::mutex mu_;  // guards pending_, stop_
  std::condition_variable cv_;
  std::deque<Watched> pending_;
  bool stop_ = false;
  std::thread watchdog_;
};

const ciuic::OptionSpec kOptions[] = {kTransport};

}  // namespace

CIUIC_DEFINE_PLUGIN(ciuic::Slot::kComm, "nccl", "1.0.0",
                    "collectives on CUDA tensors through NCCL's C API on a dedicated stream",
                    kOptions, [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
                      return new NcclComm(a.config, a.context);
                    })
