// check_comm (ciuic/testing/conformance.h): each rank a forked process, the run's store a c10d
// TCPStore this process hosts, the references rebuilt by every rank from all ranks' inputs.
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <ciuic/comm.h>
#include <ciuic/error.h>
#include <ciuic/testing/conformance.h>

#include "launch/launch.h"
#include "support.h"

namespace ciuic::conformance {
namespace {

using namespace std::chrono_literals;

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kMin: return "min";
  }
  return "?";
}

// Rank `rank`'s input: `exact` values are multiples of 0.5 in [-4, 4], so their sums over <= 8
// ranks are exact in fp16, bf16 and fp32; otherwise N(0, 1) from a generator of (seed, rank).
at::Tensor rank_input(int rank, int64_t numel, at::ScalarType dtype, bool exact, uint64_t seed) {
  at::Tensor t;
  if (exact) {
    const at::Tensor i = at::arange(numel, at::kLong);
    t = ((i * 7 + rank * 13 + static_cast<int64_t>(seed)).remainder(17) - 8).to(at::kDouble) * 0.5;
  } else {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + static_cast<uint64_t>(rank));
    t = at::randn({numel}, gen, at::TensorOptions().dtype(at::kDouble));
  }
  return t.to(dtype);
}

// Every rank's input, [world, numel], in fp64.
at::Tensor all_inputs(int world, int64_t numel, at::ScalarType dtype, bool exact, uint64_t seed) {
  std::vector<at::Tensor> v;
  for (int r = 0; r < world; ++r) v.push_back(rank_input(r, numel, dtype, exact, seed).to(at::kDouble));
  return at::stack(v);
}

at::Tensor reduce_ref(const at::Tensor& stacked, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return stacked.sum(0);
    case ReduceOp::kAvg: return stacked.mean(0);
    case ReduceOp::kMax: return std::get<0>(stacked.max(0));
    case ReduceOp::kMin: return std::get<0>(stacked.min(0));
  }
  return {};
}

// Units of rounding of a reduction over <= 8 ranks in `dtype`, relative to sum |inputs|.
double tolerance(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return 8 * 0x1p-8;
    case at::kHalf: return 8 * 0x1p-11;
    case at::kFloat: return 8 * 0x1p-24;
    default: return 8 * 0x1p-53;
  }
}

// One rank's checks; failures are collected as lines.
class Rank {
 public:
  Rank(Comm& comm, Lines& out, int expect_rank, int expect_world, c10::Device device)
      : comm_(comm), out_(out), R_(expect_rank), W_(expect_world), dev_(device) {}

  void run(const std::shared_ptr<Store>& store) {
    expect(comm_.rank() == R_ && comm_.size() == W_,
           "rank()/size() = " + std::to_string(comm_.rank()) + "/" + std::to_string(comm_.size()) +
               ", expected the context's " + std::to_string(R_) + "/" + std::to_string(W_));
    expect(comm_.device() == dev_, "device() = " + comm_.device().str() + ", expected " + dev_.str());
    // What the core issues: sums of fp64 values (losses, token counts, the gradient norm's
    // squares), of gradient buckets in the reduce dtypes; reduce-scatter and all-gather of buckets
    // (zero2), broadcast of the flat parameters from rank 0 (the optim kit).
    for (at::ScalarType dt : {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf})
      for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{1001}, int64_t{1} << 16}) all_reduce(dt, n, ReduceOp::kSum, true);
    for (at::ScalarType dt : {at::kDouble, at::kFloat}) all_reduce(dt, 4099, ReduceOp::kSum, false);
    for (at::ScalarType dt : {at::kFloat, at::kBFloat16, at::kHalf}) {
      for (int64_t chunk : {int64_t{7}, int64_t{4099}}) {
        reduce_scatter(dt, chunk);
        all_gather(dt, chunk, false);
        all_gather(dt, chunk, true);
      }
      broadcast(dt, 0);
      broadcast(dt, W_ - 1);
    }
    in_flight();
    // The interface's other reduce ops: right, or refused with ciuic::Error naming the op.
    for (ReduceOp op : {ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
      try {
        all_reduce(at::kFloat, 1001, op, true);
      } catch (const Error& e) {
        expect(std::string(e.what()).find(op_name(op)) != std::string::npos,
               std::string("all_reduce ") + op_name(op) + " threw an error that does not name the op: " + e.what());
      }
    }
    // barrier: every rank sets a key, passes the barrier, then sees every rank's key.
    store->set("conformance/barrier/" + std::to_string(R_), "1");
    comm_.barrier();
    for (int r = 0; r < W_; ++r)
      expect(store->check("conformance/barrier/" + std::to_string(r)),
             "barrier() returned before rank " + std::to_string(r) + " had called it");
    comm_.barrier();  // nobody leaves while others still check
  }

 private:
  void expect(bool ok, const std::string& what) {
    if (!ok) out_.add("rank " + std::to_string(R_) + " of " + std::to_string(W_) + ": " + what);
  }
  // |got - want| <= rtol * (|want| + scale), element-wise.
  void close(const at::Tensor& got, const at::Tensor& want, double rtol, const std::string& what,
             const at::Tensor& scale = {}) {
    const at::Tensor g = got.cpu().to(at::kDouble).flatten(), w = want.to(at::kDouble).flatten();
    if (g.numel() != w.numel()) {
      expect(false, what + ": " + std::to_string(g.numel()) + " elements, expected " + std::to_string(w.numel()));
      return;
    }
    const at::Tensor err = (g - w).abs();
    const at::Tensor bound = (w.abs() + (scale.defined() ? scale.flatten() : at::zeros_like(w))) * rtol;
    const at::Tensor bad = err.gt(bound) | g.isnan();
    if (bad.any().item<bool>()) {
      const int64_t i = bad.to(at::kInt).argmax().item<int64_t>();
      expect(false, what + ": element " + std::to_string(i) + " is " + std::to_string(g[i].item<double>()) +
                        ", expected " + std::to_string(w[i].item<double>()) +
                        (rtol > 0 ? " (relative tolerance " + std::to_string(rtol) + ")" : " (exactly)"));
    }
  }
  std::string dtype_name(at::ScalarType dt) const { return c10::toString(dt); }

  void all_reduce(at::ScalarType dt, int64_t n, ReduceOp op, bool exact) {
    const uint64_t seed = ++seed_;
    at::Tensor t = rank_input(R_, n, dt, exact, seed).to(dev_);
    comm_.all_reduce(t, op)->wait();
    const at::Tensor all = all_inputs(W_, n, dt, exact, seed);
    const bool exact_result = exact && op != ReduceOp::kAvg;
    close(t, reduce_ref(all, op), exact_result ? 0.0 : tolerance(dt),
          std::string("all_reduce ") + op_name(op) + " " + dtype_name(dt) + " of " + std::to_string(n) +
              (exact ? " exact" : " random") + " values",
          op == ReduceOp::kSum || op == ReduceOp::kAvg ? all.abs().sum(0) : at::Tensor());
  }

  void reduce_scatter(at::ScalarType dt, int64_t chunk) {
    const uint64_t seed = ++seed_;
    const at::Tensor in = rank_input(R_, chunk * W_, dt, true, seed).to(dev_);
    at::Tensor out = at::full({chunk}, 99, in.options());
    comm_.reduce_scatter(out, in, ReduceOp::kSum)->wait();
    close(out, all_inputs(W_, chunk * W_, dt, true, seed).sum(0).narrow(0, R_ * chunk, chunk), 0.0,
          "reduce_scatter sum " + dtype_name(dt) + ", chunk of " + std::to_string(chunk));
  }

  void all_gather(at::ScalarType dt, int64_t chunk, bool in_place) {
    const uint64_t seed = ++seed_;
    const at::Tensor mine = rank_input(R_, chunk, dt, true, seed).to(dev_);
    at::Tensor out = at::full({chunk * W_}, 99, mine.options());
    if (in_place) {
      at::Tensor slot = out.narrow(0, R_ * chunk, chunk);
      slot.copy_(mine);
      comm_.all_gather(out, slot)->wait();
    } else {
      comm_.all_gather(out, mine)->wait();
    }
    close(out, all_inputs(W_, chunk, dt, true, seed).flatten(), 0.0,
          std::string(in_place ? "in-place " : "") + "all_gather " + dtype_name(dt) + ", chunk of " +
              std::to_string(chunk));
  }

  void broadcast(at::ScalarType dt, int root) {
    const uint64_t seed = ++seed_;
    at::Tensor t = rank_input(R_, 1001, dt, true, seed).to(dev_);
    comm_.broadcast(t, root)->wait();
    close(t, rank_input(root, 1001, dt, true, seed), 0.0,
          "broadcast " + dtype_name(dt) + " from rank " + std::to_string(root));
  }

  // Several all_reduces in flight at once (the kit keeps up to 4 buckets), waited in reverse.
  void in_flight() {
    std::vector<at::Tensor> ts;
    std::vector<std::unique_ptr<Work>> works;
    const uint64_t seed = (seed_ += 10);
    for (int k = 0; k < 6; ++k) {
      ts.push_back(rank_input(R_, 4096 + k, at::kFloat, true, seed + k).to(dev_));
      works.push_back(comm_.all_reduce(ts.back(), ReduceOp::kSum));
    }
    for (int k = 5; k >= 0; --k) {
      works[k]->wait();
      expect(works[k]->is_completed(), "is_completed() is false after wait() returned");
      close(ts[k], all_inputs(W_, 4096 + k, at::kFloat, true, seed + k).sum(0), 0.0,
            "all_reduce " + std::to_string(k) + " of 6 in flight at once");
    }
  }

  Comm& comm_;
  Lines& out_;
  const int R_, W_;
  const c10::Device dev_;
  uint64_t seed_ = 0;
};

// The child: rank `rank` of `world` against the store at 127.0.0.1:`port`. Writes its failures,
// one per line, to `fd`; returns the exit code.
int child(const PluginUnderTest& plugin, const Config& cfg, const CheckOptions& o, const std::string& dir,
          int rank, int world, int port, int fd) {
  Lines lines;
  try {
    at::set_num_threads(1);
    launch::WorkerEnv env;
    env.rank = env.local_rank = rank;
    env.world_size = env.local_world_size = world;
    env.master_addr = "127.0.0.1";
    env.master_port = port;
    env.store_hosted_by_launcher = true;
    std::shared_ptr<Store> store = launch::connect_store(env, 60s);
    RunContext ctx = make_context(rank, world, store, o.device, dir, o.seed);
    ctx.master_port = port;
    std::shared_ptr<PluginObject> obj = plugin.create(cfg, ctx);
    auto* comm = dynamic_cast<Comm*>(obj.get());
    if (!comm) throw Error("the plugin's factory made no ciuic::Comm");
    Rank(*comm, lines, rank, world, o.device).run(store);
  } catch (const std::exception& e) {
    lines.add("rank " + std::to_string(rank) + " of " + std::to_string(world) + ": " + e.what());
  }
  const std::string text = lines.text();
  for (size_t at = 0; at < text.size();) {
    const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    if (n <= 0) break;
    at += static_cast<size_t>(n);
  }
  return lines.empty() ? 0 : 1;
}

}  // namespace

void check_comm(const PluginUnderTest& plugin, const CheckOptions& o) {
  ASSERT_EQ(plugin.slot(), Slot::kComm) << plugin.path();
  const Config cfg = plugin.config(o.options_toml);
  const std::string dir = work_dir(o, "comm");
  for (int world : o.world_sizes) {
    SCOPED_TRACE("world size " + std::to_string(world));
    // The ranks are forked first, while this process runs no thread of its own (a child of a
    // multi-threaded process may only call async-signal-safe functions; ThreadSanitizer refuses
    // it outright); then this process hosts the store — one server per world size, so that no key
    // of another remains — and hands each rank its port through a pipe.
    std::fflush(nullptr);
    std::vector<pid_t> pids;
    std::vector<int> fds, port_fds;
    for (int r = 0; r < world; ++r) {
      int p[2], q[2];
      ASSERT_EQ(::pipe(p), 0);
      ASSERT_EQ(::pipe(q), 0);
      const pid_t pid = ::fork();
      ASSERT_GE(pid, 0) << "fork failed";
      if (pid == 0) {
        ::close(p[0]);
        ::close(q[1]);
        int port = 0;
        const bool got = ::read(q[0], &port, sizeof port) == static_cast<ssize_t>(sizeof port);
        const int code = got ? child(plugin, cfg, o, dir + "/w" + std::to_string(world) + "-r" + std::to_string(r),
                                     r, world, port, p[1])
                             : 1;
        std::fflush(nullptr);
        ::_exit(code);
      }
      ::close(p[1]);
      ::close(q[0]);
      pids.push_back(pid);
      fds.push_back(p[0]);
      port_fds.push_back(q[1]);
    }
    c10d::TCPStoreOptions so;
    so.port = 0;
    so.isServer = true;
    so.waitWorkers = false;
    so.timeout = 60s;
    auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
    const int port = server->getPort();
    for (int fd : port_fds) {
      if (::write(fd, &port, sizeof port) != static_cast<ssize_t>(sizeof port)) ADD_FAILURE() << "cannot reach a rank";
      ::close(fd);
    }
    // Collect each rank's lines and exit status; 180 s for the whole world, then kill.
    const auto deadline = std::chrono::steady_clock::now() + 180s;
    std::vector<std::string> text(world);
    std::vector<bool> open(world, true);
    for (int left = world; left > 0;) {
      std::vector<pollfd> pfd;
      for (int r = 0; r < world; ++r)
        if (open[r]) pfd.push_back({fds[r], POLLIN, 0});
      const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (ms.count() <= 0 || ::poll(pfd.data(), pfd.size(), static_cast<int>(ms.count())) <= 0) break;
      for (const auto& p : pfd) {
        if (!(p.revents & (POLLIN | POLLHUP))) continue;
        const int r = static_cast<int>(std::find(fds.begin(), fds.end(), p.fd) - fds.begin());
        char buf[4096];
        const ssize_t n = ::read(p.fd, buf, sizeof buf);
        if (n > 0) {
          text[r].append(buf, static_cast<size_t>(n));
        } else {
          open[r] = false;
          --left;
        }
      }
    }
    for (int r = 0; r < world; ++r) {
      int status = 0;
      if (open[r]) {
        ADD_FAILURE() << "rank " << r << " of " << world << " did not finish within 180 s (killed)";
        ::kill(pids[r], SIGKILL);
      }
      ::waitpid(pids[r], &status, 0);
      ::close(fds[r]);
      if (!text[r].empty()) {
        ADD_FAILURE() << text[r];
      } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        ADD_FAILURE() << "rank " << r << " of " << world << " ended with "
                      << (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                              : "exit code " + std::to_string(WEXITSTATUS(status)));
      }
    }
  }
}

}  // namespace ciuic::conformance
