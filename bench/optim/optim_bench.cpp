// CPU AdamW throughput, side by side in one run (docs/performance/optim.md):
//   cpu_adam plugin (each SIMD level this CPU has, 1 and 2 threads; fp32 gradients in, bf16
//   parameters out), torch::optim::AdamW, ATen's at::_fused_adamw_ on the CPU, and the core's
//   adamw optimizer plugin on a CPU run — against the machine's memory bandwidth measured by the
//   same binary (STREAM-style triad and memcpy over arrays far larger than the caches).
//
// Bytes per step and parameter, the minimum any AdamW moves: read p, g, m, v (16) + write p, m, v
// (12) = 28, + 2 for the bf16 parameter copy where it is made. GB/s = those bytes / time; the
// summary divides it by the triad bandwidth of the same thread count, and divides torch's time by
// each contender's time.
//
//   build-optim/bin/optim_bench                      100M parameters
//   CIUIC_OPTIM_BENCH_NUMEL=10000000 optim_bench      quicker
#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <ciuic/context.h>
#include <ciuic/optimizer.h>
#include <ciuic/precision.h>
#include <ciuic/store.h>

#include "recipe/recipe.h"
#include "registry/registry.h"

namespace {

int64_t numel() {
  static const int64_t n = [] {
    const char* e = std::getenv("CIUIC_OPTIM_BENCH_NUMEL");
    return e ? std::atoll(e) : int64_t{100'000'000};
  }();
  return n;
}

// ---- memory bandwidth -----------------------------------------------------------------------

// Runs fn(begin, end) over [0, n) split across `threads` std::threads.
template <class F>
void parallel(int threads, int64_t n, F fn) {
  std::vector<std::thread> team;
  const int64_t chunk = (n + threads - 1) / threads;
  for (int i = 1; i < threads; ++i)
    team.emplace_back([&, i] { fn(std::min(n, i * chunk), std::min(n, (i + 1) * chunk)); });
  fn(0, std::min(n, chunk));
  for (auto& t : team) t.join();
}

void BM_Triad(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t n = numel();
  std::vector<float> a(n), b(n), c(n);
  parallel(threads, n, [&](int64_t lo, int64_t hi) {
    for (int64_t i = lo; i < hi; ++i) a[i] = 0, b[i] = 1, c[i] = 2;
  });
  for (auto _ : state) {
    parallel(threads, n, [&](int64_t lo, int64_t hi) {
      for (int64_t i = lo; i < hi; ++i) a[i] = b[i] + 0.5f * c[i];
    });
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] =
      benchmark::Counter(12.0 * n * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

void BM_Memcpy(benchmark::State& state) {
  const int threads = static_cast<int>(state.range(0));
  const int64_t n = numel();
  std::vector<float> a(n, 0), b(n, 1);
  for (auto _ : state) {
    parallel(threads, n,
             [&](int64_t lo, int64_t hi) { std::memcpy(&a[lo], &b[lo], (hi - lo) * 4); });
    benchmark::DoNotOptimize(a.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] =
      benchmark::Counter(8.0 * n * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

// ---- AdamW contenders -----------------------------------------------------------------------

constexpr double kLr = 1e-4, kWd = 0.01;

void set_bytes(benchmark::State& state, double bytes_per_param) {
  state.counters["GB/s"] = benchmark::Counter(bytes_per_param * numel() * state.iterations() / 1e9,
                                              benchmark::Counter::kIsRate);
}

const ciuic::RunContext& context() {
  static const ciuic::RunContext ctx = [] {
    ciuic::RunContext c;
    c.store = ciuic::make_local_store(std::chrono::seconds(1));
    return c;
  }();
  return ctx;
}

const ciuic::Registry& registry() {
  static const ciuic::Registry r =
      ciuic::Registry::from_paths({CIUIC_PLUGIN_DIR "/libciuic_optimizer_cpu_adam.so",
                                   CIUIC_PLUGIN_DIR "/libciuic_optimizer_adamw.so"});
  return r;
}

std::shared_ptr<ciuic::Optimizer> make_optimizer(const std::string& plugin,
                                                 const std::string& options) {
  const std::string text =
      "[train]\nmax_steps = 1\n[data]\nplugin = \"synthetic\"\n[optimizer]\n"
      "plugin = \"" +
      plugin + "\"\n" + options;
  const auto recipe = ciuic::Recipe::parse(text, "bench.toml");
  const auto& desc = registry().get(ciuic::Slot::kOptimizer, plugin);
  return registry().create<ciuic::Optimizer>(
      ciuic::Slot::kOptimizer, plugin, recipe.plugin_config(ciuic::Slot::kOptimizer, *desc.info),
      context());
}

// Rounds to nearest even (the base class's default).
class Bf16Policy final : public ciuic::Precision {
 public:
  at::ScalarType param_dtype() const override { return at::kBFloat16; }
};

// The shard: 99% with weight decay, a no-decay tail (norms), as a model's would be; one gradient
// region.
ciuic::OptimizerSetup shard(const at::Tensor& init, const ciuic::Precision& precision) {
  ciuic::OptimizerSetup s;
  s.numel = numel();
  const int64_t split = numel() - numel() / 100;
  s.segments = {{0, split, true}, {split, numel(), false}};
  s.grad_regions = {{0, numel()}};
  s.initial = {ciuic::ShardValues{0, init}};
  s.param_dtype = init.scalar_type();
  s.precision = &precision;
  return s;
}

// The update alone (step()): the gradient is handed over once and stays in the optimizer's shard.
void run_optimizer(benchmark::State& state, ciuic::Optimizer& o) {
  static const Bf16Policy policy;
  const at::Tensor init = (at::randn({numel()}) * 0.02).to(at::kBFloat16);
  o.setup(shard(init, policy));
  o.accumulate_grad(0, at::randn({numel()}) * 1e-3, /*first=*/true, /*last=*/true);
  o.finish_grads();
  at::Tensor params = at::empty({numel()}, at::kBFloat16);
  ciuic::OptimizerStep h;
  h.lr = kLr;
  h.weight_decay = kWd;
  h.t = 1;
  o.step(h, params);  // warm-up: page faults, thread start
  for (auto _ : state) {
    ++h.t;
    o.step(h, params);
  }
  set_bytes(state, 30);
}

void BM_CpuAdam(benchmark::State& state, const std::string& simd) {
  auto o = make_optimizer(
      "cpu_adam", "simd = \"" + simd + "\"\nthreads = " + std::to_string(state.range(0)) + "\n");
  run_optimizer(state, *o);
}

void BM_DeviceAdamW(benchmark::State& state) {
  at::set_num_threads(static_cast<int>(state.range(0)));
  auto o = make_optimizer("adamw", "");
  run_optimizer(state, *o);
}

void BM_TorchAdamW(benchmark::State& state) {
  at::set_num_threads(static_cast<int>(state.range(0)));
  at::Tensor p = (at::randn({numel()}) * 0.02).set_requires_grad(true);
  p.mutable_grad() = at::randn({numel()}) * 1e-3;
  torch::optim::AdamW opt({p}, torch::optim::AdamWOptions(kLr).weight_decay(kWd));
  opt.step();  // warm-up: creates the moments
  for (auto _ : state) opt.step();
  set_bytes(state, 28);
}

void BM_FusedAdamW(benchmark::State& state) {
  at::set_num_threads(static_cast<int>(state.range(0)));
  at::Tensor p = at::randn({numel()}) * 0.02, g = at::randn({numel()}) * 1e-3;
  at::Tensor m = at::zeros({numel()}), v = at::zeros({numel()}), step = at::zeros({});
  auto once = [&] {
    step.add_(1);
    at::_fused_adamw_({p}, {g}, {m}, {v}, {}, {step}, kLr, 0.9, 0.999, kWd, 1e-8, false, false);
  };
  once();
  for (auto _ : state) once();
  set_bytes(state, 28);
}

// ---- summary -------------------------------------------------------------------------------

struct Result {
  std::string name;
  double ms = 0, gbs = 0;
};

// Whether a run failed: `error_occurred` up to Google Benchmark 1.7 (Debian 12), `skipped`
// from 1.8.
template <class R>
auto failed(const R& r, int) -> decltype(bool(r.error_occurred)) {
  return r.error_occurred;
}
template <class R>
auto failed(const R& r, long) -> decltype(bool(r.skipped)) {
  return static_cast<int>(r.skipped) != 0;
}

class Collector : public benchmark::ConsoleReporter {
 public:
  void ReportRuns(const std::vector<Run>& runs) override {
    ConsoleReporter::ReportRuns(runs);
    for (const Run& r : runs) {
      if (failed(r, 0)) continue;
      Result res{r.benchmark_name(), r.GetAdjustedRealTime(), 0};
      auto it = r.counters.find("GB/s");
      if (it != r.counters.end()) res.gbs = it->second.value;
      results.push_back(res);
    }
  }
  std::vector<Result> results;
};

// "BM_CpuAdam/avx2/2/..." -> threads = 2 (the last numeric path element before options).
int threads_of(const std::string& name) {
  int t = 0;
  size_t pos = 0;
  while ((pos = name.find('/', pos)) != std::string::npos) {
    ++pos;
    if (pos < name.size() && std::isdigit(static_cast<unsigned char>(name[pos])))
      t = std::atoi(name.c_str() + pos);
  }
  return t;
}

std::string base_of(const std::string& name) {
  size_t p = name.find("/iterations");
  std::string s = name.substr(0, p);
  p = s.find("/real_time");
  return s.substr(0, p);
}

void print_summary(const std::vector<Result>& results) {
  std::map<int, double> triad, torch_ms;
  for (const Result& r : results) {
    if (r.name.rfind("BM_Triad", 0) == 0) triad[threads_of(r.name)] = r.gbs;
    if (r.name.rfind("BM_TorchAdamW", 0) == 0) torch_ms[threads_of(r.name)] = r.ms;
  }
  std::printf(
      "\nSummary: %lld parameters; bandwidth fraction = GB/s / triad GB/s (same threads); "
      "speed-up = torch::optim::AdamW time / time (same threads)\n",
      static_cast<long long>(numel()));
  std::printf("%-32s %8s %10s %8s %10s %9s\n", "benchmark", "threads", "ms/step", "GB/s",
              "of triad", "speed-up");
  for (const Result& r : results) {
    const int th = threads_of(r.name);
    const double bw = triad.count(th) ? triad[th] : 0;
    const bool adam = r.name.rfind("BM_Triad", 0) != 0 && r.name.rfind("BM_Memcpy", 0) != 0;
    std::printf("%-32s %8d %10.1f %8.2f", base_of(r.name).c_str(), th, r.ms, r.gbs);
    if (adam && bw > 0)
      std::printf(" %9.0f%%", 100.0 * r.gbs / bw);
    else
      std::printf(" %10s", "");
    if (adam && torch_ms.count(th)) std::printf(" %8.2fx", torch_ms[th] / r.ms);
    std::printf("\n");
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (int th : {1, 2}) {
    benchmark::RegisterBenchmark("BM_Triad", BM_Triad)
        ->Arg(th)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark("BM_Memcpy", BM_Memcpy)
        ->Arg(th)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (const char* simd : {"avx512", "avx2", "scalar"}) {
    try {
      make_optimizer("cpu_adam", std::string("simd = \"") + simd + "\"\nthreads = 1\n");
    } catch (const std::exception&) {
      std::printf("cpu_adam simd = %s: not supported by this CPU, skipped\n", simd);
      continue;
    }
    benchmark::RegisterBenchmark((std::string("BM_CpuAdam/") + simd).c_str(), BM_CpuAdam,
                                 std::string(simd))
        ->Arg(1)
        ->Arg(2)
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  benchmark::RegisterBenchmark("BM_TorchAdamW", BM_TorchAdamW)
      ->Arg(1)
      ->Arg(2)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_FusedAdamW", BM_FusedAdamW)
      ->Arg(1)
      ->Arg(2)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  benchmark::RegisterBenchmark("BM_DeviceAdamW", BM_DeviceAdamW)
      ->Arg(1)
      ->Arg(2)
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  Collector collector;
  benchmark::RunSpecifiedBenchmarks(&collector);
  print_summary(collector.results);
  benchmark::Shutdown();
  return 0;
}
