// Forward+backward tokens/s of a small Llama on CPU, with and without activation checkpointing.
//
//   build-*/bin/model_bench [--benchmark_filter=...]
// Shape (override with env CIUIC_BENCH_{HIDDEN,LAYERS,SEQ,BATCH,VOCAB,HEAD_DIM,KV_HEADS,
// INTERMEDIATE}): hidden 256, 4 layers, heads of 64 (hidden / 64 of them, half as many KV heads),
// intermediate 8/3 hidden, vocab 2048, batch 2 x seq 256. CIUIC_BENCH_DEVICE=cuda and
// CIUIC_BENCH_DTYPE=bf16 run it on a GPU in bfloat16 (bench/model/peer_hf.py reads the same
// variables for the PyTorch peer). BM_CheckpointingRatio alternates both settings step by step and
// reports on/off as a ratio measured side by side. BM_LoraForwardBackward: the LoRA step (r 16 on
// every linear, CIUIC_BENCH_LORA_R) with and without adapter dropout.
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <ATen/ops/randint.h>
#include <ATen/ops/tensor.h>
#include <benchmark/benchmark.h>

#include "model/llama.h"
#include "model/lora.h"

namespace {

using ciuic::model::LlamaConfig;
using ciuic::model::LlamaModel;

int64_t env_or(const char* name, int64_t dflt) {
  const char* v = std::getenv(name);
  return v ? std::atoll(v) : dflt;
}

struct Setup {
  std::unique_ptr<LlamaModel> model;
  at::Tensor ids, labels, position_ids;
  ciuic::model::PackedDocs docs;
  int packed = 0;  // 0: one document a row, 1: packed rows (dense mask), 2: packed rows +
                   // PackedDocs (varlen on CUDA)
  int64_t tokens = 0;
};

Setup make_setup() {
  LlamaConfig c;
  c.hidden_size = env_or("CIUIC_BENCH_HIDDEN", 256);
  c.num_hidden_layers = env_or("CIUIC_BENCH_LAYERS", 4);
  c.head_dim = env_or("CIUIC_BENCH_HEAD_DIM", 64);
  c.num_attention_heads = c.hidden_size / c.head_dim;
  c.num_key_value_heads =
      env_or("CIUIC_BENCH_KV_HEADS", std::max<int64_t>(1, c.num_attention_heads / 2));
  c.intermediate_size = env_or("CIUIC_BENCH_INTERMEDIATE", (c.hidden_size * 8 / 3 + 15) / 16 * 16);
  c.vocab_size = env_or("CIUIC_BENCH_VOCAB", 2048);
  c.tie_word_embeddings = false;
  c.validate("bench");
  Setup s;
  const char* dev = std::getenv("CIUIC_BENCH_DEVICE");
  const char* dt = std::getenv("CIUIC_BENCH_DTYPE");
  const c10::Device device(dev ? dev : "cpu");
  const at::ScalarType dtype = dt && std::string(dt) == "bf16" ? at::kBFloat16 : at::kFloat;
  s.model = std::make_unique<LlamaModel>(c, dtype, device);
  s.model->init_random(1, 0.02);
  const int64_t b = env_or("CIUIC_BENCH_BATCH", 2), t = env_or("CIUIC_BENCH_SEQ", 256);
  s.ids = at::randint(0, c.vocab_size, {b, t}, at::kLong).to(device);
  s.labels = s.ids.roll({-1}, {1});
  // Packed rows: documents of t/8, t/4, t/8, t/2 tokens (position_ids restart at each).
  std::vector<int64_t> pos;
  for (int64_t len : {t / 8, t / 4, t / 8, t - t / 2})
    for (int64_t i = 0; i < len; ++i) pos.push_back(i);
  const at::Tensor cpu_pos = at::tensor(pos, at::kLong).unsqueeze(0).expand({b, t}).contiguous();
  s.position_ids = cpu_pos.to(device);
  s.docs = ciuic::model::PackedDocs::from_position_ids(cpu_pos, device);
  s.tokens = b * t;
  return s;
}

void train_step(const Setup& s) {
  for (auto& p : s.model->parameters())
    if (p.grad().defined()) p.mutable_grad().zero_();
  s.model
      ->loss_sum(s.ids, s.labels, s.packed ? s.position_ids : at::Tensor(), s.packed != 0,
                 s.packed == 2 ? &s.docs : nullptr)
      .backward();
  // Wait for the device: the embedding's gradient is the last one backward produces.
  if (!s.model->device().is_cpu()) s.model->embed_weight().grad().view(-1)[0].item<float>();
}

void BM_ForwardBackward(benchmark::State& state) {
  Setup s = make_setup();
  s.model->set_activation_checkpointing(state.range(0) != 0);
  s.packed = static_cast<int>(state.range(1));
  train_step(s);  // warm-up (allocations, grads)
  for (auto _ : state) train_step(s);
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(s.tokens), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = at::get_num_threads();
  state.SetLabel(std::string(state.range(0) ? "checkpointing on" : "checkpointing off") +
                 (s.packed == 1   ? ", packed (4 documents a row), mask"
                  : s.packed == 2 ? ", packed (4 documents a row), PackedDocs"
                                  : ""));
}
BENCHMARK(BM_ForwardBackward)
    ->ArgNames({"ckpt", "packed"})
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 1})
    ->Args({0, 2})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();

// LoRA (model/lora.h) on every linear of the same model, rank CIUIC_BENCH_LORA_R (16), alpha 2r:
// the base frozen, forward+backward of the adapters' training step; arg dropout: 0 (adapters that
// share an input run one A product) or 0.1 (each adapter its own, with its own mask).
void BM_LoraForwardBackward(benchmark::State& state) {
  Setup s = make_setup();
  ciuic::model::LoraSpec spec;
  spec.r = env_or("CIUIC_BENCH_LORA_R", 16);
  spec.alpha = 2.0 * static_cast<double>(spec.r);
  spec.dropout = static_cast<double>(state.range(0)) / 10.0;
  spec.target_names = {"all-linear"};
  spec.targets = ciuic::model::lora_target_slots(spec.target_names, "bench");
  s.model->enable_lora(spec);
  s.model->init_lora(1);
  const auto step = [&] {
    for (auto& [name, p] : s.model->lora_parameters())
      if (p.grad().defined()) p.mutable_grad().zero_();
    s.model->loss_sum(s.ids, s.labels, {}, false).backward();
    if (!s.model->device().is_cpu())  // wait for the device: layer 0's A gets the last gradient
      s.model->lora_parameters().front().second.grad().view(-1)[0].item<float>();
  };
  step();  // warm-up
  for (auto _ : state) step();
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(s.tokens), benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel("r " + std::to_string(spec.r) + ", dropout " + std::to_string(spec.dropout));
}
BENCHMARK(BM_LoraForwardBackward)
    ->ArgName("dropout_tenths")
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime()
    ->MeasureProcessCPUTime();

void BM_Forward(benchmark::State& state) {
  Setup s = make_setup();
  at::NoGradGuard no_grad;
  for (auto _ : state) s.model->loss_sum(s.ids, s.labels, {}, false).item<float>();
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(s.tokens), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Forward)->Unit(benchmark::kMillisecond)->UseRealTime();

// Both settings, alternating step by step on one model, so drifts in machine load hit both.
void BM_CheckpointingRatio(benchmark::State& state) {
  Setup s = make_setup();
  double t_off = 0, t_on = 0;
  train_step(s);
  for (auto _ : state) {
    for (bool on : {false, true}) {
      s.model->set_activation_checkpointing(on);
      const auto t0 = std::chrono::steady_clock::now();
      train_step(s);
      const double dt =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      (on ? t_on : t_off) += dt;
    }
  }
  const double n = static_cast<double>(state.iterations());
  state.counters["off_tokens_per_s"] = s.tokens * n / t_off;
  state.counters["on_tokens_per_s"] = s.tokens * n / t_on;
  state.counters["on_over_off"] =
      t_off / t_on;  // throughput ratio: < 1 means checkpointing is slower
}
BENCHMARK(BM_CheckpointingRatio)->Unit(benchmark::kMillisecond)->UseRealTime()->MinTime(5.0);

}  // namespace

BENCHMARK_MAIN();
