// Tokenizer encode throughput, single thread (and a multi-thread variant), in MB/s of UTF-8 text.
//
// Input: $CIUIC_TOKENIZER_BENCH_DIR when set — the folder hf_tokenizers_speed.py writes, with
// docs.jsonl (one JSON string per line: the documents) and <config>/tokenizer.json for each
// config (deepseek_llm, llama3, qwen2, llama2_spm, mistral_spm, gemma_spm) — so that HF tokenizers
// and ciuic encode the very same documents with the very same tokenizers. Without it, the committed
// test fixtures are used (small vocabularies; documents made from the fixture strings): a smoke
// run, not a figure to quote.
#include "tokenizer/factory.h"
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include <ciuic/tokenizer.h>

namespace {

struct Input {
  std::string dir;  // tokenizer folder root
  std::vector<std::string> docs;
  size_t bytes = 0;
};

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const Input& input() {
  static const Input in = [] {
    Input r;
    if (const char* d = std::getenv("CIUIC_TOKENIZER_BENCH_DIR")) {
      r.dir = d;
      std::istringstream lines(read_all(r.dir + "/docs.jsonl"));
      for (std::string line; std::getline(lines, line);)
        if (!line.empty()) r.docs.push_back(nlohmann::json::parse(line).get<std::string>());
    } else {
      r.dir = std::string(CIUIC_FIXTURES_DIR) + "/tokenizer";
      auto cases = nlohmann::json::parse(read_all(r.dir + "/deepseek_llm/expected.json"))["cases"];
      std::string doc;
      for (int rep = 0; rep < 20; ++rep)
        for (const auto& c : cases) {
          doc += c["text"].get<std::string>();
          doc += rep % 2 ? "\n" : " ";
          if (doc.size() > 4096) r.docs.push_back(std::move(doc)), doc.clear();
        }
    }
    for (const auto& d : r.docs) r.bytes += d.size();
    return r;
  }();
  return in;
}

void BM_Encode(benchmark::State& state, const char* config) {
  const Input& in = input();
  auto tok = ciuic::load_tokenizer(in.dir + "/" + config + "/tokenizer.json");
  size_t tokens = 0;
  for (auto _ : state) {
    for (const std::string& d : in.docs) tokens += tok->encode(d, false).size();
  }
  state.SetBytesProcessed(static_cast<int64_t>(in.bytes) * state.iterations());
  state.counters["MB/s"] = benchmark::Counter(
      static_cast<double>(in.bytes) * state.iterations() / 1e6, benchmark::Counter::kIsRate);
  state.counters["tokens/s"] =
      benchmark::Counter(static_cast<double>(tokens), benchmark::Counter::kIsRate);
  state.counters["doc_bytes"] = static_cast<double>(in.bytes);
}

// Cold cache: a fresh tokenizer per iteration (includes loading, which is excluded via pause).
void BM_EncodeColdCache(benchmark::State& state, const char* config) {
  const Input& in = input();
  for (auto _ : state) {
    state.PauseTiming();
    auto tok = ciuic::load_tokenizer(in.dir + "/" + config + "/tokenizer.json");
    state.ResumeTiming();
    for (const std::string& d : in.docs) benchmark::DoNotOptimize(tok->encode(d, false));
  }
  state.counters["MB/s"] = benchmark::Counter(
      static_cast<double>(in.bytes) * state.iterations() / 1e6, benchmark::Counter::kIsRate);
}

void BM_Load(benchmark::State& state, const char* config) {
  const Input& in = input();
  for (auto _ : state)
    benchmark::DoNotOptimize(ciuic::load_tokenizer(in.dir + "/" + config + "/tokenizer.json"));
}

}  // namespace

BENCHMARK_CAPTURE(BM_Encode, deepseek_llm, "deepseek_llm")
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Encode, llama3, "llama3")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Encode, qwen2, "qwen2")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Encode, llama2_spm, "llama2_spm")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Encode, mistral_spm, "mistral_spm")
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Encode, gemma_spm, "gemma_spm")->Unit(benchmark::kMillisecond)->MinTime(2.0);
BENCHMARK_CAPTURE(BM_EncodeColdCache, deepseek_llm, "deepseek_llm")
    ->Unit(benchmark::kMillisecond)
    ->MinTime(2.0);
BENCHMARK_CAPTURE(BM_Load, deepseek_llm, "deepseek_llm")->Unit(benchmark::kMillisecond);

BENCHMARK_MAIN();
