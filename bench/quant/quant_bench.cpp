// NF4 (quant/nf4.h) on CPU: quantize and dequantize of an [N, N] weight (items = weights), and
// nf4_linear forward+backward of x [T, N] against at::linear with the same weight in fp32 / bf16
// (items = tokens). N defaults to 2048, T to 256 (env CIUIC_BENCH_N, CIUIC_BENCH_TOKENS).
//
//   build/bin/quant_bench [--benchmark_filter=...]
#include <cstdlib>

#include <ATen/TensorOperators.h>
#include <ATen/ops/linear.h>
#include <ATen/ops/randn.h>
#include <ATen/ops/sum.h>
#include <benchmark/benchmark.h>
#include <torch/csrc/autograd/autograd.h>

#include "quant/nf4.h"

namespace {

int64_t env_or(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v ? std::atoll(v) : dflt;
}
const int64_t kN = env_or("CIUIC_BENCH_N", 2048);
const int64_t kT = env_or("CIUIC_BENCH_TOKENS", 256);

at::ScalarType dtype_of(int64_t arg) { return arg == 0 ? at::kFloat : at::kBFloat16; }

void BM_Quantize(benchmark::State& state) {
  const at::Tensor w = at::randn({kN, kN}) * 0.02;
  for (auto _ : state) benchmark::DoNotOptimize(ciuic::quant::quantize_nf4(w));
  state.SetItemsProcessed(state.iterations() * kN * kN);
}

void BM_Dequantize(benchmark::State& state) {
  const auto q = ciuic::quant::quantize_nf4(at::randn({kN, kN}) * 0.02);
  const at::ScalarType dt = dtype_of(state.range(0));
  for (auto _ : state) benchmark::DoNotOptimize(ciuic::quant::dequantize_nf4(q, dt));
  state.SetItemsProcessed(state.iterations() * kN * kN);
  state.SetLabel(c10::toString(dt));
}

// range(0): dtype (0 fp32, 1 bf16); range(1): 1 = nf4_linear, 0 = at::linear of a dense weight.
void BM_LinearFwdBwd(benchmark::State& state) {
  const at::ScalarType dt = dtype_of(state.range(0));
  const bool nf4 = state.range(1) == 1;
  const at::Tensor w = at::randn({kN, kN}) * 0.02;
  const auto q = ciuic::quant::quantize_nf4(w);
  const at::Tensor dense = w.to(dt);
  const at::Tensor x = at::randn({kT, kN}).to(dt).requires_grad_(true);
  for (auto _ : state) {
    const at::Tensor y = nf4 ? ciuic::quant::nf4_linear(x, q) : at::linear(x, dense);
    benchmark::DoNotOptimize(torch::autograd::grad({y.sum()}, {x}));
  }
  state.SetItemsProcessed(state.iterations() * kT);
  state.SetLabel(std::string(nf4 ? "nf4 " : "dense ") + c10::toString(dt));
}

BENCHMARK(BM_Quantize)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_Dequantize)->Arg(0)->Arg(1)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_LinearFwdBwd)->ArgsProduct({{0, 1}, {0, 1}})->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
