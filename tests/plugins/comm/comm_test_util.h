// Shared by the comm plugin tests (gloo on CPU, nccl on GPUs): the deterministic per-rank inputs,
// references computed independently with ATen (stack + reduce over the rank dimension in fp64),
// creation of a comm plugin through the Registry, and a failure counter for worker processes.
#pragma once

#include <ATen/ATen.h>
#include <ciuic/comm.h>
#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/comm_checks.h"  // plugins/comm/common
#include "launch/launch.h"
#include "registry/registry.h"

namespace ciuic::testing {

// The input of `rank` for a test tensor of `numel` elements: uneven across ranks and elements,
// mixed signs. `exact` values are multiples of 0.5 in [-4, 4] (exact in every float dtype, and so
// are their sums over <= 8 ranks); otherwise N(0,1) from a generator seeded by (seed, rank).
inline at::Tensor rank_input(int rank, int64_t numel, at::ScalarType dtype, bool exact,
                             uint64_t seed = 1) {
  at::Tensor t;
  if (exact) {
    auto i = at::arange(numel, at::kLong);
    t = ((i * 7 + rank * 13 + static_cast<int64_t>(seed)).remainder(17) - 8).to(at::kDouble) * 0.5;
  } else {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + rank);
    t = at::randn({numel}, gen, at::kDouble);
  }
  return t.to(dtype);
}

// All ranks' inputs, [world, numel], in fp64 (what each rank "sent", rebuilt locally).
inline at::Tensor all_inputs(int world, int64_t numel, at::ScalarType dtype, bool exact,
                             uint64_t seed = 1) {
  std::vector<at::Tensor> v;
  for (int r = 0; r < world; ++r)
    v.push_back(rank_input(r, numel, dtype, exact, seed).to(at::kDouble));
  return at::stack(v);
}

// The reference reduction over ranks, in fp64.
inline at::Tensor reference(const at::Tensor& stacked, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return stacked.sum(0);
    case ReduceOp::kAvg: return stacked.mean(0);
    case ReduceOp::kMax: return std::get<0>(stacked.max(0));
    case ReduceOp::kMin: return std::get<0>(stacked.min(0));
  }
  return {};
}

// Relative tolerance, with respect to the magnitude of the summed inputs (see scale()), for a
// reduction over <= 8 ranks computed in `dtype` (each partial sum rounded once: <= 8 unit
// roundoffs) and compared with an fp64 reference.
inline double tolerance(at::ScalarType dtype) {
  switch (dtype) {
    case at::kBFloat16: return 8 * 0x1p-9;
    case at::kHalf: return 8 * 0x1p-12;
    case at::kFloat: return 8 * 0x1p-24;
    default: return 1e-12;
  }
}

// The magnitude the rounding error of a reduction scales with: sum over ranks of |input| (mean for
// avg; 0 for max/min, which are exact).
inline at::Tensor scale(const at::Tensor& stacked, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return stacked.abs().sum(0);
    case ReduceOp::kAvg: return stacked.abs().mean(0);
    default: return at::zeros_like(stacked[0]);
  }
}

// Counts failed checks of a worker process and logs each one at error level (so that the
// launcher shows it whatever the rank).
class Checker {
 public:
  explicit Checker(int rank) : rank_(rank) {}
  // |got - want| <= rtol * (|want| + scale) element-wise (scale: see testing::scale()).
  void close(const at::Tensor& got, const at::Tensor& want, double rtol, const std::string& what,
             const at::Tensor& scale = {}) {
    ++checks_;
    at::Tensor g = got.to(at::kDouble).cpu().flatten(), w = want.to(at::kDouble).cpu().flatten();
    if (g.sizes() != w.sizes()) {
      fail(what + ": " + std::to_string(g.numel()) + " elements, expected " +
           std::to_string(w.numel()));
      return;
    }
    at::Tensor err = (g - w).abs();
    at::Tensor bound = (w.abs() + (scale.defined() ? scale.flatten() : at::zeros_like(w))) * rtol;
    if (!err.le(bound).all().item<bool>()) {
      int64_t i = (err - bound).argmax().item<int64_t>();
      fail(what + ": element " + std::to_string(i) + " is " + std::to_string(g[i].item<double>()) +
           ", expected " + std::to_string(w[i].item<double>()) + " (rtol " + std::to_string(rtol) +
           ")");
    }
  }
  void expect(bool ok, const std::string& what) {
    ++checks_;
    if (!ok) fail(what);
  }
  void fail(const std::string& what) {
    ++failures_;
    log_error("check failed on rank " + std::to_string(rank_) + ": " + what);
  }
  int failures() const { return failures_; }
  int checks() const { return checks_; }

 private:
  int rank_;
  int checks_ = 0, failures_ = 0;
};

// Expected counters of a communicator: every collective issued through count().
struct Tally {
  uint64_t calls = 0, bytes = 0;
  void count(const at::Tensor& input) {
    ++calls;
    bytes += static_cast<uint64_t>(input.numel() * input.element_size());
  }
  // Compares comm.counters() (after the last collective completed).
  void check(const Comm& comm, Checker& c) const {
    auto cnt = comm.counters();
    c.expect(cnt.calls == calls, "counters().calls = " + std::to_string(cnt.calls) + ", expected " +
                                     std::to_string(calls));
    c.expect(cnt.bytes == bytes, "counters().bytes = " + std::to_string(cnt.bytes) + ", expected " +
                                     std::to_string(bytes));
    c.expect(cnt.busy_seconds > 0.0, "counters().busy_seconds is 0");
  }
};

// What check_sweep() covers: all_reduce (sizes 1, 1001, plus big_numel for big_dtypes; exact and
// random values; every op), reduce_scatter (every op) and all_gather (out of place and in place)
// with the given per-rank chunk lengths, broadcast from the last rank — for every dtype.
struct Sweep {
  std::vector<at::ScalarType> dtypes;
  std::vector<at::ScalarType> big_dtypes;
  int64_t big_numel = 0;
  std::vector<int64_t> reduce_scatter_chunks, all_gather_chunks;
};

inline void check_sweep(Comm& comm, Checker& c, const Sweep& sweep, c10::Device dev, Tally& tally) {
  const int R = comm.rank(), W = comm.size();
  const std::vector<ReduceOp> ops{ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin};
  uint64_t seed = 1;
  for (auto dt : sweep.dtypes) {
    const bool is_float = at::isFloatingType(dt);
    const std::string ds = c10::toString(dt);
    std::vector<int64_t> sizes{1, 1001};
    for (auto b : sweep.big_dtypes)
      if (b == dt) sizes.push_back(sweep.big_numel);
    for (int64_t numel : sizes) {
      for (bool exact : {true, false}) {
        if (!exact && !is_float) continue;
        ++seed;
        for (auto op : ops) {
          if (op == ReduceOp::kAvg && !is_float) continue;
          const std::string what = "all_reduce " + std::string(comm_common::op_name(op)) + " " +
                                   ds + " numel " + std::to_string(numel) +
                                   (exact ? " exact" : " random");
          at::Tensor t = rank_input(R, numel, dt, exact, seed).to(dev);
          tally.count(t);
          comm.all_reduce(t, op)->wait();
          at::Tensor all = all_inputs(W, numel, dt, exact, seed);
          c.close(t, reference(all, op), exact && op != ReduceOp::kAvg ? 0.0 : tolerance(dt), what,
                  scale(all, op));
        }
      }
    }
    // reduce_scatter: rank r gets the reduction of chunk r; uneven chunk length 7 and a big one.
    for (int64_t chunk : sweep.reduce_scatter_chunks) {
      ++seed;
      for (auto op : ops) {
        if (op == ReduceOp::kAvg && !is_float) continue;
        at::Tensor in = rank_input(R, chunk * W, dt, true, seed).to(dev);
        at::Tensor out = at::full({chunk}, 99, in.options());
        tally.count(in);
        comm.reduce_scatter(out, in, op)->wait();
        at::Tensor all = all_inputs(W, chunk * W, dt, true, seed);
        c.close(out, reference(all, op).narrow(0, R * chunk, chunk),
                op == ReduceOp::kAvg ? tolerance(dt) : 0.0,
                "reduce_scatter " + std::string(comm_common::op_name(op)) + " " + ds + " chunk " +
                    std::to_string(chunk),
                scale(all, op).narrow(0, R * chunk, chunk));
      }
    }
    // all_gather: out of place, then in place (input is chunk rank() of the output).
    for (int64_t chunk : sweep.all_gather_chunks) {
      ++seed;
      at::Tensor in = rank_input(R, chunk, dt, true, seed).to(dev);
      at::Tensor want = all_inputs(W, chunk, dt, true, seed).flatten();
      at::Tensor out = at::zeros({chunk * W}, in.options());
      tally.count(in);
      comm.all_gather(out, in)->wait();
      c.close(out, want, 0.0, "all_gather " + ds + " chunk " + std::to_string(chunk));
      at::Tensor buf = at::zeros({chunk * W}, in.options());
      at::Tensor mine = buf.narrow(0, R * chunk, chunk);
      mine.copy_(in);
      tally.count(mine);
      comm.all_gather(buf, mine)->wait();
      c.close(buf, want, 0.0, "in-place all_gather " + ds + " chunk " + std::to_string(chunk));
    }
    // broadcast from the last rank.
    {
      ++seed;
      const int root = W - 1;
      at::Tensor t = rank_input(R, 33, dt, true, seed).to(dev);
      tally.count(t);
      comm.broadcast(t, root)->wait();
      c.close(t, rank_input(root, 33, dt, true, seed), 0.0, "broadcast " + ds);
    }
  }
}

// Creates comm plugin `name` from the plugin folder through the Registry.
inline std::shared_ptr<Comm> make_comm(const std::string& name, const std::string& options_toml,
                                       const RunContext& ctx) {
  auto registry =
      Registry::from_paths({std::string(CIUIC_PLUGIN_DIR) + "/libciuic_comm_" + name + ".so"});
  auto cfg = Config::from_toml("comm", "plugin = \"" + name + "\"\n" + options_toml, "<test>");
  return registry.create<Comm>(Slot::kComm, name, cfg, ctx);
}

// The RunContext of a test worker: rank layout from the launcher's environment, the run's store
// (rendezvous included), `device`.
inline RunContext worker_context(const launch::WorkerEnv& env, std::chrono::milliseconds timeout,
                                 c10::Device device) {
  RunContext ctx;
  launch::apply_worker_env(env, ctx);
  ctx.timeout = timeout;
  ctx.device = device;
  ctx.store = launch::connect_store(env, timeout);
  return ctx;
}

inline std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return std::string(buf, n > 0 ? static_cast<size_t>(n) : 0);
}

// main() of a test binary that doubles as its own worker: "<exe> --comm-worker <args...>" runs
// `worker(args)` (exit code: its result, or the error's) instead of the tests.
inline int main_or_worker(int argc, char** argv,
                          const std::function<int(const std::vector<std::string>&)>& worker,
                          const std::function<int(int, char**)>& tests) {
  if (argc >= 2 && std::string(argv[1]) == "--comm-worker") {
    try {
      return worker(std::vector<std::string>(argv + 2, argv + argc));
    } catch (const Error& e) {
      log_error(e.what());
      return e.exit_code();
    } catch (const std::exception& e) {
      log_error(std::string("unexpected exception: ") + e.what());
      return kExitRuntime;
    }
  }
  return tests(argc, argv);
}

}  // namespace ciuic::testing
