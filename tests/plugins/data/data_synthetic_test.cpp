// The synthetic data source: its patterns checked by their defining property (written out here,
// not by the plugin's generator), determinism, ranks, cursor/seek, documents per row.
#include <gtest/gtest.h>

#include <set>

#include <ciuic/error.h>

#include "data_test_support.h"

namespace ciuic::testdata {
namespace {

struct Synth {
  RunContext ctx = make_context(CIUIC_TEST_TMP);
  std::shared_ptr<DataSource> src;
  Synth(const std::string& toml, int64_t T, int64_t mb, int rank = 0, int world = 1,
        uint64_t seed = 3) {
    ctx.rank = rank;
    ctx.world_size = world;
    ctx.seed = seed;
    src = registry().create<DataSource>(Slot::kData, "synthetic",
                                        Config::from_toml("data", toml, "recipe.toml"), ctx);
    DataOpenArgs a;
    a.seq_len = T;
    a.micro_batch_size = mb;
    src->open(a);
  }
};

std::vector<int64_t> row(const at::Tensor& t, int64_t i) {
  auto r = t[i].contiguous();
  return std::vector<int64_t>(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
}

// Document spans [start, end) of a row from its position_ids.
std::vector<std::pair<int64_t, int64_t>> spans(const std::vector<int64_t>& pos) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t t = 0; t < static_cast<int64_t>(pos.size()); ++t) {
    if (pos[t] == 0) out.push_back({t, t});
    EXPECT_EQ(pos[t], t - out.back().first);
    out.back().second = t + 1;
  }
  return out;
}

TEST(Synthetic, IncrementPatternLabelsAndDocuments) {
  Synth s("vocab_size = 50\npattern = \"increment\"\ndocuments_per_row = 4\n", 32, 3);
  for (int step = 0; step < 3; ++step) {
    Batch b = s.src->next();
    EXPECT_EQ(b.num_documents, 12);
    EXPECT_EQ(b.num_label_tokens, 3 * (32 - 4));
    for (int64_t i = 0; i < 3; ++i) {
      auto ids = row(b.input_ids, i), labels = row(b.labels, i), pos = row(b.position_ids, i);
      auto docs = spans(pos);
      ASSERT_EQ(docs.size(), 4u);
      for (auto [s0, e0] : docs) {
        for (int64_t t = s0; t + 1 < e0; ++t) {
          EXPECT_EQ(ids[t + 1], (ids[t] + 1) % 50);
          EXPECT_EQ(labels[t], ids[t + 1]);
        }
        EXPECT_EQ(labels[e0 - 1], -100);
      }
    }
  }
}

TEST(Synthetic, RepeatAndRandomPatterns) {
  Synth r("vocab_size = 1000\npattern = \"repeat\"\nperiod = 5\n", 40, 2);
  Batch b = r.src->next();
  auto ids = row(b.input_ids, 1);
  for (int t = 0; t + 5 < 40; ++t) EXPECT_EQ(ids[t + 5], ids[t]);
  EXPECT_EQ(row(b.labels, 1)[39], -100);
  Synth u("vocab_size = 7\n", 1000, 1);
  auto v = row(u.src->next().input_ids, 0);
  std::vector<int> hist(7);
  for (auto x : v) {
    ASSERT_GE(x, 0);
    ASSERT_LT(x, 7);
    ++hist[x];
  }
  for (int h : hist) EXPECT_GT(h, 100);  // ~143 each
}

TEST(Synthetic, DeterministicSeekAndRanks) {
  const std::string toml = "vocab_size = 100\nrows_per_epoch = 9\ndocuments_per_row = 2\n";
  Synth a(toml, 16, 2), b(toml, 16, 2), c(toml, 16, 2, 0, 1, 4);
  std::vector<std::string> cursors;
  std::vector<std::vector<int64_t>> rows;
  for (int i = 0; i < 12; ++i) {
    cursors.push_back(a.src->cursor());
    Batch x = a.src->next(), y = b.src->next(), z = c.src->next();
    EXPECT_TRUE(x.input_ids.equal(y.input_ids));
    EXPECT_FALSE(x.input_ids.equal(z.input_ids));
    rows.push_back(row(x.input_ids, 0));
  }
  EXPECT_EQ(a.src->epoch(), 2);  // 24 rows of 9 per epoch
  b.src->seek(cursors[5]);
  EXPECT_EQ(row(b.src->next().input_ids, 0), rows[5]);
  // Ranks: 3 ranks x 3 rows = the 9 rows of the single-rank epoch 0.
  std::set<std::vector<int64_t>> one, three;
  Synth s1(toml, 16, 1);
  for (int i = 0; i < 9; ++i) one.insert(row(s1.src->next().input_ids, 0));
  for (int k = 0; k < 3; ++k) {
    Synth sk(toml, 16, 3, k, 3);
    Batch bk = sk.src->next();
    for (int i = 0; i < 3; ++i) EXPECT_TRUE(three.insert(row(bk.input_ids, i)).second);
    EXPECT_EQ(sk.src->epoch(), 1);
  }
  EXPECT_EQ(one, three);
}

TEST(Synthetic, EvalRowsAndBadOptions) {
  Synth s("vocab_size = 10\neval_rows = 5\n", 8, 2, 1, 2);
  ASSERT_TRUE(s.src->has_eval());
  s.src->begin_eval();
  int n = 0;
  int64_t labels = 0;
  while (auto b = s.src->next_eval()) {
    ++n;
    labels += b->num_label_tokens;
  }
  EXPECT_EQ(n, 2);           // ceil(ceil(5 / 2) / 2) on every rank
  EXPECT_EQ(labels, 2 * 7);  // rank 1 holds rows 1 and 3; its last row slot is empty
  try {
    Synth bad("pattern = \"zigzag\"\nvocab_size = 5\n", 8, 1);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("random|repeat|increment"), std::string::npos) << e.what();
  }
  try {
    Synth bad("pattern = \"repeat\"\n", 8, 1);
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size: this option is required"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ciuic::testdata
