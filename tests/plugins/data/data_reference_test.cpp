// The cached_ssd and synthetic plugins, loaded through the Registry, against the batches of an
// independent Python model of the data slot's rules (tests/fixtures/gen_data_kit.py ->
// fixtures/data/kit_reference.json): shuffling, packing, labels, positions, rank dealing, epoch
// wrap, cursors and eval shares, bit for bit. These batches are also what old checkpoints' cursors
// point into: they must not change.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "data_test_support.h"
#include "kit_reference.h"

namespace ciuic::testdata {
namespace {

using Json = nlohmann::json;

// Opens `plugin` for a reference case, seeks to its start, and compares every batch, the cursor
// and epoch after it, and the eval split (twice: begin_eval() restarts it).
void check_case(const std::string& plugin, const Json& c, const std::string& extra_toml,
                const std::string& dir) {
  const std::string where = plugin + " case " + c["name"].get<std::string>();
  RunContext ctx = make_context(dir, c["rank"].get<int>(), c["world_size"].get<int>());
  ctx.seed = c["seed"].get<uint64_t>();
  ByteTokenizer tok;
  auto src = registry().create<DataSource>(
      Slot::kData, plugin,
      Config::from_toml("data", extra_toml + c["options"].get<std::string>(), dir + "/r.toml"),
      ctx);
  DataOpenArgs a;
  a.seq_len = c["seq_len"].get<int64_t>();
  a.micro_batch_size = c["micro_batch_size"].get<int64_t>();
  a.tokenizer = &tok;
  src->open(a);
  src->seek(c["start"].get<std::string>());
  int i = 0;
  for (const Json& want : c["batches"]) {
    const std::string w = where + " batch " + std::to_string(i++);
    expect_batch(src->next(), want, w);
    EXPECT_EQ(src->cursor(), want["cursor_after"].get<std::string>()) << w;
    EXPECT_EQ(src->epoch(), want["epoch_after"].get<int64_t>()) << w;
  }
  EXPECT_EQ(src->has_eval(), c.contains("eval")) << where;
  if (!c.contains("eval")) return;
  for (int pass = 0; pass < 2; ++pass) {
    src->begin_eval();
    size_t n = 0;
    while (auto b = src->next_eval()) {
      ASSERT_LT(n, c["eval"].size()) << where << ": more eval batches than the reference";
      expect_batch(*b, c["eval"][n], where + " eval batch " + std::to_string(n));
      ++n;
    }
    EXPECT_EQ(n, c["eval"].size()) << where;
  }
}

TEST(DataReference, CachedSsdMatchesThePythonModel) {
  ASSERT_GE(kit_reference()["cached_ssd"].size(), 5u);
  for (const Json& c : kit_reference()["cached_ssd"]) {
    const std::string dir = temp_dir("reference_" + c["name"].get<std::string>());
    std::string jsonl;
    for (const Json& t : c["texts"]) jsonl += Json{{"text", t}}.dump() + "\n";
    write_file(dir + "/d.jsonl", jsonl);
    check_case("cached_ssd", c, "sources = [\"d.jsonl\"]\n", dir);
  }
}

TEST(DataReference, SyntheticMatchesThePythonModel) {
  ASSERT_GE(kit_reference()["synthetic"].size(), 3u);
  for (const Json& c : kit_reference()["synthetic"])
    check_case("synthetic", c, "", temp_dir("reference_synthetic_" + c["name"].get<std::string>()));
}

}  // namespace
}  // namespace ciuic::testdata
