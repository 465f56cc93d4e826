// Corpus BLEU (13a, zh) and ROUGE-L throughput, single thread, in segments/s.
//
// The corpus: the 300 hypothesis/reference pairs of tests/fixtures/score/cases.json's first
// corpus, 30 times (" <repetition>" appended, so no line repeats) = 9,000 segments — the same one
// bench/score/sacrebleu_speed.py gives sacrebleu and rouge-score, so the two figures compare
// (docs/metrics.md).
#include <benchmark/benchmark.h>

#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "score/bleu.h"
#include "score/rouge.h"

namespace {

struct Corpus {
  std::vector<std::string> hyps, refs;
  std::vector<std::vector<std::string>> ref_lists;
};

const Corpus& corpus() {
  static const Corpus c = [] {
    const std::string path = std::string(CIUIC_FIXTURES_DIR) + "/score/cases.json";
    std::ifstream in(path);
    if (!in) throw std::runtime_error("cannot open " + path);
    std::stringstream ss;
    ss << in.rdbuf();
    const auto j = nlohmann::json::parse(ss.str());
    const auto& first = j["corpora"][0];
    Corpus r;
    for (int rep = 0; rep < 30; ++rep)
      for (size_t i = 0; i < first["hyps"].size(); ++i) {
        // Distinct lines (sacrebleu caches its tokenizer's results per line).
        r.hyps.push_back(first["hyps"][i].get<std::string>() + " " + std::to_string(rep));
        r.refs.push_back(first["refs"][i][0].get<std::string>() + " " + std::to_string(rep));
        r.ref_lists.push_back({r.refs.back()});
      }
    return r;
  }();
  return c;
}

void bleu(benchmark::State& st, ciuic::score::BleuTokenize t) {
  const Corpus& c = corpus();
  for (auto _ : st)
    benchmark::DoNotOptimize(ciuic::score::corpus_bleu(c.hyps, c.ref_lists, t).score);
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations() * c.hyps.size()));
}

void BM_CorpusBleu13a(benchmark::State& st) { bleu(st, ciuic::score::BleuTokenize::k13a); }
void BM_CorpusBleuZh(benchmark::State& st) { bleu(st, ciuic::score::BleuTokenize::kZh); }

void BM_RougeLMean(benchmark::State& st) {
  const Corpus& c = corpus();
  for (auto _ : st) benchmark::DoNotOptimize(ciuic::score::rouge_l_mean(c.refs, c.hyps).fmeasure);
  st.SetItemsProcessed(static_cast<int64_t>(st.iterations() * c.hyps.size()));
}

}  // namespace

BENCHMARK(BM_CorpusBleu13a)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_CorpusBleuZh)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_RougeLMean)->Unit(benchmark::kMillisecond);
BENCHMARK_MAIN();
