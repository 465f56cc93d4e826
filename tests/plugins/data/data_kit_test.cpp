// The data kit (plugins/data/kit: ciuic/kit/{sampler,packing,packed_stream}.h) against an
// independent Python model of the data slot's rules (tests/fixtures/gen_data_kit.py ->
// fixtures/data/kit_reference.json): SplitMix64, the epoch permutation, every row of the three
// packing modes, and PackedStream's batches, cursors and eval shares on every rank of several
// world sizes, bit for bit. Then what the model does not cover: resuming from a cursor, on the
// same and on another world size, and the errors.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/kit/packed_stream.h>
#include <ciuic/kit/packing.h>
#include <ciuic/kit/sampler.h>

#include "kit_reference.h"

namespace ciuic::testdata {
namespace {

using kit::DocView;
using kit::PackedStream;
using kit::PackMode;
using kit::RowPlan;
using kit::StreamArgs;
using Json = nlohmann::json;

PackMode mode_of(const std::string& m) {
  return m == "pad" ? PackMode::kPad : m == "whole" ? PackMode::kPackWhole : PackMode::kPackSplit;
}

// The fixture's hand-made documents, as the kit sees them.
struct Docs {
  std::vector<std::vector<uint32_t>> ids;
  std::vector<std::vector<uint8_t>> mask;
  Docs() {
    for (const Json& d : kit_reference()["documents"]) {
      ids.push_back(d["ids"].get<std::vector<uint32_t>>());
      mask.push_back(d["mask"].get<std::vector<uint8_t>>());
    }
  }
  kit::DocLookup lookup() const {
    return [this](uint32_t d) {
      return DocView{ids[d].data(), mask[d].data(), static_cast<uint32_t>(ids[d].size())};
    };
  }
  std::vector<uint32_t> numbers(size_t n) const {
    std::vector<uint32_t> v;
    for (uint32_t i = 0; i < n && i < ids.size(); ++i) v.push_back(i);
    return v;
  }
};

TEST(DataKit, Mix64AndPermutationMatchTheModel) {
  for (const Json& c : kit_reference()["mix64"])
    EXPECT_EQ(kit::mix64(std::stoull(c["x"].get<std::string>())),
              std::stoull(c["mix"].get<std::string>()));
  ASSERT_GE(kit_reference()["permutation"].size(), 5u);
  for (const Json& c : kit_reference()["permutation"]) {
    const auto p =
        kit::permutation(c["n"].get<uint32_t>(), std::stoull(c["seed"].get<std::string>()),
                         std::stoull(c["stream"].get<std::string>()));
    EXPECT_EQ(Json(p), c["perm"]) << c["n"] << " " << c["seed"] << " " << c["stream"];
  }
}

TEST(DataKit, EveryRowOfEveryPackingModeMatchesTheModel) {
  const Docs docs;
  ASSERT_EQ(kit_reference()["packing"].size(), 6u);
  for (const Json& c : kit_reference()["packing"]) {
    const std::string where =
        c["mode"].get<std::string>() + " seq_len " + std::to_string(c["seq_len"].get<int>());
    const int64_t T = c["seq_len"].get<int64_t>();
    const auto lookup = docs.lookup();
    const RowPlan plan(
        c["order"].get<std::vector<uint32_t>>(), [&](uint32_t d) { return lookup(d).size; }, T,
        mode_of(c["mode"].get<std::string>()));
    ASSERT_EQ(plan.num_rows(), static_cast<int64_t>(c["rows"].size())) << where;
    EXPECT_EQ(plan.truncated_tokens(), c["truncated_tokens"].get<uint64_t>()) << where;
    std::vector<RowPlan::Segment> scratch;
    for (int64_t r = 0; r < plan.num_rows(); ++r) {
      std::vector<int64_t> ids(T), labels(T), pos(T);
      const kit::RowCounts n = kit::fill_row(plan, r, lookup, T, c["pad_id"].get<int64_t>(),
                                             ids.data(), labels.data(), pos.data(), scratch);
      const Json& want = c["rows"][r];
      const std::string w = where + " row " + std::to_string(r);
      EXPECT_EQ(Json(ids), want["input_ids"]) << w;
      EXPECT_EQ(Json(labels), want["labels"]) << w;
      EXPECT_EQ(Json(pos), want["position_ids"]) << w;
      EXPECT_EQ(n.label_tokens, want["label_tokens"].get<int64_t>()) << w;
      EXPECT_EQ(n.documents, want["documents"].get<int64_t>()) << w;
      EXPECT_EQ(n.tokens, want["tokens"].get<int64_t>()) << w;
    }
  }
}

StreamArgs args_of(const Json& c) {
  StreamArgs a;
  a.seq_len = c["seq_len"].get<int64_t>();
  a.micro_batch_size = c["micro_batch_size"].get<int64_t>();
  a.seed = std::stoull(c["seed"].get<std::string>());
  a.rank = c["rank"].get<int>();
  a.world_size = c["world_size"].get<int>();
  return a;
}

PackedStream::Settings settings_of(const Json& c, size_t prefetch) {
  PackedStream::Settings s;
  s.who = "data plugin kit-test";
  s.mode = mode_of(c["mode"].get<std::string>());
  s.shuffle = c["shuffle"].get<bool>();
  s.pad_id = c["pad_id"].get<int64_t>();
  s.prefetch_batches = prefetch;
  return s;
}

// Every rank of every world size: batches, the cursor and epoch after each, and the eval share
// (twice: begin_eval() restarts it), with and without the prefetch thread.
TEST(DataKit, PackedStreamMatchesTheModelOnEveryRank) {
  const Docs docs;
  ASSERT_GE(kit_reference()["streams"].size(), 10u);
  for (size_t prefetch : {size_t{0}, size_t{3}}) {
    for (const Json& c : kit_reference()["streams"]) {
      const std::string where =
          c["mode"].get<std::string>() + " world " + std::to_string(c["world_size"].get<int>()) +
          " rank " + std::to_string(c["rank"].get<int>()) + " prefetch " + std::to_string(prefetch);
      PackedStream s(args_of(c), settings_of(c, prefetch), docs.numbers(12), docs.numbers(7),
                     docs.lookup());
      EXPECT_EQ(s.cursor(), "{\"epoch\":0,\"row\":0}");
      int i = 0;
      for (const Json& want : c["batches"]) {
        const std::string w = where + " batch " + std::to_string(i++);
        expect_batch(s.next(), want, w);
        EXPECT_EQ(s.cursor(), want["cursor_after"].get<std::string>()) << w;
        EXPECT_EQ(s.epoch(), want["epoch_after"].get<int64_t>()) << w;
      }
      ASSERT_TRUE(s.has_eval());
      for (int pass = 0; pass < 2; ++pass) {
        s.begin_eval();
        size_t n = 0;
        while (auto b = s.next_eval()) {
          ASSERT_LT(n, c["eval"].size()) << where;
          expect_batch(*b, c["eval"][n], where + " eval " + std::to_string(n));
          ++n;
        }
        EXPECT_EQ(n, c["eval"].size()) << where;
      }
    }
  }
}

// The rows a world of `world` ranks trains on from `cursor` for `steps` steps of micro-batch
// `micro`, as global rows in dealing order (rank r's i-th row is global row g + i * world + r).
std::vector<Json> global_rows(const Docs& docs, int world, int64_t micro, const std::string& cursor,
                              int steps, std::string* cursor_after = nullptr) {
  std::vector<std::unique_ptr<PackedStream>> ranks;
  for (int r = 0; r < world; ++r) {
    StreamArgs a;
    a.seq_len = 4;
    a.micro_batch_size = micro;
    a.seed = 42;
    a.rank = r;
    a.world_size = world;
    PackedStream::Settings s;
    s.mode = PackMode::kPackSplit;
    ranks.push_back(std::make_unique<PackedStream>(a, s, docs.numbers(12), std::vector<uint32_t>{},
                                                   docs.lookup()));
    if (!cursor.empty()) ranks.back()->seek(cursor);
  }
  std::vector<Json> out;
  for (int step = 0; step < steps; ++step) {
    std::vector<Json> rows(static_cast<size_t>(world * micro));
    for (int r = 0; r < world; ++r) {
      const Json ids = rows_json(ranks[r]->next().input_ids);
      for (int64_t i = 0; i < micro; ++i) rows[static_cast<size_t>(i * world + r)] = ids[i];
    }
    for (int r = 1; r < world; ++r)
      EXPECT_EQ(ranks[r]->cursor(), ranks[0]->cursor()) << "the cursor is global";
    out.insert(out.end(), rows.begin(), rows.end());
  }
  if (cursor_after) *cursor_after = ranks[0]->cursor();
  return out;
}

// A cursor is a global position. 2 ranks x micro-batch 3 train 2 steps; from their cursor, 2 x 3,
// 3 x 2 and 6 x 1 (the same 6 rows per step) read exactly the rows the uninterrupted run reads.
// The epoch (29 rows of 4 tokens) ends in step 5, where ranks past its end wrap to its first rows:
// which rows those are depends on the world size, so across the boundary the comparison is on
// the same world size (seeded from the cursor, into the next epoch's shuffled order).
TEST(DataKit, ACursorResumesExactlyOnAnyWorldSize) {
  const Docs docs;
  std::string cursor;
  const std::vector<Json> first = global_rows(docs, 2, 3, "", 2, &cursor);
  EXPECT_EQ(cursor, "{\"epoch\":0,\"row\":12}");
  const std::vector<Json> straight = global_rows(docs, 2, 3, "", 8);
  EXPECT_EQ(first, std::vector<Json>(straight.begin(), straight.begin() + 12))
      << "the streams are reproducible";
  for (auto [world, micro] : {std::pair{2, 3}, std::pair{3, 2}, std::pair{6, 1}}) {
    const std::vector<Json> resumed = global_rows(docs, world, micro, cursor, 2);
    for (size_t i = 0; i < resumed.size(); ++i)
      EXPECT_EQ(resumed[i], straight[12 + i]) << world << " x " << micro << " row " << 12 + i;
  }
  const std::vector<Json> across = global_rows(docs, 2, 3, cursor, 6);
  for (size_t i = 0; i < across.size(); ++i)
    EXPECT_EQ(across[i], straight[12 + i]) << "row " << 12 + i;
  EXPECT_NE(std::vector<Json>(straight.begin(), straight.begin() + 6),
            std::vector<Json>(straight.begin() + 30, straight.begin() + 36))
      << "epoch 1 is shuffled differently from epoch 0";
}

TEST(DataKit, ErrorsNameThePlugin) {
  const Docs docs;
  StreamArgs a;
  a.seq_len = 8;
  a.micro_batch_size = 2;
  PackedStream::Settings s;
  s.who = "data plugin lines";
  EXPECT_EQ(message_of([&] { PackedStream(a, s, {}, {}, docs.lookup()); }),
            "data plugin lines: no training documents");
  PackedStream ok(a, s, docs.numbers(3), {}, docs.lookup());
  EXPECT_FALSE(ok.has_eval());
  EXPECT_EQ(ok.next_eval(), std::nullopt);
  for (const char* bad : {"", "{}", "[1,2]", "{\"epoch\":0}", "{\"epoch\":-1,\"row\":0}",
                          "{\"epoch\":0,\"row\":\"3\"}"})
    EXPECT_EQ(message_of([&] { ok.seek(bad); }),
              std::string("data plugin lines: bad cursor '") + bad +
                  "': expected {\"epoch\": <int >= 0>, \"row\": <int >= 0>}")
        << bad;
  a.rank = 2;
  a.world_size = 2;
  EXPECT_NE(message_of([&] {
              PackedStream(a, s, docs.numbers(3), {}, docs.lookup());
            }).find("data plugin lines: bad open arguments"),
            std::string::npos);
  // A cursor past the end of its epoch (another dataset) starts the next epoch.
  a.rank = 0;
  a.world_size = 1;
  PackedStream p(a, s, docs.numbers(3), {}, docs.lookup());
  p.seek("{\"epoch\":4,\"row\":100000}");
  EXPECT_EQ(p.cursor(), "{\"epoch\":5,\"row\":0}");
  EXPECT_EQ(kit::eval_batches_per_rank(7, 3, 2), 2);
  EXPECT_EQ(kit::eval_batches_per_rank(0, 3, 2), 0);
}

}  // namespace
}  // namespace ciuic::testdata
