// [comm] plugin = "gloo": collectives on CPU tensors through LibTorch's c10d ProcessGroupGloo.
//
// Rendezvous through the run's Store (ciuic/c10d.h), under the key prefix "comm/gloo/<n>" (n counts
// gloo communicators created in this process, so several can coexist, e.g. in tests).
// Transport: gloo's TCP device bound to
//   - option `interface` (a network interface name) when set, else
//   - option `hostname` (an address or host name of this machine) when set, else
//   - 127.0.0.1 when the run has one node, else the local address of the route to master_addr.
// Completion: c10d's gloo Work objects offer no completion callbacks (getFuture() is not
// implemented for them). Work::wait() waits for the c10d work itself and then finishes the
// collective (ReduceOp::kAvg is a sum followed by a division by size(), gloo having no average);
// one observer thread per communicator also waits for the issued collectives in issue order and
// finishes those nobody waits for, so an average is complete even when its Work is never waited
// on. Whichever comes first finishes a collective, once.
// Counters: calls and input bytes when issued; busy time is the time during which at least one
// collective was in flight (union of [issue, completion] intervals), recorded on completion as
// seen by the observer.
#define CIUIC_PLUGIN_API 7
#include <ATen/ops/div.h>
#include <arpa/inet.h>
#include <ciuic/c10d.h>
#include <ciuic/comm.h>
#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <ciuic/plugin.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include "common/comm_checks.h"

namespace {

using Clock = std::chrono::steady_clock;
using ciuic::Error;
using ciuic::comm_common::nbytes;
using ciuic::comm_common::op_name;
using ciuic::comm_common::seconds_str;

std::atomic<int> g_instances{0};

// The local address used to reach `host` (connect() on a UDP socket sends nothing).
std::string local_address_towards(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port > 0 ? port : 9).c_str(), &hints, &res) != 0 ||
      !res)
    throw Error("comm gloo: cannot resolve master_addr \"" + host +
                "\" to choose the network interface; set [comm] interface or hostname");
  std::string result;
  for (addrinfo* ai = res; ai && result.empty(); ai = ai->ai_next) {
    int s = socket(ai->ai_family, SOCK_DGRAM, 0);
    if (s < 0) continue;
    sockaddr_storage local{};
    socklen_t len = sizeof local;
    if (connect(s, ai->ai_addr, ai->ai_addrlen) == 0 &&
        getsockname(s, reinterpret_cast<sockaddr*>(&local), &len) == 0) {
      char buf[INET6_ADDRSTRLEN] = {0};
      const void* addr =
          local.ss_family == AF_INET
              ? static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&local)->sin_addr)
              : static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&local)->sin6_addr);
      if (inet_ntop(local.ss_family, addr, buf, sizeof buf)) result = buf;
    }
    close(s);
  }
  freeaddrinfo(res);
  if (result.empty())
    throw Error("comm gloo: no route from this host to master_addr \"" + host +
                "\"; set [comm] interface or hostname");
  return result;
}

// Counters shared between the communicator and the completion callbacks (which may run after
// the communicator's destruction started, hence shared ownership).
struct Stats {
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> bytes{0};
  std::mutex mu;
  double busy = 0.0;
  Clock::time_point busy_until{};

  void completed(Clock::time_point start, Clock::time_point end) {
    std::lock_guard<std::mutex> l(mu);
    auto from = std::max(start, busy_until);
    if (end > from) busy += std::chrono::duration<double>(end - from).count();
    busy_until = std::max(busy_until, end);
  }
};

// One issued collective, shared by its Work and the observer thread. Whichever of them sees the
// c10d work finish first completes it (finish()), exactly once.
struct Pending {
  c10::intrusive_ptr<c10d::Work> work;  // cleared once done
  at::Tensor out;                       // divided by `divisor` on completion when divisor > 0
  at::Tensor copy_from;                 // when defined, copied into `out` on completion (first)
  double divisor = 0.0;
  Clock::time_point start;
  std::string what;
  std::shared_ptr<Stats> stats;

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::string error;  // set with done when the collective failed

  // Waits for the c10d work (on the calling thread), then completes the collective unless the
  // other side already did.
  void finish() {
    c10::intrusive_ptr<c10d::Work> w;
    {
      std::lock_guard<std::mutex> l(mu);
      if (done) return;
      w = work;
    }
    std::string err;
    try {
      w->wait();
    } catch (const c10::Error& e) {
      err = e.what_without_backtrace();
    } catch (const std::exception& e) {
      err = e.what();
    }
    while (!err.empty() && err.back() == '\n') err.pop_back();
    {
      std::lock_guard<std::mutex> l(mu);
      if (done) return;
      try {
        if (err.empty() && copy_from.defined()) out.copy_(copy_from);
        if (err.empty() && divisor > 0) out.div_(divisor);
      } catch (const std::exception& e) {
        err = e.what();
      }
      stats->completed(start, Clock::now());
      error = std::move(err);
      done = true;
      work.reset();
      out = at::Tensor();
      copy_from = at::Tensor();
    }
    cv.notify_all();
  }
};

class GlooWork final : public ciuic::Work {
 public:
  explicit GlooWork(std::shared_ptr<Pending> p) : p_(std::move(p)) {}

  void wait() override {
    p_->finish();
    std::lock_guard<std::mutex> l(p_->mu);
    if (!p_->error.empty()) throw Error(p_->what + " failed: " + p_->error);
  }
  bool is_completed() override {
    std::lock_guard<std::mutex> l(p_->mu);
    return p_->done || (p_->work && p_->work->isCompleted());
  }

 private:
  std::shared_ptr<Pending> p_;
};

// Waits for issued collectives in order and completes them (see the file comment).
class Observer {
 public:
  Observer() : thread_([this] { run(); }) {}
  ~Observer() {
    {
      std::lock_guard<std::mutex> l(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void push(std::shared_ptr<Pending> p) {
    {
      std::lock_guard<std::mutex> l(mu_);
      queue_.push_back(std::move(p));
    }
    cv_.notify_all();
  }

 private:
  void run() {
    for (;;) {
      std::shared_ptr<Pending> p;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;  // stopping, nothing left
        p = std::move(queue_.front());
        queue_.pop_front();
      }
      p->finish();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Pending>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

constexpr ciuic::Option<std::string> kInterface{
    "interface", "\"\"",
    "network interface for gloo's TCP transport (e.g. eth0); default: loopback on one node, "
    "else the interface that routes to master_addr"};
constexpr ciuic::Option<std::string> kHostname{
    "hostname", "\"\"",
    "address or host name of this machine to bind gloo's transport to (when interface is empty)"};
constexpr ciuic::Option<int64_t> kThreads{"threads", "2", "gloo worker threads running collectives",
                                          1, 64};

class GlooComm final : public ciuic::Comm {
 public:
  GlooComm(const ciuic::Config& cfg, const ciuic::RunContext& ctx)
      : rank_(ctx.rank),
        size_(ctx.world_size),
        timeout_(ctx.timeout),
        args_("gloo", size_),
        stats_(std::make_shared<Stats>()) {
    if (!ctx.device.is_cpu())
      throw ciuic::UsageError("comm gloo works on CPU tensors; the run's device is " +
                              ctx.device.str() + " (use [comm] plugin = \"nccl\" on CUDA)");
    const std::string iface = cfg.get(kInterface), host = cfg.get(kHostname);
    const int threads = static_cast<int>(cfg.get(kThreads));

    auto opts = c10d::ProcessGroupGloo::Options::create(timeout_);
    opts->threads = threads;
    std::string bound;
    try {
      if (!iface.empty()) {
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(iface));
        bound = "interface " + iface;
      } else {
        std::string h = host;
        if (h.empty())
          h = ctx.num_nodes == 1 ? "127.0.0.1"
                                 : local_address_towards(ctx.master_addr, ctx.master_port);
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(h));
        bound = h;
      }
    } catch (const c10::Error& e) {
      throw Error("comm gloo: cannot open gloo's transport on " +
                  (iface.empty() ? "host " + (host.empty() ? std::string("(auto)") : host)
                                 : "interface " + iface) +
                  ": " + e.what_without_backtrace());
    }
    const int instance = g_instances.fetch_add(1);
    auto store = c10::make_intrusive<c10d::PrefixStore>("comm/gloo/" + std::to_string(instance),
                                                        ciuic::c10d_store(ctx.store));
    try {
      pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank_, size_, opts);
    } catch (const c10::Error& e) {
      throw Error("comm gloo: rank " + std::to_string(rank_) + " could not connect to the other " +
                  std::to_string(size_ - 1) + " rank(s) within " + seconds_str(timeout_) + ": " +
                  e.what_without_backtrace());
    }
    ciuic::log_debug("comm gloo: rank " + std::to_string(rank_) + " of " + std::to_string(size_) +
                     " connected over " + bound + " (" + std::to_string(threads) + " threads)");
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  c10::Device device() const override { return c10::Device(c10::kCPU); }
  std::string backend_name() const override { return "gloo"; }

  std::unique_ptr<ciuic::Work> all_reduce(at::Tensor& tensor, ciuic::ReduceOp op) override {
    check_tensor(tensor, "all_reduce", "tensor");
    check_avg(tensor, op, "all_reduce");
    c10d::AllreduceOptions o;
    o.reduceOp = c10d_op(op);
    o.timeout = timeout_;
    std::vector<at::Tensor> ts{tensor};
    return issue("all_reduce(" + std::string(op_name(op)) + ")", tensor, nbytes(tensor),
                 op == ciuic::ReduceOp::kAvg, [&] { return pg_->allreduce(ts, o); });
  }

  std::unique_ptr<ciuic::Work> reduce_scatter(at::Tensor& output, const at::Tensor& input,
                                              ciuic::ReduceOp op) override {
    check_tensor(output, "reduce_scatter", "output");
    check_tensor(input, "reduce_scatter", "input");
    args_.same_dtype(output, input, "reduce_scatter");
    args_.scatter_sizes(output, input);
    check_avg(output, op, "reduce_scatter");
    // An all-reduce of a copy of the input, whose own chunk is copied into `output` on completion.
    // (Gloo's _reduce_scatter_base copies its result into the output in a continuation that
    // can still be running when its work's wait() returns: an average divided right after it
    // lost elements. The copy here happens on the thread that completes the collective.)
    c10d::AllreduceOptions o;
    o.reduceOp = c10d_op(op);
    o.timeout = timeout_;
    at::Tensor buf = input.reshape({-1}).clone();
    std::vector<at::Tensor> ts{buf};
    const int64_t n = output.numel();
    return issue(
        "reduce_scatter(" + std::string(op_name(op)) + ")", output, nbytes(input),
        op == ciuic::ReduceOp::kAvg, [&] { return pg_->allreduce(ts, o); },
        buf.narrow(0, static_cast<int64_t>(rank_) * n, n).view(output.sizes()));
  }

  std::unique_ptr<ciuic::Work> all_gather(at::Tensor& output, const at::Tensor& input) override {
    check_tensor(output, "all_gather", "output");
    check_tensor(input, "all_gather", "input");
    args_.same_dtype(output, input, "all_gather");
    args_.gather_sizes(output, input);
    c10d::AllgatherOptions o;
    o.timeout = timeout_;
    at::Tensor in = input;
    return issue("all_gather", output, nbytes(input), false,
                 [&] { return pg_->_allgather_base(output, in, o); });
  }

  std::unique_ptr<ciuic::Work> broadcast(at::Tensor& tensor, int root) override {
    check_tensor(tensor, "broadcast", "tensor");
    args_.root(root);
    c10d::BroadcastOptions o;
    o.rootRank = root;
    o.timeout = timeout_;
    std::vector<at::Tensor> ts{tensor};
    return issue("broadcast(root " + std::to_string(root) + ")", tensor, nbytes(tensor), false,
                 [&] { return pg_->broadcast(ts, o); });
  }

  void barrier() override {
    c10d::BarrierOptions o;
    o.timeout = timeout_;
    at::Tensor none;
    issue("barrier", none, 0, false, [&] { return pg_->barrier(o); })->wait();
  }

  ciuic::CommCounters counters() const override {
    ciuic::CommCounters c;
    c.calls = stats_->calls.load();
    c.bytes = stats_->bytes.load();
    std::lock_guard<std::mutex> l(stats_->mu);
    c.busy_seconds = stats_->busy;
    return c;
  }

 private:
  static c10d::ReduceOp c10d_op(ciuic::ReduceOp op) {
    switch (op) {
      case ciuic::ReduceOp::kSum:
      case ciuic::ReduceOp::kAvg: return c10d::ReduceOp(c10d::ReduceOp::SUM);
      case ciuic::ReduceOp::kMax: return c10d::ReduceOp(c10d::ReduceOp::MAX);
      case ciuic::ReduceOp::kMin: return c10d::ReduceOp(c10d::ReduceOp::MIN);
    }
    throw Error("comm gloo: unknown reduce op");
  }

  void check_tensor(const at::Tensor& t, const char* op, const char* which) const {
    args_.defined_contiguous(t, op, which);
    if (!t.device().is_cpu())
      args_.fail(op,
                 std::string(which) + " is on " + t.device().str() + "; gloo works on CPU tensors");
  }
  void check_avg(const at::Tensor& t, ciuic::ReduceOp op, const char* name) const {
    if (op == ciuic::ReduceOp::kAvg && !at::isFloatingType(t.scalar_type()))
      args_.fail(name, std::string("avg needs a floating-point tensor, got ") +
                           c10::toString(t.scalar_type()));
  }

  template <class Start>
  std::unique_ptr<ciuic::Work> issue(const std::string& name, const at::Tensor& result,
                                     int64_t bytes, bool divide, Start&& start,
                                     at::Tensor copy_from = at::Tensor()) {
    const std::string what = "comm gloo: " + name + " of " + std::to_string(bytes) +
                             " bytes on rank " + std::to_string(rank_) + " (timeout " +
                             seconds_str(timeout_) + ")";
    stats_->calls.fetch_add(1);
    stats_->bytes.fetch_add(static_cast<uint64_t>(bytes));
    auto p = std::make_shared<Pending>();
    p->stats = stats_;
    p->start = Clock::now();
    p->what = what;
    try {
      p->work = start();
    } catch (const c10::Error& e) {
      throw Error(what + " failed: " + e.what_without_backtrace());
    }
    if (divide || copy_from.defined()) p->out = result;
    if (divide) p->divisor = static_cast<double>(size_);
    p->copy_from = std::move(copy_from);
    observer_->push(p);
    return std::make_unique<GlooWork>(std::move(p));
  }

  int rank_, size_;
  std::chrono::milliseconds timeout_;
  ciuic::comm_common::ArgChecker args_;
  std::shared_ptr<Stats> stats_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  // Declared last: destroyed first, after completing every issued collective (each ends, at the
  // latest, with gloo's timeout), while pg_ still exists.
  std::unique_ptr<Observer> observer_ = std::make_unique<Observer>();
};

const ciuic::OptionSpec kOptions[] = {kInterface, kHostname, kThreads};

}  // namespace

CIUIC_DEFINE_PLUGIN(ciuic::Slot::kComm, "gloo", "1.0.0",
                    "collectives on CPU tensors through LibTorch's c10d ProcessGroupGloo", kOptions,
                    [](const ciuic::PluginArgs& a) -> ciuic::PluginObject* {
                      return new GlooComm(a.config, a.context);
                    })
