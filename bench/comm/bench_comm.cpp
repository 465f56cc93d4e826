// bench_comm: collective bandwidth of a comm plugin, next to the same collective issued on the raw
// backend (c10d ProcessGroupGloo, or NCCL's C API on its own communicator) in the same run.
//
//   bench_comm [--backend gloo|nccl] [--nproc N] [--transport auto|nvlink|pcie|shm]
//              [--min-bytes B] [--max-bytes B] [--iters N] [--warmup N] [benchmark flags...]
//
// Started without a launcher, it launches itself on N local ranks (default 2; one GPU each for
// nccl) through ciuic's launcher and prints rank 0's results. Bandwidth as nccl-tests defines it
// (https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md): size is the larger
// buffer (all_reduce: the tensor; reduce_scatter: the input; all_gather: the output),
// algbw = size / time, busbw = algbw * 2(n-1)/n for all_reduce and * (n-1)/n for reduce_scatter
// and all_gather. Every benchmark runs a fixed number of iterations (the same on every rank, as
// collectives require) with `warmup` untimed ones before; the time of one iteration is measured
// on the host around issue + wait (gloo) or with CUDA events on the caller's stream (nccl).
#include <ATen/ATen.h>
#include <benchmark/benchmark.h>
#include <ciuic/c10d.h>
#include <ciuic/comm.h>
#include <ciuic/config.h>
#include <ciuic/context.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <vector>

#include "launch/launch.h"
#include "registry/registry.h"

#ifdef CIUIC_BENCH_RAW_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#endif
#ifdef CIUIC_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

namespace ciuic {
namespace {

struct Args {
  std::string backend = "gloo";
  int nproc = 2;
  std::string transport = "auto";
  int64_t min_bytes = 1 << 10;
  int64_t max_bytes = int64_t{1} << 26;
  int iters = 20;
  int warmup = 3;
  std::vector<std::string> rest;  // Google Benchmark's flags
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw UsageError(s + " needs a value");
      return argv[++i];
    };
    if (s == "--backend")
      a.backend = value();
    else if (s == "--nproc")
      a.nproc = std::stoi(value());
    else if (s == "--transport")
      a.transport = value();
    else if (s == "--min-bytes")
      a.min_bytes = std::stoll(value());
    else if (s == "--max-bytes")
      a.max_bytes = std::stoll(value());
    else if (s == "--iters")
      a.iters = std::stoi(value());
    else if (s == "--warmup")
      a.warmup = std::stoi(value());
    else
      a.rest.push_back(s);
  }
  if (a.backend != "gloo" && a.backend != "nccl")
    throw UsageError("--backend must be gloo or nccl");
  return a;
}

enum class Op { kAllReduce, kReduceScatter, kAllGather };
const char* op_str(Op op) {
  switch (op) {
    case Op::kAllReduce: return "all_reduce";
    case Op::kReduceScatter: return "reduce_scatter";
    case Op::kAllGather: return "all_gather";
  }
  return "?";
}
double bus_factor(Op op, int n) {
  return op == Op::kAllReduce ? 2.0 * (n - 1) / n : static_cast<double>(n - 1) / n;
}

// One way of running a collective: the plugin, or the raw backend underneath.
class Runner {
 public:
  virtual ~Runner() = default;
  // Runs `op` once on (big, small) buffers and waits; returns seconds (host or device time).
  virtual double run(Op op, at::Tensor& big, at::Tensor& small) = 0;
};

class PluginRunner final : public Runner {
 public:
  explicit PluginRunner(std::shared_ptr<Comm> comm) : comm_(std::move(comm)) {}
  double run(Op op, at::Tensor& big, at::Tensor& small) override {
#ifdef CIUIC_WITH_CUDA
    if (big.is_cuda()) {
      auto s = c10::cuda::getCurrentCUDAStream();
      cudaEventRecord(start_.get(), s.stream());
      issue(op, big, small)->wait();
      cudaEventRecord(end_.get(), s.stream());
      cudaEventSynchronize(end_.get());
      float ms = 0;
      cudaEventElapsedTime(&ms, start_.get(), end_.get());
      return ms / 1e3;
    }
#endif
    auto t0 = std::chrono::steady_clock::now();
    issue(op, big, small)->wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  std::unique_ptr<Work> issue(Op op, at::Tensor& big, at::Tensor& small) {
    switch (op) {
      case Op::kAllReduce: return comm_->all_reduce(big, ReduceOp::kSum);
      case Op::kReduceScatter: return comm_->reduce_scatter(small, big, ReduceOp::kSum);
      case Op::kAllGather: return comm_->all_gather(big, small);
    }
    return nullptr;
  }
  std::shared_ptr<Comm> comm_;
#ifdef CIUIC_WITH_CUDA
  struct Event {
    cudaEvent_t e = nullptr;
    Event() { cudaEventCreate(&e); }
    ~Event() { cudaEventDestroy(e); }
    cudaEvent_t get() const { return e; }
  };
  Event start_, end_;
#endif
};

#ifdef CIUIC_BENCH_RAW_GLOO
class RawGlooRunner final : public Runner {
 public:
  RawGlooRunner(const RunContext& ctx) {
    auto opts = c10d::ProcessGroupGloo::Options::create(ctx.timeout);
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    auto store = c10::make_intrusive<c10d::PrefixStore>("bench/raw-gloo", c10d_store(ctx.store));
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store, ctx.rank, ctx.world_size, opts);
  }
  double run(Op op, at::Tensor& big, at::Tensor& small) override {
    auto t0 = std::chrono::steady_clock::now();
    c10::intrusive_ptr<c10d::Work> w;
    switch (op) {
      case Op::kAllReduce: {
        std::vector<at::Tensor> v{big};
        w = pg_->allreduce(v);
        break;
      }
      case Op::kReduceScatter: w = pg_->_reduce_scatter_base(small, big); break;
      case Op::kAllGather: w = pg_->_allgather_base(big, small); break;
    }
    w->wait();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

 private:
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};
#endif

#ifdef CIUIC_WITH_CUDA
void nccl_ok(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) throw Error(std::string(what) + ": " + ncclGetErrorString(rc));
}

// NCCL alone: its own blocking communicator and stream, no ordering events, no watchdog.
class RawNcclRunner final : public Runner {
 public:
  explicit RawNcclRunner(const RunContext& ctx) {
    ncclUniqueId id;
    if (ctx.rank == 0) {
      nccl_ok(ncclGetUniqueId(&id), "ncclGetUniqueId");
      ctx.store->set("bench/raw-nccl/uid", std::string(id.internal, sizeof id.internal));
    } else {
      std::string v = ctx.store->get("bench/raw-nccl/uid");
      std::memcpy(id.internal, v.data(), sizeof id.internal);
    }
    nccl_ok(ncclCommInitRank(&comm_, ctx.world_size, id, ctx.rank), "ncclCommInitRank");
    cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    cudaEventCreate(&start_);
    cudaEventCreate(&end_);
  }
  ~RawNcclRunner() override {
    ncclCommDestroy(comm_);
    cudaEventDestroy(start_);
    cudaEventDestroy(end_);
    cudaStreamDestroy(stream_);
  }
  double run(Op op, at::Tensor& big, at::Tensor& small) override {
    const auto type = big.scalar_type() == at::kBFloat16 ? ncclBfloat16 : ncclFloat32;
    cudaEventRecord(start_, stream_);
    switch (op) {
      case Op::kAllReduce:
        nccl_ok(ncclAllReduce(big.data_ptr(), big.data_ptr(), big.numel(), type, ncclSum, comm_,
                              stream_),
                "ncclAllReduce");
        break;
      case Op::kReduceScatter:
        nccl_ok(ncclReduceScatter(big.data_ptr(), small.data_ptr(), small.numel(), type, ncclSum,
                                  comm_, stream_),
                "ncclReduceScatter");
        break;
      case Op::kAllGather:
        nccl_ok(
            ncclAllGather(small.data_ptr(), big.data_ptr(), small.numel(), type, comm_, stream_),
            "ncclAllGather");
        break;
    }
    cudaEventRecord(end_, stream_);
    cudaEventSynchronize(end_);
    float ms = 0;
    cudaEventElapsedTime(&ms, start_, end_);
    return ms / 1e3;
  }

 private:
  ncclComm_t comm_ = nullptr;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t start_ = nullptr, end_ = nullptr;
};
#endif

void run_benchmark(benchmark::State& state, Runner* runner, Op op, int64_t bytes, int world,
                   c10::Device device, int warmup) {
  const int64_t elems = bytes / 4 / world * world;  // fp32, divisible by the world size
  at::Tensor big = at::ones({elems}, at::TensorOptions(device).dtype(at::kFloat));
  at::Tensor small = at::ones({elems / world}, big.options());
  for (int i = 0; i < warmup; ++i) runner->run(op, big, small);
  for (auto _ : state) state.SetIterationTime(runner->run(op, big, small));
  const double size = static_cast<double>(elems) * 4;
  using benchmark::Counter;
  state.counters["bytes"] = size;
  state.counters["algbw"] = Counter(size, Counter::kIsIterationInvariantRate, Counter::kIs1000);
  state.counters["busbw"] =
      Counter(size * bus_factor(op, world), Counter::kIsIterationInvariantRate, Counter::kIs1000);
}

// Prints nothing: for ranks other than 0.
class SilentReporter final : public benchmark::BenchmarkReporter {
 public:
  bool ReportContext(const Context&) override { return true; }
  void ReportRuns(const std::vector<Run>&) override {}
};

int worker(const Args& a, const launch::WorkerEnv& env, int argc, char** argv) {
  set_log_rank(env.rank);
  RunContext ctx;
  launch::apply_worker_env(env, ctx);
  ctx.timeout = std::chrono::minutes(5);
  if (a.backend == "nccl") {
#ifdef CIUIC_WITH_CUDA
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));
    ctx.device = c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
#else
    throw UsageError("this build has no CUDA: --backend nccl is not available");
#endif
  }
  ctx.store = launch::connect_store(env, ctx.timeout);
  auto registry = Registry::discover({});
  std::string options = a.backend == "nccl" ? "transport = \"" + a.transport + "\"\n" : "";
  auto cfg = Config::from_toml("comm", "plugin = \"" + a.backend + "\"\n" + options, "<bench>");
  auto comm = registry.create<Comm>(Slot::kComm, a.backend, cfg, ctx);

  std::vector<std::pair<std::string, std::unique_ptr<Runner>>> runners;
  runners.emplace_back("ciuic", std::make_unique<PluginRunner>(comm));
#ifdef CIUIC_BENCH_RAW_GLOO
  if (a.backend == "gloo") runners.emplace_back("c10d", std::make_unique<RawGlooRunner>(ctx));
#endif
#ifdef CIUIC_WITH_CUDA
  if (a.backend == "nccl") runners.emplace_back("nccl", std::make_unique<RawNcclRunner>(ctx));
#endif
  const std::string tag = a.backend + (a.backend == "nccl" ? "-" + a.transport : "");
  for (Op op : {Op::kAllReduce, Op::kReduceScatter, Op::kAllGather})
    for (int64_t bytes = a.min_bytes; bytes <= a.max_bytes; bytes *= 4)
      for (auto& [name, runner] : runners) {
        Runner* r = runner.get();
        const int world = env.world_size, warmup = a.warmup;
        const c10::Device dev = ctx.device;
        benchmark::RegisterBenchmark(
            (tag + "/" + op_str(op) + "/" + name + "/" + std::to_string(bytes)).c_str(),
            [=](benchmark::State& s) { run_benchmark(s, r, op, bytes, world, dev, warmup); })
            ->Iterations(a.iters)
            ->UseManualTime()
            ->Unit(benchmark::kMicrosecond);
      }

  // Google Benchmark's own flags; only rank 0 writes --benchmark_out.
  std::vector<char*> bargv{argv[0]};
  for (const auto& s : a.rest)
    if (env.rank == 0 || s.rfind("--benchmark_out", 0) != 0)
      bargv.push_back(const_cast<char*>(s.c_str()));
  int bargc = static_cast<int>(bargv.size());
  benchmark::Initialize(&bargc, bargv.data());
  if (env.rank == 0) {
    benchmark::AddCustomContext("world_size", std::to_string(env.world_size));
    benchmark::AddCustomContext("backend", tag);
    benchmark::RunSpecifiedBenchmarks();
  } else {
    SilentReporter silent;
    benchmark::RunSpecifiedBenchmarks(&silent);
  }
  comm->barrier();
  benchmark::Shutdown();
  return 0;
}

int main_impl(int argc, char** argv) {
  Args a = parse(argc, argv);
  if (auto env = launch::detect_worker_env()) return worker(a, *env, argc, argv);
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n <= 0) throw Error("cannot read /proc/self/exe");
  launch::LaunchOptions o;
  o.argv.assign(argv, argv + argc);
  o.argv[0] = std::string(self, static_cast<size_t>(n));
  o.nproc_per_node = a.nproc;
  return launch::launch_and_supervise(o);
}

}  // namespace
}  // namespace ciuic

int main(int argc, char** argv) {
  try {
    return ciuic::main_impl(argc, argv);
  } catch (const ciuic::Error& e) {
    ciuic::log_error(e.what());
    return e.exit_code();
  }
}
