// data_probe — opens a data source in its own process and prints what it read, for the
// multi-process data tests (tests/plugins/data/data_multiproc_test.cpp).
//
//   data_probe <recipe_dir> <data-section.toml> <rank> <world> <batches> <out.json>
//
// Uses the ByteTokenizer of data_test_support.h, seq_len 32, micro-batch 2, seed 5. Writes
// {"tokenized_documents", "cache_hit", "batches": [[input_ids rows], ...]} to out.json.
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>

#include "data_test_support.h"

int main(int argc, char** argv) {
  using namespace ciuic;
  using namespace ciuic::testdata;
  if (argc != 7) {
    std::fprintf(
        stderr,
        "usage: data_probe <recipe_dir> <section.toml> <rank> <world> <batches> <out.json>\n");
    return 2;
  }
  try {
    const std::string dir = argv[1];
    std::stringstream toml;
    toml << std::ifstream(argv[2]).rdbuf();
    const int rank = std::atoi(argv[3]), world = std::atoi(argv[4]), n = std::atoi(argv[5]);
    RunContext ctx = make_context(dir, rank, world);
    ctx.seed = 5;
    ByteTokenizer tok;
    auto src = registry().create<DataSource>(Slot::kData, "cached_ssd",
                                             Config::from_toml("data", toml.str(), argv[2]), ctx);
    DataOpenArgs a;
    a.seq_len = 32;
    a.micro_batch_size = 2;
    a.tokenizer = &tok;
    src->open(a);
    nlohmann::json out;
    Metrics m;
    src->append_metrics(m);
    for (auto& [k, v] : m.values) out[k] = v;
    out["batches"] = nlohmann::json::array();
    for (int i = 0; i < n; ++i) {
      Batch b = src->next();
      nlohmann::json rows = nlohmann::json::array();
      for (int64_t r = 0; r < b.input_ids.size(0); ++r) {
        auto row = b.input_ids[r].contiguous();
        rows.push_back(
            std::vector<int64_t>(row.data_ptr<int64_t>(), row.data_ptr<int64_t>() + row.numel()));
      }
      out["batches"].push_back(rows);
    }
    std::ofstream(argv[6]) << out.dump();
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "data_probe: %s\n", e.what());
    return e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "data_probe: %s\n", e.what());
    return 1;
  }
}
