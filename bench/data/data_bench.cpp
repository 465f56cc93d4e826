// Data loading throughput (Google Benchmark), side by side in one run:
//   BM_WidenCopy            the memory-bound floor: uint32 ids -> int64, one pass (no plugin)
//   BM_CachedSsdNext        cached_ssd batches from a warm cache (prefetch thread on / off)
//   BM_SyntheticNext        synthetic batches (no I/O), for scale
//   BM_CacheBuild           tokenizing JSONL into a cold cache: MB/s of source text, with the
//                           trivial ByteTokenizer (the plugin's own cost: JSON, shards, hashing)
//                           and with the demo's BPE tokenizer (ciuic's Tokenizer)
// Counters: tokens_per_s (input_ids elements produced per second of wall time), MB_per_s.
// Figures and the command: docs/performance/data.md.
#include <benchmark/benchmark.h>
#include <ciuic/files.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "data_test_support.h"
#include "tokenizer/factory.h"

namespace {
using namespace ciuic;
using namespace ciuic::testdata;

const std::string kDir = std::string(CIUIC_TEST_TMP) + "/data-bench";

// ~`mb` MB of JSONL text documents of 200..2000 bytes.
std::string make_source(int mb) {
  std::string path = kDir + "/src-" + std::to_string(mb) + ".jsonl";
  if (std::filesystem::exists(path)) return path;
  std::filesystem::create_directories(kDir);
  std::ofstream f(path);
  uint64_t x = 12345;
  size_t bytes = 0;
  for (int i = 0; bytes < static_cast<size_t>(mb) << 20; ++i) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    std::string body = "doc-" + std::to_string(i) + " ";
    const size_t len = 200 + (x >> 33) % 1800;
    while (body.size() < len) body += "the quick brown fox jumps over the lazy dog 0123456789. ";
    body.resize(len);
    std::string line = nlohmann::json{{"text", body}}.dump() + "\n";
    bytes += line.size();
    f << line;
  }
  return path;
}

struct Opened {
  RunContext ctx = make_context(kDir);
  ByteTokenizer tok;
  std::shared_ptr<const Tokenizer> bpe;
  std::shared_ptr<DataSource> src;
  Opened(const std::string& plugin, const std::string& toml, int64_t T, int64_t mb,
         bool use_bpe = false) {
    ctx.seed = 1;
    src = registry().create<DataSource>(Slot::kData, plugin, Config::from_toml("data", toml), ctx);
    DataOpenArgs a;
    a.seq_len = T;
    a.micro_batch_size = mb;
    if (use_bpe)
      bpe = load_tokenizer(std::string(CIUIC_SOURCE_DIR) + "/examples/demo/tokenizer.json");
    a.tokenizer = use_bpe ? bpe.get() : &tok;
    src->open(a);
  }
};

void BM_WidenCopy(benchmark::State& state) {
  const int64_t T = 2048, mb = 8;
  std::vector<uint32_t> src(T * mb * 64, 7);
  std::vector<int64_t> dst(T * mb * 3);
  size_t off = 0;
  for (auto _ : state) {
    // The least a batch costs: read ids once, write three int64 planes.
    for (int64_t i = 0; i < T * mb; ++i) {
      dst[i] = src[off + i];
      dst[T * mb + i] = src[off + i + 1];
      dst[2 * T * mb + i] = i;
    }
    off = (off + T * mb) % (src.size() - T * mb - 1);
    benchmark::DoNotOptimize(dst.data());
  }
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * T * mb), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_WidenCopy)->UseRealTime();

void BM_CachedSsdNext(benchmark::State& state) {
  const std::string src = make_source(32);
  const int64_t T = 2048, mb = 8;
  const std::string toml = "sources = [\"" + src + "\"]\ncache_dir = \"" + kDir +
                           "/cache-next\"\n"
                           "split_documents = true\nprefetch_batches = " +
                           std::to_string(state.range(0)) + "\n";
  { Opened warm("cached_ssd", toml, T, mb); }  // build once; the timed object reuses it
  Opened o("cached_ssd", toml, T, mb);
  for (auto _ : state) benchmark::DoNotOptimize(o.src->next().input_ids.data_ptr());
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * T * mb), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CachedSsdNext)->ArgName("prefetch")->Arg(4)->Arg(0)->UseRealTime();

void BM_SyntheticNext(benchmark::State& state) {
  const int64_t T = 2048, mb = 8;
  Opened o("synthetic", "vocab_size = 32000\n", T, mb);
  for (auto _ : state) benchmark::DoNotOptimize(o.src->next().input_ids.data_ptr());
  state.counters["tokens_per_s"] = benchmark::Counter(
      static_cast<double>(state.iterations() * T * mb), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SyntheticNext)->UseRealTime();

void BM_CacheBuild(benchmark::State& state) {
  const bool bpe = state.range(0) == 1;
  const int threads = static_cast<int>(state.range(1));
  const std::string src = make_source(bpe ? 4 : 16);
  const double bytes = static_cast<double>(std::filesystem::file_size(src));
  int n = 0;
  for (auto _ : state) {
    const std::string cache = kDir + "/cache-build-" + std::to_string(n++);
    {
      std::error_code rm_ec;
      ciuic::remove_tree(std::filesystem::path(cache).string(), rm_ec);
    }
    Opened o("cached_ssd",
             "sources = [\"" + src + "\"]\ncache_dir = \"" + cache +
                 "\"\nbuild_threads = " + std::to_string(threads) + "\nprefetch_batches = 0\n",
             512, 1, bpe);
    state.PauseTiming();
    {
      std::error_code rm_ec;
      ciuic::remove_tree(std::filesystem::path(cache).string(), rm_ec);
    }
    state.ResumeTiming();
  }
  state.counters["MB_per_s"] =
      benchmark::Counter(bytes / 1e6 * state.iterations(), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_CacheBuild)
    ->ArgNames({"bpe", "threads"})
    ->Args({0, 1})
    ->Args({0, 2})
    ->Args({1, 1})
    ->Args({1, 2})
    ->Iterations(2)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
