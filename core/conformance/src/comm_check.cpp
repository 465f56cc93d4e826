// check_comm (ciuic/testing/conformance.h): each rank a forked process (ranks.h), the run's store a
// c10d TCPStore this process hosts, the references rebuilt by every rank from all ranks' inputs.

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

#include <ciuic/comm.h>
#include <ciuic/error.h>
#include <ciuic/testing/conformance.h>

#include "ranks.h"
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
    auto gen =
        at::make_generator<at::CPUGeneratorImpl>(seed * 1000003ULL + static_cast<uint64_t>(rank));
    t = at::randn({numel}, gen, at::TensorOptions().dtype(at::kDouble));
  }
  return t.to(dtype);
}

// Every rank's input, [world, numel], in fp64.
at::Tensor all_inputs(int world, int64_t numel, at::ScalarType dtype, bool exact, uint64_t seed) {
  std::vector<at::Tensor> v;
  for (int r = 0; r < world; ++r)
    v.push_back(rank_input(r, numel, dtype, exact, seed).to(at::kDouble));
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
    expect(comm_.device() == dev_,
           "device() = " + comm_.device().str() + ", expected " + dev_.str());
    // What the core issues: sums of fp64 values (losses, token counts, the gradient norm's
    // squares), of gradient buckets in the reduce dtypes; reduce-scatter and all-gather of buckets
    // (zero2), broadcast of the flat parameters from rank 0 (the optim kit).
    for (at::ScalarType dt : {at::kDouble, at::kFloat, at::kBFloat16, at::kHalf})
      for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{1001}, int64_t{1} << 16})
        all_reduce(dt, n, ReduceOp::kSum, true);
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
               std::string("all_reduce ") + op_name(op) +
                   " threw an error that does not name the op: " + e.what());
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
      expect(false, what + ": " + std::to_string(g.numel()) + " elements, expected " +
                        std::to_string(w.numel()));
      return;
    }
    const at::Tensor err = (g - w).abs();
    const at::Tensor bound =
        (w.abs() + (scale.defined() ? scale.flatten() : at::zeros_like(w))) * rtol;
    const at::Tensor bad = err.gt(bound) | g.isnan();
    if (bad.any().item<bool>()) {
      const int64_t i = bad.to(at::kInt).argmax().item<int64_t>();
      expect(false,
             what + ": element " + std::to_string(i) + " is " +
                 std::to_string(g[i].item<double>()) + ", expected " +
                 std::to_string(w[i].item<double>()) +
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
          std::string("all_reduce ") + op_name(op) + " " + dtype_name(dt) + " of " +
              std::to_string(n) + (exact ? " exact" : " random") + " values",
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
          std::string(in_place ? "in-place " : "") + "all_gather " + dtype_name(dt) +
              ", chunk of " + std::to_string(chunk));
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

}  // namespace

void check_comm(const PluginUnderTest& plugin, const CheckOptions& o) {
  ASSERT_EQ(plugin.slot(), Slot::kComm) << plugin.path();
  const Config cfg = plugin.config(o.options_toml);
  const std::string dir = work_dir(o, "comm");
  for (int world : o.world_sizes) {
    SCOPED_TRACE("world size " + std::to_string(world));
    run_ranks(world, 180s,
              [&](int rank, int W, int port, const std::shared_ptr<Store>& store, Lines& lines) {
                RunContext ctx = make_context(
                    rank, W, store, o.device,
                    dir + "/w" + std::to_string(W) + "-r" + std::to_string(rank), o.seed);
                ctx.master_port = port;
                std::shared_ptr<PluginObject> obj = plugin.create(cfg, ctx);
                auto* comm = dynamic_cast<Comm*>(obj.get());
                if (!comm) throw Error("the plugin's factory made no ciuic::Comm");
                Rank(*comm, lines, rank, W, o.device).run(store);
              });
  }
}

}  // namespace ciuic::conformance
