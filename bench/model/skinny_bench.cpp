// The decode step's products on the CPU: the skinny GEMM (model/cpu_skinny_gemm.h) against
// at::linear (MKL's sgemm) and oneDNN's linear on a pre-reordered weight, for the 100M benchmark
// Llama's shapes (hidden 768, intermediate 2048, 4 KV heads of 64, vocab 32000).
//
//   build/bin/skinny_bench [--benchmark_filter=...]
// Weights are cold, as in a decode step of a model larger than the L3: each iteration multiplies
// the next of enough copies of W to fill 512 MB. Reported: time per product and W's bytes read
// per second. Threads: at::get_num_threads() (OMP_NUM_THREADS). CIUIC_BENCH_HOT=1: one copy of W
// (in the caches where it fits: the arithmetic's own rate).
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <vector>

#include <ATen/Context.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <benchmark/benchmark.h>

#include "model/cpu_skinny_gemm.h"

namespace {

using ciuic::model::SkinnyIsa;

using ciuic::model::onednn_linear;

// impl: 0 at::linear, 1 skinny (best ISA), 2 skinny AVX2, 3 skinny scalar, 4 oneDNN reordered.
void BM_Product(benchmark::State& state) {
  const int impl = static_cast<int>(state.range(0));
  const int64_t m = state.range(1), n = state.range(2), k = state.range(3);
  if (impl == 2 && !ciuic::model::skinny_isa_supported(SkinnyIsa::kAvx2)) {
    state.SkipWithError("no AVX2");
    return;
  }
  at::NoGradGuard no_grad;
  const int64_t bytes = n * k * 4;
  const int64_t copies =
      std::getenv("CIUIC_BENCH_HOT") ? 1 : std::max<int64_t>(2, (int64_t{512} << 20) / bytes);
  std::vector<at::Tensor> ws;
  for (int64_t i = 0; i < copies; ++i) {
    at::Tensor w = at::randn({n, k});
    ws.push_back(impl == 4 ? ciuic::model::onednn_reorder_linear_weight(w, m) : w);
  }
  const at::Tensor x = at::randn({m, k});
  size_t i = 0;
  for (auto _ : state) {
    const at::Tensor& w = ws[i++ % ws.size()];
    at::Tensor y;
    switch (impl) {
      case 0: y = at::linear(x, w); break;
      case 1: y = ciuic::model::skinny_linear(x, w); break;
      case 2: y = ciuic::model::skinny_linear(x, w, {}, SkinnyIsa::kAvx2); break;
      case 3: y = ciuic::model::skinny_linear(x, w, {}, SkinnyIsa::kScalar); break;
      default: y = onednn_linear(x, w); break;
    }
    benchmark::DoNotOptimize(y.data_ptr());
  }
  state.SetBytesProcessed(state.iterations() * bytes);
  state.SetLabel(std::string(impl == 0   ? "at::linear"
                             : impl == 1 ? "skinny"
                             : impl == 2 ? "skinny-avx2"
                             : impl == 3 ? "skinny-scalar"
                                         : "onednn") +
                 " threads=" + std::to_string(at::get_num_threads()));
}

void shapes(benchmark::internal::Benchmark* b) {
  for (int impl : {0, 1, 2, 4})
    for (int64_t m : {1, 8, 16, 64})
      for (auto nk : std::vector<std::pair<int64_t, int64_t>>{
               {768, 768}, {256, 768}, {2048, 768}, {768, 2048}, {32000, 768}})
        b->Args({impl, m, nk.first, nk.second});
}
BENCHMARK(BM_Product)->Apply(shapes)->ArgNames({"impl", "m", "n", "k"})->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
