// The cached_ssd data source, loaded through the Registry like ciuic-run does. Expected values are
// written out by hand from the ByteTokenizer's rules (data_test_support.h), not computed by the
// plugin's code; XXH64 is compared with the Python `xxhash` package (fixtures/data/xxh64.json).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>

#include <ciuic/error.h>

#include "../../support/deep_json.h"
#include "data_test_support.h"
#include "hash64.h"

namespace ciuic::testdata {
namespace {

using Rows = std::vector<std::vector<int64_t>>;
using Json = nlohmann::json;

// What a test needs alive around one data source (the context and tokenizer outlive it).
struct Source {
  RunContext ctx;
  ByteTokenizer tok;
  TagChatTemplate tmpl{tok};
  std::shared_ptr<DataSource> src;
  DataOpenArgs args;

  Source(const std::string& dir, const std::string& toml, int64_t seq_len, int64_t mb, int rank = 0,
         int world = 1, uint64_t seed = 7, std::string tok_salt = "", bool with_chat = true)
      : ctx(make_context(dir, rank, world)), tok(std::move(tok_salt)) {
    ctx.seed = seed;
    src = registry().create<DataSource>(Slot::kData, "cached_ssd",
                                        Config::from_toml("data", toml, dir + "/recipe.toml"), ctx);
    args.seq_len = seq_len;
    args.micro_batch_size = mb;
    args.tokenizer = &tok;
    args.chat_template = with_chat ? &tmpl : nullptr;
  }
  void open() { src->open(args); }
  double metric(const std::string& key) const {
    Metrics m;
    src->append_metrics(m);
    for (auto& [k, v] : m.values)
      if (k == key) return v;
    ADD_FAILURE() << "no metric " << key;
    return -1;
  }
};

Rows rows_of(const at::Tensor& t) {
  Rows r(t.size(0));
  for (int64_t i = 0; i < t.size(0); ++i)
    for (int64_t j = 0; j < t.size(1); ++j) r[i].push_back(t[i][j].item<int64_t>());
  return r;
}

struct Flat {
  Rows ids, labels, pos;
  bool operator==(const Flat& o) const {
    return ids == o.ids && labels == o.labels && pos == o.pos;
  }
};
Flat flat(const Batch& b) {
  return {rows_of(b.input_ids), rows_of(b.labels), rows_of(b.position_ids)};
}

// The documents in a row: byte-decoded text of each piece starting at position 0 (BOS/EOS and
// padding dropped), e.g. "doc-3".
std::vector<std::string> docs_in_row(const std::vector<int64_t>& ids,
                                     const std::vector<int64_t>& pos) {
  std::vector<std::string> out;
  for (size_t t = 0; t < ids.size(); ++t) {
    if (pos[t] == 0) out.emplace_back();
    if (ids[t] >= 3 && ids[t] < 259) out.back() += static_cast<char>(ids[t] - 3);
  }
  while (!out.empty() && out.back().empty()) out.pop_back();  // padding
  return out;
}

std::string text_jsonl(int n, int seed_len = 0) {
  std::string s;
  for (int i = 0; i < n; ++i) {
    std::string body = "doc-" + std::to_string(i);
    body += std::string(static_cast<size_t>((i * 7 + seed_len) % 13), 'x');
    s += Json{{"text", body}}.dump() + "\n";
  }
  return s;
}

// ---- XXH64 ------------------------------------------------------------------------------------
TEST(DataHash, Xxh64MatchesPythonXxhash) {
  std::ifstream in(std::string(CIUIC_FIXTURES_DIR) + "/data/xxh64.json");
  Json j = Json::parse(in);
  ASSERT_GT(j["cases"].size(), 10u);
  for (const auto& c : j["cases"]) {
    const size_t n = c["length"].get<size_t>();
    const uint64_t seed = std::stoull(c["seed"].get<std::string>());
    std::vector<uint8_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>((i * 31 + 7) % 256);
    EXPECT_EQ(data::hex64(data::xxh64(b.data(), n, seed)), c["xxh64"].get<std::string>())
        << "length " << n;
    // Streaming in uneven pieces gives the same digest.
    data::Hash64 h(seed);
    for (size_t i = 0; i < n;) {
      size_t k = std::min(n - i, 1 + (i * 7) % 40);
      h.update(b.data() + i, k);
      i += k;
    }
    EXPECT_EQ(data::hex64(h.digest()), c["xxh64"].get<std::string>()) << "streamed, length " << n;
  }
}

// ---- rows, labels, positions on hand-made documents -------------------------------------------
// "ab" -> [1 100 101 2], "cde" -> [1 102 103 104 2], "fghijk" -> [1 105 .. 110 2]; pad id = EOS
// = 2.
std::string three_docs(const std::string& dir) {
  write_file(dir + "/d.jsonl", R"({"text": "ab"})"
                               "\n"
                               R"({"text": "cde"})"
                               "\n\n"
                               R"({"text": "fghijk"})"
                               "\n");
  return "sources = [\"d.jsonl\"]\nshuffle = false\n";
}

TEST(CachedSsd, PackWholeDocuments) {
  std::string dir = temp_dir("pack_whole");
  Source s(dir, three_docs(dir) + "packing = true\nsplit_documents = false\n", 10, 2);
  s.open();
  Batch b = s.src->next();
  Flat f = flat(b);
  EXPECT_EQ(f.ids, (Rows{{1, 100, 101, 2, 1, 102, 103, 104, 2, 2},
                         {1, 105, 106, 107, 108, 109, 110, 2, 2, 2}}));
  EXPECT_EQ(f.labels, (Rows{{100, 101, 2, -100, 102, 103, 104, 2, -100, -100},
                            {105, 106, 107, 108, 109, 110, 2, -100, -100, -100}}));
  EXPECT_EQ(f.pos, (Rows{{0, 1, 2, 3, 0, 1, 2, 3, 4, 0}, {0, 1, 2, 3, 4, 5, 6, 7, 0, 1}}));
  EXPECT_EQ(b.num_label_tokens, 3 + 4 + 7);
  EXPECT_EQ(b.num_documents, 3);
  EXPECT_EQ(b.input_ids.scalar_type(), at::kLong);
  EXPECT_EQ(s.src->epoch(), 1);  // two rows: the epoch is done
}

TEST(CachedSsd, PackSplitDocumentsContinueInTheNextRow) {
  std::string dir = temp_dir("pack_split");
  Source s(dir, three_docs(dir) + "packing = true\nsplit_documents = true\n", 10, 2);
  s.open();
  Flat f = flat(s.src->next());
  // 17 tokens: row 0 ends with the first token (BOS) of "fghijk", whose label is its next token.
  EXPECT_EQ(f.ids, (Rows{{1, 100, 101, 2, 1, 102, 103, 104, 2, 1},
                         {105, 106, 107, 108, 109, 110, 2, 2, 2, 2}}));
  EXPECT_EQ(f.labels, (Rows{{100, 101, 2, -100, 102, 103, 104, 2, -100, 105},
                            {106, 107, 108, 109, 110, 2, -100, -100, -100, -100}}));
  EXPECT_EQ(f.pos, (Rows{{0, 1, 2, 3, 0, 1, 2, 3, 4, 0}, {0, 1, 2, 3, 4, 5, 6, 0, 1, 2}}));
}

TEST(CachedSsd, PaddingOneDocumentPerRowTruncates) {
  std::string dir = temp_dir("padding");
  Source s(dir, three_docs(dir) + "packing = false\n", 5, 3);
  s.open();
  Batch b = s.src->next();
  Flat f = flat(b);
  EXPECT_EQ(f.ids, (Rows{{1, 100, 101, 2, 2}, {1, 102, 103, 104, 2}, {1, 105, 106, 107, 108}}));
  EXPECT_EQ(
      f.labels,
      (Rows{{100, 101, 2, -100, -100}, {102, 103, 104, 2, -100}, {105, 106, 107, 108, -100}}));
  EXPECT_EQ(f.pos, (Rows{{0, 1, 2, 3, 0}, {0, 1, 2, 3, 4}, {0, 1, 2, 3, 4}}));
  EXPECT_EQ(s.metric("data_truncated_tokens"), 3);  // "fghijk" has 8 tokens, 5 fit
}

TEST(CachedSsd, TextWithoutBosEosAndCustomField) {
  std::string dir = temp_dir("no_bos");
  write_file(dir + "/d.jsonl", R"({"body": "ab", "text": 5})"
                               "\n");
  Source s(dir,
           "sources = [\"d.jsonl\"]\ntext_field = \"body\"\nadd_bos = false\nadd_eos = "
           "false\npad_id = 0\n",
           4, 1);
  s.open();
  Flat f = flat(s.src->next());
  EXPECT_EQ(f.ids, (Rows{{100, 101, 0, 0}}));
  EXPECT_EQ(f.labels, (Rows{{101, -100, -100, -100}}));
}

TEST(CachedSsd, ChatLossOnAssistantTokensOnly) {
  std::string dir = temp_dir("chat");
  write_file(
      dir + "/c.jsonl",
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})"
      "\n");
  // [user h i assistant y o EOS] = [260 107 108 261 124 114 2]; targets: y o EOS.
  Source s(dir, "sources = [\"c.jsonl\"]\nformat = \"chat\"\n", 8, 1);
  s.open();
  Flat f = flat(s.src->next());
  EXPECT_EQ(f.ids, (Rows{{260, 107, 108, 261, 124, 114, 2, 2}}));
  EXPECT_EQ(f.labels, (Rows{{-100, -100, -100, 124, 114, 2, -100, -100}}));
  EXPECT_EQ(f.pos, (Rows{{0, 1, 2, 3, 4, 5, 6, 0}}));

  Source all(dir, "sources = [\"c.jsonl\"]\nformat = \"chat\"\nassistant_only_loss = false\n", 8,
             1);
  all.open();
  EXPECT_EQ(flat(all.src->next()).labels, (Rows{{107, 108, 261, 124, 114, 2, -100, -100}}));
}

TEST(CachedSsd, ChatWithoutAssistantReplyIsDroppedAndPrompterIsUser) {
  std::string dir = temp_dir("chat_noreply");
  write_file(
      dir + "/c.jsonl",
      R"({"messages": [{"role": "user", "content": "hi"}]})"
      "\n"
      R"({"messages": [{"role": "prompter", "content": "a"}, {"role": "assistant", "content": "b"}]})"
      "\n");
  Source s(dir, "sources = [\"c.jsonl\"]\nformat = \"chat\"\n", 6, 1);
  s.open();
  EXPECT_EQ(flat(s.src->next()).ids, (Rows{{260, 100, 261, 101, 2, 2}}));
  EXPECT_EQ(s.metric("data_train_documents"), 1);
}

// ---- determinism, ranks, resume -----------------------------------------------------------------
std::vector<Flat> take(Source& s, int n) {
  std::vector<Flat> out;
  for (int i = 0; i < n; ++i) out.push_back(flat(s.src->next()));
  return out;
}

TEST(CachedSsd, SameSeedSameBatchesOtherSeedOthers) {
  std::string dir = temp_dir("seed");
  write_file(dir + "/d.jsonl", text_jsonl(40));
  const std::string toml = "sources = [\"d.jsonl\"]\n";
  Source a(dir, toml, 16, 2, 0, 1, 11);
  a.open();
  Source b(dir, toml + "prefetch_batches = 0\n", 16, 2, 0, 1,
           11);  // also: prefetching changes nothing
  b.open();
  Source c(dir, toml, 16, 2, 0, 1, 12);
  c.open();
  auto ba = take(a, 45), bb = take(b, 45), bc = take(c, 45);
  EXPECT_TRUE(ba == bb);
  EXPECT_FALSE(ba == bc);
  // Epochs are reshuffled: the first rows of epoch 0 and 1 differ.
  EXPECT_GE(a.src->epoch(), 2);
}

// Rows of one epoch per rank; packed and padded layouts, 1..4 ranks: together the ranks read every
// row of the single-rank epoch once, plus the wrap-around rows that even out the last step.
class RanksCoverEpoch : public ::testing::TestWithParam<std::string> {};

TEST_P(RanksCoverEpoch, DisjointAndComplete) {
  std::string dir =
      temp_dir("ranks_" + std::to_string(std::hash<std::string>()(GetParam()) % 1000));
  write_file(dir + "/d.jsonl", text_jsonl(23));
  const std::string toml = "sources = [\"d.jsonl\"]\n" + GetParam();
  std::multiset<std::vector<int64_t>> epoch_rows;
  {
    Source one(dir, toml, 24, 1);
    one.open();
    while (one.src->epoch() == 0) epoch_rows.insert(rows_of(one.src->next().input_ids)[0]);
  }
  const int64_t R = static_cast<int64_t>(epoch_rows.size());
  ASSERT_GT(R, 4);
  for (int W = 1; W <= 4; ++W) {
    std::multiset<std::vector<int64_t>> seen;
    const int64_t per_rank = (R + W - 1) / W;
    for (int k = 0; k < W; ++k) {
      Source s(dir, toml, 24, 1, k, W);
      s.open();
      for (int64_t i = 0; i < per_rank; ++i) seen.insert(rows_of(s.src->next().input_ids)[0]);
      EXPECT_EQ(s.src->epoch(), 1) << "rank " << k << " of " << W;  // all ranks finish together
    }
    // Every row of the epoch is read; the extra per_rank * W - R reads repeat rows (wrap-around).
    std::set<std::vector<int64_t>> distinct(seen.begin(), seen.end());
    EXPECT_EQ(distinct, std::set<std::vector<int64_t>>(epoch_rows.begin(), epoch_rows.end()))
        << W << " ranks";
    EXPECT_EQ(static_cast<int64_t>(seen.size()), per_rank * W);
    int64_t repeats = 0;
    for (const auto& r : distinct)
      repeats += static_cast<int64_t>(seen.count(r)) - static_cast<int64_t>(epoch_rows.count(r));
    EXPECT_EQ(repeats, per_rank * W - R) << W << " ranks";
  }
}
INSTANTIATE_TEST_SUITE_P(Layouts, RanksCoverEpoch,
                         ::testing::Values("packing = false\n", "packing = true\n",
                                           "packing = true\nsplit_documents = true\n"));

TEST(CachedSsd, RanksSeeDisjointDocuments) {
  std::string dir = temp_dir("ranks_docs");
  write_file(dir + "/d.jsonl", text_jsonl(24));
  std::set<std::string> all;
  for (int k = 0; k < 3; ++k) {
    Source s(dir, "sources = [\"d.jsonl\"]\npacking = false\n", 24, 2, k, 3);
    s.open();
    for (int i = 0; i < 4; ++i) {
      Flat f = flat(s.src->next());
      for (size_t r = 0; r < f.ids.size(); ++r)
        for (auto& d : docs_in_row(f.ids[r], f.pos[r]))
          EXPECT_TRUE(all.insert(d).second) << d << " seen twice";
    }
  }
  EXPECT_EQ(all.size(), 24u);
}

TEST(CachedSsd, SeekToCursorResumesExactly) {
  std::string dir = temp_dir("seek");
  write_file(dir + "/d.jsonl", text_jsonl(30));
  for (const char* extra : {"", "prefetch_batches = 0\n", "split_documents = true\n"}) {
    const std::string toml = std::string("sources = [\"d.jsonl\"]\n") + extra;
    Source a(dir, toml, 20, 3, 1, 2);
    a.open();
    std::vector<std::string> cursors;
    std::vector<Flat> batches;
    for (int i = 0; i < 24; ++i) {  // several epochs
      cursors.push_back(a.src->cursor());
      batches.push_back(flat(a.src->next()));
    }
    ASSERT_GE(a.src->epoch(), 2) << extra;
    for (int k : {0, 5, 13, 23}) {
      Source b(dir, toml, 20, 3, 1, 2);
      b.open();
      b.src->next();  // somewhere else first
      b.src->seek(cursors[k]);
      EXPECT_EQ(b.src->cursor(), cursors[k]);
      for (int i = k; i < 24; ++i)
        EXPECT_TRUE(flat(b.src->next()) == batches[i]) << extra << " from " << k << " batch " << i;
    }
    // Seeking backwards on the same object works too.
    a.src->seek(cursors[3]);
    EXPECT_TRUE(flat(a.src->next()) == batches[3]);
  }
}

// ---- the cache --------------------------------------------------------------------------------
TEST(CachedSsd, CacheIsReusedAndRebuiltWhenInputsChange) {
  std::string dir = temp_dir("cache");
  write_file(dir + "/d.jsonl", text_jsonl(20));
  const std::string toml = "sources = [\"d.jsonl\"]\ncache_dir = \"cache\"\n";
  auto count_dirs = [&] {
    int n = 0;
    for (auto& e : std::filesystem::directory_iterator(dir + "/cache"))
      n += e.path().filename().string().rfind("tokens-", 0) == 0;
    return n;
  };
  auto open_and_count = [&](const std::string& t, std::string salt = "") {
    int64_t before = encode_counter();
    Source s(dir, t, 16, 1, 0, 1, 7, salt);
    s.open();
    Flat first = flat(s.src->next());
    return std::make_tuple(s.metric("data_cache_hit"), s.metric("data_tokenized_documents"),
                           encode_counter() - before, first);
  };
  auto [hit0, docs0, enc0, f0] = open_and_count(toml);
  EXPECT_EQ(hit0, 0);
  EXPECT_EQ(docs0, 20);
  EXPECT_EQ(enc0, 20);
  auto [hit1, docs1, enc1, f1] = open_and_count(toml);
  EXPECT_EQ(hit1, 1);
  EXPECT_EQ(docs1, 0);
  EXPECT_EQ(enc1, 0) << "a reused cache must not tokenize";
  EXPECT_TRUE(f0 == f1);
  // Options that do not change the tokens reuse it too.
  EXPECT_EQ(std::get<0>(
                open_and_count(toml + "packing = false\nshuffle = false\nprefetch_batches = 1\n")),
            1);

  // One changed byte in a source: rebuilt (and the stale folder removed).
  std::string text = text_jsonl(20);
  text[text.find("doc-7") + 4] = '8';
  write_file(dir + "/d.jsonl", text);
  auto [hit2, docs2, enc2, f2] = open_and_count(toml);
  EXPECT_EQ(hit2, 0);
  EXPECT_EQ(enc2, 20);
  EXPECT_EQ(count_dirs(), 1);
  EXPECT_EQ(std::get<0>(open_and_count(toml)), 1);
  // Another tokenizer: rebuilt.
  EXPECT_EQ(std::get<0>(open_and_count(toml, "other")), 0);
  // A setting that changes the tokens: rebuilt.
  EXPECT_EQ(std::get<0>(open_and_count(toml + "add_eos = false\n", "other")), 0);
  EXPECT_EQ(std::get<0>(open_and_count(toml + "add_eos = false\n", "other")), 1);
  EXPECT_EQ(count_dirs(), 1);

  // The manifest records what was hashed.
  for (auto& e : std::filesystem::directory_iterator(dir + "/cache")) {
    if (e.path().filename().string().rfind("tokens-", 0) != 0) continue;
    Json m = Json::parse(std::ifstream(e.path() / "manifest.json"));
    EXPECT_EQ(m["inputs"]["tokenizer"], "byte-tokenizer-v1other");
    EXPECT_EQ(m["inputs"]["add_eos"], false);
    EXPECT_EQ(m["inputs"]["sources"][0]["xxh64"].get<std::string>().size(), 16u);
    EXPECT_EQ(m["stats"]["documents"], 20);
  }
}

// ---- bounded waits on the cache lock ----------------------------------------------------------
// A rank whose peer holds the cache lock and never finishes (stuck while building) gives up within
// [cluster] timeout_s (RunContext::timeout) naming the lock file and who holds it; before, it
// waited forever. A holder that shows progress (the builder touches the lock file) is waited for.
TEST(CachedSsd, RankWaitingOnAStuckCacheBuildGivesUpWithinTheTimeout) {
  const std::string dir = temp_dir("stuck-lock");
  write_file(dir + "/d.jsonl", text_jsonl(10));
  const std::string toml = "sources = [\"d.jsonl\"]\ncache_dir = \"cache\"\n";
  const std::string lock = dir + "/cache/.lock";
  auto read_file = [](const std::string& p) {
    std::ifstream in(p);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  {
    Source s0(dir, toml, 16, 1, 0, 2);
    s0.open();  // rank 0 builds: the lock file names it
  }
  const std::string rank0 = "rank 0 (pid " + std::to_string(getpid()) + " on host ";
  EXPECT_EQ(read_file(lock).rfind(rank0, 0), 0u) << read_file(lock);

  // Rank 0 is stuck holding the lock (as while building). Another open file description: it
  // excludes this process's own lock too (flock locks are per open file).
  const int held = ::open(lock.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(held, 0);
  ASSERT_EQ(::flock(held, LOCK_EX), 0);
  Source s1(dir, toml, 16, 1, 1, 2);
  s1.ctx.timeout = std::chrono::milliseconds(1500);
  const auto t0 = std::chrono::steady_clock::now();
  std::string msg;
  try {
    s1.open();
  } catch (const Error& e) {
    msg = e.what();
  }
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  printf("rank 1 gave up after %.2f s (timeout 1.5 s)\n", waited);
  EXPECT_GE(waited, 1.5);
  EXPECT_LT(waited, 1.5 + 1.0);
  EXPECT_NE(msg.find("data cache: rank 1 (pid "), std::string::npos) << msg;
  EXPECT_NE(msg.find("gave up waiting for the lock file " + lock +
                     " after 1.5 s without progress "
                     "([cluster] timeout_s): it is held by " +
                     rank0),
            std::string::npos)
      << msg;

  // The same holder, alive: it touches the lock file every 300 ms for 3 s, then releases it. The
  // waiting rank waits it out (2 x its timeout) and opens the cache.
  std::thread holder([&] {
    for (int i = 0; i < 10; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ::futimens(held, nullptr);
    }
    ::close(held);
  });
  Source s2(dir, toml, 16, 1, 1, 2);
  s2.ctx.timeout = std::chrono::milliseconds(1500);
  const auto t1 = std::chrono::steady_clock::now();
  EXPECT_NO_THROW(s2.open());
  const double waited2 =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t1).count();
  holder.join();
  EXPECT_GE(waited2, 2.9);
  EXPECT_EQ(s2.metric("data_cache_hit"), 1);
}

std::string cache_folder(const std::string& cache_dir) {
  for (auto& e : std::filesystem::directory_iterator(cache_dir))
    if (e.path().filename().string().rfind("tokens-", 0) == 0) return e.path().string();
  return "";
}

TEST(CachedSsd, CorruptShardIsNamed) {
  std::string dir = temp_dir("corrupt");
  write_file(dir + "/d.jsonl", text_jsonl(10));
  const std::string toml = "sources = [\"d.jsonl\"]\ncache_dir = \"cache\"\n";
  {
    Source s(dir, toml, 8, 1);
    s.open();
  }
  const std::string shard = cache_folder(dir + "/cache") + "/shard-00000.bin";
  {
    std::fstream f(shard, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put('\x7f');
  }
  Source s(dir, toml, 8, 1);
  std::string e = message_of([&] { s.open(); });
  EXPECT_NE(e.find(shard), std::string::npos) << e;
  EXPECT_NE(e.find("corrupt"), std::string::npos) << e;

  std::filesystem::resize_file(shard, std::filesystem::file_size(shard) - 9);
  Source t(dir, toml, 8, 1);
  e = message_of([&] { t.open(); });
  EXPECT_NE(e.find(shard), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
}

TEST(CachedSsd, ManyShardsAndThreadsGiveTheSameTokens) {
  std::string dir = temp_dir("shards");
  std::string text;
  for (int i = 0; i < 3000; ++i)
    text += Json{{"text", "doc-" + std::to_string(i) + std::string(i % 300, 'y')}}.dump() + "\n";
  write_file(dir + "/d.jsonl", text);  // ~2 MB of tokens and masks: 3 shards of 1 MB
  Source a(dir, "sources = [\"d.jsonl\"]\ncache_dir = \"c1\"\nbuild_threads = 1\n", 64, 4);
  a.open();
  Source b(dir,
           "sources = [\"d.jsonl\"]\ncache_dir = \"c2\"\nbuild_threads = 3\nshard_size_mb = 1\n",
           64, 4);
  b.open();
  EXPECT_TRUE(take(a, 10) == take(b, 10));
  int shards = 0;
  for (auto& e : std::filesystem::directory_iterator(cache_folder(dir + "/c2")))
    shards += e.path().filename().string().rfind("shard-", 0) == 0;
  EXPECT_GE(shards, 2);
}

// ---- eval split -------------------------------------------------------------------------------
TEST(CachedSsd, EvalSourcesAreSplitAcrossRanksInAFixedOrder) {
  std::string dir = temp_dir("eval");
  write_file(dir + "/train.jsonl", text_jsonl(10));
  std::string ev;
  for (int i = 0; i < 7; ++i) ev += Json{{"text", "doc-eval-" + std::to_string(i)}}.dump() + "\n";
  write_file(dir + "/eval.jsonl", ev);
  const std::string toml =
      "sources = [\"train.jsonl\"]\neval_sources = [\"eval.jsonl\"]\npacking = false\n";
  std::multiset<std::string> seen;
  for (int k = 0; k < 3; ++k) {
    Source s(dir, toml, 16, 2, k, 3);
    s.open();
    ASSERT_TRUE(s.src->has_eval());
    for (int pass = 0; pass < 2; ++pass) {
      s.src->begin_eval();
      int batches = 0;
      while (auto b = s.src->next_eval()) {
        ++batches;
        Flat f = flat(*b);
        if (pass == 0)
          for (size_t r = 0; r < f.ids.size(); ++r)
            for (auto& d : docs_in_row(f.ids[r], f.pos[r])) seen.insert(d);
      }
      EXPECT_EQ(batches, 2) << "rank " << k;  // ceil(ceil(7 / 3) / 2): the same on every rank
    }
  }
  EXPECT_EQ(seen.size(), 7u);
  EXPECT_EQ(std::set<std::string>(seen.begin(), seen.end()).size(), 7u);
}

TEST(CachedSsd, EvalFractionHoldsOutDocumentsNeverTrainedOn) {
  std::string dir = temp_dir("eval_fraction");
  write_file(dir + "/d.jsonl", text_jsonl(50));
  Source s(dir, "sources = [\"d.jsonl\"]\neval_fraction = 0.2\npacking = false\n", 32, 1);
  s.open();
  EXPECT_EQ(s.metric("data_eval_documents"), 10);
  std::set<std::string> train, eval;
  for (int i = 0; i < 40; ++i) {
    Flat f = flat(s.src->next());
    for (auto& d : docs_in_row(f.ids[0], f.pos[0])) train.insert(d);
  }
  s.src->begin_eval();
  while (auto b = s.src->next_eval()) {
    Flat f = flat(*b);
    for (auto& d : docs_in_row(f.ids[0], f.pos[0])) eval.insert(d);
  }
  EXPECT_EQ(train.size(), 40u);
  EXPECT_EQ(eval.size(), 10u);
  for (auto& d : eval) EXPECT_EQ(train.count(d), 0u) << d;
  Source other_seed(dir, "sources = [\"d.jsonl\"]\neval_fraction = 0.2\npacking = false\n", 32, 1,
                    0, 1, 999);
  other_seed.open();
  std::set<std::string> eval2;
  other_seed.src->begin_eval();
  while (auto b = other_seed.src->next_eval()) {
    Flat f = flat(*b);
    for (auto& d : docs_in_row(f.ids[0], f.pos[0])) eval2.insert(d);
  }
  EXPECT_EQ(eval, eval2) << "the held-out documents depend on the data only";
}

TEST(CachedSsd, GlobsAreExpandedInOrder) {
  std::string dir = temp_dir("glob");
  std::filesystem::create_directories(dir + "/parts");
  write_file(dir + "/parts/b.jsonl", R"({"text": "cde"})"
                                     "\n");
  write_file(dir + "/parts/a.jsonl", R"({"text": "ab"})"
                                     "\n");
  Source s(dir, "sources = [\"parts/*.jsonl\"]\nshuffle = false\n", 10, 1);
  s.open();
  EXPECT_EQ(flat(s.src->next()).ids, (Rows{{1, 100, 101, 2, 1, 102, 103, 104, 2, 2}}));
}

// ---- bad input --------------------------------------------------------------------------------
struct BadCase {
  std::string name, files, toml, expect1, expect2;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadInput : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadInput, FailsWithAClearMessage) {
  const BadCase& c = GetParam();
  std::string dir = temp_dir("bad_" + c.name);
  if (!c.files.empty()) write_file(dir + "/bad.jsonl", c.files);
  std::string e = message_of([&] {
    Source s(dir, c.toml, 8, 1);
    s.open();
  });
  EXPECT_NE(e.find(c.expect1), std::string::npos) << e;
  EXPECT_NE(e.find(c.expect2), std::string::npos) << e;
}

const std::string kChat = "format = \"chat\"\nsources = [\"bad.jsonl\"]\n";
const std::string kText = "sources = [\"bad.jsonl\"]\n";
INSTANTIATE_TEST_SUITE_P(
    Cases, BadInput,
    ::testing::Values(
        BadCase{"malformed", "{\"text\": \"ok\"}\n\n{\"text\": \"oops\n{\"text\": \"x\"}\n", kText,
                "bad.jsonl:3:", "malformed JSON"},
        BadCase{"not_object", "[1, 2]\n", kText, "bad.jsonl:1:", "expected a JSON object"},
        // Issue 27: nested 100,000 deep, refused before a value is built (ciuic/json.h).
        BadCase{"deep",
                "{\"text\": \"ok\"}\n{\"text\": " + ciuic_test::nested_arrays(ciuic_test::kDeep) +
                    "}\n",
                kText, "bad.jsonl:2:",
                "JSON nested deeper than 128 levels (arrays and objects) at line 1, column 137"},
        BadCase{"missing_field", "{\"txt\": \"a\"}\n", kText,
                "bad.jsonl:1:", "missing field \"text\""},
        BadCase{"wrong_type", "{\"text\": 3}\n", kText, "bad.jsonl:1:", "must be a string"},
        BadCase{"unknown_role",
                "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}, {\"role\": "
                "\"assistant\", \"content\": \"b\"}]}\n"
                "{\"messages\": [{\"role\": \"robot\", \"content\": \"a\"}]}\n",
                kChat, "bad.jsonl:2:", "unknown role \"robot\""},
        BadCase{"messages_not_array", "{\"messages\": \"hi\"}\n", kChat,
                "bad.jsonl:1:", "must be an array"},
        BadCase{"content_missing", "{\"messages\": [{\"role\": \"user\"}]}\n", kChat,
                "bad.jsonl:1:", "content is missing"},
        BadCase{"empty_file", "\n  \n", kText, "dataset is empty", "bad.jsonl"},
        BadCase{"only_empty_docs", "{\"text\": \"\"}\n", kText, "dataset is empty",
                "1 empty document"},
        BadCase{"missing_file", "", "sources = [\"nope.jsonl\"]\n", "no such file", "nope.jsonl"},
        BadCase{"glob_no_match", "", "sources = [\"data/*.jsonl\"]\n", "matches no file",
                "data/*.jsonl"},
        BadCase{"missing_eval_file", "{\"text\": \"a\"}\n",
                kText + "eval_sources = [\"ev.jsonl\"]\n", "no such file", "ev.jsonl"},
        BadCase{"no_sources_option", "", "format = \"text\"\n", "sources", "required"},
        BadCase{"bad_format", "", kText + "format = \"csv\"\n", "format", "text|chat"},
        BadCase{"both_eval", "{\"text\": \"a\"}\n",
                kText + "eval_sources = [\"bad.jsonl\"]\neval_fraction = 0.1\n", "eval_fraction",
                "not both"},
        BadCase{"recipe_location", "", "sources = [\"nope.jsonl\"]\n",
                "recipe.toml:1:", "[data] sources"}),
    [](const auto& info) { return info.param.name; });

// Sources are streamed: a FIFO without a writer would block the cache build forever and a device
// would never end; both, and a folder, are refused before anything is read (issue 16 item 3).
TEST(CachedSsd, SpecialFilesAsSourcesAreRefusedAtOnce) {
  const std::string dir = temp_dir("special");
  ASSERT_EQ(::mkfifo((dir + "/pipe.jsonl").c_str(), 0600), 0);
  std::filesystem::create_directories(dir + "/folder.jsonl");
  for (const std::string src : {"pipe.jsonl", "folder.jsonl", "/dev/zero"}) {
    Source s(dir, "sources = [\"" + src + "\"]\n", 8, 1);
    const std::string e = message_of([&] { s.open(); });
    EXPECT_NE(e.find("is not a regular file"), std::string::npos) << src << ": " << e;
    EXPECT_NE(e.find("[data] sources"), std::string::npos) << src << ": " << e;
  }
}

// Error text quotes at most a short, well-formed excerpt of a bad line (issue 16 item 6): an
// unterminated 1 MiB line gives a short message; with on_error = "skip", a line of invalid UTF-8
// is skipped and its quoted excerpt no longer breaks writing the cache manifest.
TEST(CachedSsd, BadLinesAreQuotedShortAndAsValidUtf8) {
  const std::string dir = temp_dir("excerpt");
  write_file(dir + "/long.jsonl", "{\"text\": \"" + std::string(1 << 20, 'a') + "\n");
  Source s(dir, "sources = [\"long.jsonl\"]\n", 8, 1);
  const std::string e = message_of([&] { s.open(); });
  EXPECT_NE(e.find("long.jsonl:1: malformed JSON"), std::string::npos) << e.substr(0, 500);
  EXPECT_NE(e.find("bytes in all)"), std::string::npos) << e.substr(0, 500);
  EXPECT_LT(e.size(), 1000u);

  write_file(
      dir + "/utf8.jsonl",
      "{\"text\": \"fine\"}\n{\"text\": \"bad \xff\xfe here\"}\n{\"text\": \"also fine\"}\n");
  Source k(dir, "sources = [\"utf8.jsonl\"]\non_error = \"skip\"\n", 8, 1);
  k.open();
  EXPECT_EQ(k.metric("data_skipped_lines"), 1);
  EXPECT_EQ(k.metric("data_train_documents"), 2);
}

TEST(CachedSsd, SkipModeCountsBadLines) {
  std::string dir = temp_dir("skip");
  write_file(dir + "/d.jsonl",
             "{\"text\": \"doc-1\"}\nnot json\n{\"text\": 5}\n{\"text\": \"doc-2\"}\n");
  Source s(dir, "sources = [\"d.jsonl\"]\non_error = \"skip\"\n", 32, 1);
  s.open();
  EXPECT_EQ(s.metric("data_skipped_lines"), 2);
  EXPECT_EQ(s.metric("data_train_documents"), 2);
}

TEST(CachedSsd, MissingTokenizerOrTemplateAndBadCursor) {
  std::string dir = temp_dir("args");
  write_file(dir + "/d.jsonl", text_jsonl(3));
  Source s(dir, "sources = [\"d.jsonl\"]\n", 8, 1);
  s.args.tokenizer = nullptr;
  EXPECT_NE(message_of([&] { s.open(); }).find("[model] tokenizer"), std::string::npos);
  Source c(dir, "sources = [\"d.jsonl\"]\nformat = \"chat\"\n", 8, 1, 0, 1, 7, "", false);
  EXPECT_NE(message_of([&] { c.open(); }).find("chat template"), std::string::npos);
  Source ok(dir, "sources = [\"d.jsonl\"]\n", 8, 1);
  ok.open();
  std::string e = message_of([&] { ok.src->seek("{\"epoch\": 1}"); });
  EXPECT_NE(e.find("bad cursor"), std::string::npos) << e;
}

}  // namespace
}  // namespace ciuic::testdata
