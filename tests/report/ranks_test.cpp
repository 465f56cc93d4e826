// Per-rank records (report/ranks.h), the straggler rule, their TensorBoard scalars and HTML charts,
// and the --watch view (report/watch.h) on records written here. The expectations are worked out
// by hand from the rule in docs/metrics.md, not from the code.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include <ciuic/error.h>
#include <ciuic/files.h>

#include "report/html_report.h"
#include "report/metrics_log.h"
#include "report/ranks.h"
#include "report/watch.h"

namespace ciuic::report {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

RankFigures figures(int rank, double work, double wait = 0.0) {
  RankFigures f;
  f.rank = rank;
  f.work_s = work;
  f.data_wait_s = wait;
  f.fwd_bwd_s = work - wait;
  return f;
}

TEST(RankFigures, RecordsCarryTheMeasuredFiguresOnly) {
  RankFigures f = figures(2, 0.5, 0.1);
  f.link_bytes_per_s = 1.5e9;
  const json r = f.record(40);
  EXPECT_EQ(r["event"], "rank");
  EXPECT_EQ(r["step"], 40);
  EXPECT_EQ(r["rank"], 2);
  EXPECT_TRUE(r["rank"].is_number_integer());
  EXPECT_DOUBLE_EQ(r["link_bytes_per_s"].get<double>(), 1.5e9);
  EXPECT_FALSE(r.contains("mem_gib")) << "NaN figures (not measured) are left out: " << r.dump();
  EXPECT_FALSE(r.contains("device_busy")) << r.dump();
  const RankFigures back = RankFigures::from_record(r);
  EXPECT_DOUBLE_EQ(back.work_s, 0.5);
  EXPECT_TRUE(std::isnan(back.mem_gib));
  // The exchange vector: one slot per record key, rank first.
  const auto v = f.to_vector();
  ASSERT_EQ(v.size(), rank_figure_keys().size());
  EXPECT_EQ(rank_figure_keys()[0], "rank");
  EXPECT_DOUBLE_EQ(RankFigures::from_vector(v.data()).link_bytes_per_s, 1.5e9);
}

// busy_source travels as a number and is written by name (docs/metrics.md); absent on CPU runs.
TEST(RankFigures, BusySourceIsWrittenByName) {
  RankFigures f = figures(0, 0.5);
  EXPECT_FALSE(f.record(1).contains("busy_source"));
  const std::pair<BusySource, const char*> cases[] = {{BusySource::kNvml, "nvml"},
                                                      {BusySource::kCudaEvents, "cuda_events"},
                                                      {BusySource::kNone, "none"}};
  for (const auto& [s, name] : cases) {
    f.busy_source = static_cast<int>(s);
    const json r = f.record(1);
    EXPECT_EQ(r["busy_source"], name) << r.dump();
    EXPECT_EQ(RankFigures::from_record(r).busy_source, static_cast<int>(s));
    const auto v = f.to_vector();
    EXPECT_EQ(RankFigures::from_vector(v.data()).busy_source, static_cast<int>(s));
  }
}

TEST(Stragglers, ASlowRankIsNamedAfterKLogStepsInARow) {
  // 3 ranks, margin 20 %, 3 log steps in a row; log steps every 10 optimizer steps from step 1.
  StragglerDetector d({.margin = 0.2, .log_steps = 3, .min_excess_s = 0.0}, 1);
  // Rank 2 takes 1.31 s where the others take 1.0: 31 % above the others' median (1.0).
  const std::vector<RankFigures> slow = {figures(0, 1.0), figures(1, 1.0), figures(2, 1.31, 0.4)};
  EXPECT_TRUE(d.update(10, slow).now.empty());
  EXPECT_TRUE(d.update(20, slow).now.empty());
  const auto u = d.update(30, slow);
  ASSERT_EQ(u.now.size(), 1u);
  ASSERT_EQ(u.named.size(), 1u);
  const Straggler& g = u.now[0];
  EXPECT_EQ(g.rank, 2);
  EXPECT_NEAR(g.slower, 0.31, 1e-12);
  EXPECT_EQ(g.steps, 30);       // slow since the interval after step 0
  EXPECT_TRUE(g.data_bound());  // 0.4 of its 0.31 extra seconds are data wait
  EXPECT_EQ(g.describe(),
            "rank 2: 31% slower than the median for 30 steps; waiting on data 0.4 s/step");
  // Still slow: still listed, not named again.
  const auto u4 = d.update(40, slow);
  EXPECT_EQ(u4.now.size(), 1u);
  EXPECT_TRUE(u4.named.empty());
  EXPECT_EQ(u4.now[0].steps, 40);
  // Back in line: recovered, and a new streak starts from scratch.
  const std::vector<RankFigures> even = {figures(0, 1.0), figures(1, 1.0), figures(2, 1.05)};
  const auto u5 = d.update(50, even);
  EXPECT_TRUE(u5.now.empty());
  EXPECT_EQ(u5.recovered, std::vector<int>{2});
  EXPECT_TRUE(d.update(60, slow).now.empty());
}

TEST(Stragglers, AnInterruptedStreakStartsAgainAndTheMarginIsStrict) {
  StragglerDetector d({.margin = 0.5, .log_steps = 2, .min_excess_s = 0.0}, 1);
  const std::vector<RankFigures> slow = {figures(0, 2.0), figures(1, 1.0), figures(2, 1.0),
                                         figures(3, 1.0)};
  const std::vector<RankFigures> edge = {figures(0, 1.5), figures(1, 1.0), figures(2, 1.0),
                                         figures(3, 1.0)};
  EXPECT_TRUE(d.update(1, slow).now.empty());
  EXPECT_TRUE(d.update(2, edge).now.empty());  // exactly +50 %: not above the margin
  EXPECT_TRUE(d.update(3, slow).now.empty());  // the streak began again
  const auto u = d.update(4, slow);
  ASSERT_EQ(u.now.size(), 1u);
  EXPECT_EQ(u.now[0].rank, 0);
  EXPECT_EQ(u.now[0].steps, 2);  // steps 3 and 4
  EXPECT_FALSE(u.now[0].data_bound());
}

TEST(Stragglers, TheMedianIsOfTheOtherRanks) {
  // Two of four ranks slow: for rank 2 the others are {1.0, 1.0, 2.0}, median 1.0 -> slow; the
  // same for rank 3. Rank 0 sees {1.0, 2.0, 2.0}: median 2.0, not slow.
  StragglerDetector d({.margin = 0.2, .log_steps = 1, .min_excess_s = 0.0}, 1);
  const auto u = d.update(1, {figures(0, 1.0), figures(1, 1.0), figures(2, 2.0), figures(3, 2.0)});
  ASSERT_EQ(u.now.size(), 2u);
  EXPECT_EQ(u.now[0].rank, 2);
  EXPECT_EQ(u.now[1].rank, 3);
  // Off (margin 0), and a jitter of microseconds (under min_excess_s) is never a straggler.
  StragglerDetector off({.margin = 0.0, .log_steps = 1}, 1);
  EXPECT_TRUE(off.update(1, {figures(0, 1.0), figures(1, 9.0)}).now.empty());
  StragglerDetector tiny({.margin = 0.2, .log_steps = 1, .min_excess_s = 0.002}, 1);
  EXPECT_TRUE(
      tiny.update(1, {figures(0, 0.0001), figures(1, 0.0001), figures(2, 0.0009)}).now.empty());
  // A rank without figures is not slow, and does not count for the others.
  RankFigures none;
  none.rank = 2;
  StragglerDetector partial({.margin = 0.2, .log_steps = 1, .min_excess_s = 0.0}, 1);
  const auto p = partial.update(1, {figures(0, 1.0), figures(1, 3.0), none});
  ASSERT_EQ(p.now.size(), 1u);
  EXPECT_EQ(p.now[0].rank, 1);
}

TEST(RankRecords, TensorBoardScalarsAreNamedByRank) {
  int64_t step = 0;
  const auto s = tensorboard_scalars(
      json{{"event", "rank"}, {"step", 7}, {"rank", 3}, {"step_s", 0.25}}, &step);
  EXPECT_EQ(step, 7);
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].first, "rank3/step_s");
  EXPECT_DOUBLE_EQ(s[0].second, 0.25);
}

std::string run_with_ranks(int world, int log_steps, bool with_straggler) {
  std::ostringstream o;
  for (int step = 1; step <= log_steps; ++step) {
    o << json{{"step", step},
              {"max_steps", 100},
              {"loss", 3.0 - 0.1 * step},
              {"tokens", 1000.0 * step},
              {"tokens_per_s", 500.0}}
             .dump()
      << "\n";
    for (int r = 0; r < world; ++r) {
      RankFigures f =
          figures(r, r == 2 && with_straggler ? 0.9 : 0.3, r == 2 && with_straggler ? 0.6 : 0.0);
      f.step_s = 1.0;
      f.mem_gib = 1.0 + r;
      f.link_bytes_per_s = 2.5e9;
      f.device_busy = 0.5;
      f.compute_busy = 0.25;
      f.link_sent_bytes_per_s = 1.5e9;
      f.link_received_bytes_per_s = 1.25e9;
      o << f.record(step).dump() << "\n";
    }
  }
  if (with_straggler)
    o << json{{"event", "straggler"}, {"step", log_steps}, {"rank", 2},
              {"slower", 2.0},        {"steps", 3},        {"data_wait_s", 0.6}}
             .dump()
      << "\n";
  return o.str();
}

TEST(RankFigures, WithoutRankRecordsOnlyTheStragglerFiguresTravel) {
  RankFigures f = figures(1, 0.5, 0.2);
  f.link_bytes_per_s = 3e9;
  const std::vector<double> v = f.to_vector(straggler_figure_keys());
  ASSERT_EQ(v.size(), 3u);  // rank, work_s, data_wait_s
  EXPECT_EQ(v, (std::vector<double>{1.0, 0.5, 0.2}));
  const RankFigures back = RankFigures::from_vector(v.data(), straggler_figure_keys());
  EXPECT_DOUBLE_EQ(back.work_s, 0.5);
  EXPECT_DOUBLE_EQ(back.data_wait_s, 0.2);
  EXPECT_TRUE(std::isnan(back.link_bytes_per_s));
  EXPECT_TRUE(std::isnan(back.fwd_bwd_s));
  EXPECT_THROW(f.to_vector({"rank", "no_such_figure"}), std::logic_error);
}

// Hand-worked ring figures (nccl-tests' bus-bandwidth factors, PERFORMANCE.md there): per rank,
// all-reduce 2(W-1)/W of the buffer, reduce-scatter and all-gather (W-1)/W of the whole
// (W x the shard) buffer, broadcast the buffer once along a chain.
TEST(LinkTraffic, RingBytesSentAndReceivedPerCollective) {
  using C = Collective;
  // All-reduce of 1000 bytes at 4 ranks: 3 reduce-scatter + 3 all-gather hops of 250 bytes = 1500.
  LinkBytes b = ring_link_bytes(C::kAllReduce, 1000, 4, 2);
  EXPECT_DOUBLE_EQ(b.sent, 1500);
  EXPECT_DOUBLE_EQ(b.received, 1500);
  // 8 ranks, 64 MiB fp32 gradient: 2 x 7/8 x 64 MiB = 112 MiB each way.
  EXPECT_DOUBLE_EQ(ring_link_bytes(C::kAllReduce, 64.0 * 1048576, 8, 0).sent, 112.0 * 1048576);
  // Reduce-scatter of a 1200-byte input at 3 ranks (400-byte shards): 2 hops of 400 = 800.
  b = ring_link_bytes(C::kReduceScatter, 1200, 3, 0);
  EXPECT_DOUBLE_EQ(b.sent, 800);
  EXPECT_DOUBLE_EQ(b.received, 800);
  // All-gather of a 100-byte shard at 3 ranks (300-byte output): 2 hops of 100 = 200.
  b = ring_link_bytes(C::kAllGather, 100, 3, 1);
  EXPECT_DOUBLE_EQ(b.sent, 200);
  EXPECT_DOUBLE_EQ(b.received, 200);
  // The ZeRO-2 step at 4 ranks on a 4000-byte gradient: reduce-scatter 4000 in, all-gather 1000
  // in: 3000 + 3000 = what one all-reduce of 4000 moves (2 x 3/4 x 4000).
  EXPECT_DOUBLE_EQ(ring_link_bytes(C::kReduceScatter, 4000, 4, 3).sent +
                       ring_link_bytes(C::kAllGather, 1000, 4, 3).sent,
                   ring_link_bytes(C::kAllReduce, 4000, 4, 3).sent);
  // Broadcast of 64 bytes from rank 1 of 3: chain 1 -> 2 -> 0.
  EXPECT_DOUBLE_EQ(ring_link_bytes(C::kBroadcast, 64, 3, 1, 1).sent, 64);
  EXPECT_DOUBLE_EQ(ring_link_bytes(C::kBroadcast, 64, 3, 1, 1).received, 0);
  EXPECT_DOUBLE_EQ(ring_link_bytes(C::kBroadcast, 64, 3, 2, 1).sent, 64);
  EXPECT_DOUBLE_EQ(ring_link_bytes(C::kBroadcast, 64, 3, 2, 1).received, 64);
  EXPECT_DOUBLE_EQ(ring_link_bytes(C::kBroadcast, 64, 3, 0, 1).sent, 0);
  EXPECT_DOUBLE_EQ(ring_link_bytes(C::kBroadcast, 64, 3, 0, 1).received, 64);
  // One rank moves nothing.
  for (C c : {C::kAllReduce, C::kReduceScatter, C::kAllGather, C::kBroadcast}) {
    EXPECT_EQ(ring_link_bytes(c, 1e6, 1, 0).sent, 0);
    EXPECT_EQ(ring_link_bytes(c, 1e6, 1, 0).received, 0);
  }
}

TEST(RankRecords, TheHtmlReportDrawsOneLinePerRankOrTheirSpread) {
  const std::string html = render_html_report(run_with_ranks(3, 4, true));
  EXPECT_NE(html.find("<h2>Ranks</h2>"), std::string::npos);
  for (const char* title : {"Data wait + forward/backward per rank", "Device memory per rank",
                            "Link traffic per rank", "Device busy per rank"})
    EXPECT_NE(html.find(title), std::string::npos) << title;
  std::smatch m;
  std::string rest = html;
  size_t rank_lines = 0;
  for (const std::regex line("data-label=\"rank [0-9]+\""); std::regex_search(rest, m, line);
       rest = m.suffix())
    ++rank_lines;
  // Charts with data: work, step time, data wait, device busy, compute busy, memory, link traffic,
  // link sent, link received — 3 ranks each.
  EXPECT_EQ(rank_lines, 9u * 3u);
  for (const char* title :
       {"Compute busy per rank (loop timers)", "Link sent per rank", "Link received per rank"})
    EXPECT_NE(html.find(title), std::string::npos) << title;
  EXPECT_NE(html.find("rank 2 200% slower than the median for 3 steps; data wait 0.6 s/step"),
            std::string::npos);
  // 12 ranks: the lowest, median and highest rank instead of 12 lines.
  const std::string wide = render_html_report(run_with_ranks(12, 3, false));
  EXPECT_EQ(wide.find("data-label=\"rank 0\""), std::string::npos);
  EXPECT_NE(wide.find("data-label=\"highest rank\""), std::string::npos);
  // No rank records (an older run): no section.
  EXPECT_EQ(render_html_report("{\"step\": 1, \"loss\": 2.0}\n").find("<h2>Ranks</h2>"),
            std::string::npos);
}

TEST(RankRecords, AHalfWrittenLastLineIsNotCountedAsBad) {
  const std::string text = "{\"step\": 1, \"loss\": 2.0}\n{\"step\": 2, \"lo";
  EXPECT_EQ(render_html_report(text).find("unreadable"), std::string::npos);
  EXPECT_NE(render_html_report(text + "\n").find("1 unreadable lines skipped"), std::string::npos);
}

TEST(Watch, TheFollowerTakesCompleteLinesAsTheyArrive) {
  MetricsFollower f;
  const std::string text = run_with_ranks(3, 2, true);
  // Fed in awkward pieces: a record is taken when its newline arrives.
  for (size_t i = 0; i < text.size(); i += 7) f.feed(text.substr(i, 7));
  const WatchState& s = f.state();
  EXPECT_EQ(s.step, 2);
  EXPECT_EQ(s.max_steps, 100);
  EXPECT_NEAR(s.loss, 2.8, 1e-12);
  EXPECT_EQ(s.ranks.size(), 3u);
  EXPECT_EQ(s.ranks_step, 2);
  EXPECT_EQ(s.stragglers.count(2), 1u);
  EXPECT_TRUE(s.ended.empty());
  const std::string table = watch_table(s, "ciuic-run --watch runs/x");
  // ETA: 98 steps x (2000 tokens / 2 steps) / 500 tokens/s = 196 s.
  EXPECT_NE(table.find("step 2/100 (2%) | loss 2.8000 | 500 tok/s | ETA 3m16s"), std::string::npos)
      << table;
  EXPECT_NE(table.find("rank  mem GiB"), std::string::npos) << table;
  // Rank 2: 3.00 GiB, 50 % device busy, 25 % compute busy, 2.500 GB/s (1.500 sent, 1.250
  // received), work 0.900 s, data 0.600 s, named slow (+200 %).
  EXPECT_TRUE(std::regex_search(table, std::regex("\n   2 +3\\.00 .* 50% +25% +2\\.500 +1\\.500 "
                                                  "+1\\.250 .* 0\\.900 +0\\.600 .*slow \\+200%\n")))
      << table;
  f.feed("{\"event\": \"straggler_recovered\", \"step\": 3, \"rank\": 2}\n");
  f.feed("{\"event\": \"end\", \"steps\": 3, \"elapsed_s\": 75.0}\n");
  EXPECT_EQ(f.state().ended, "end");
  EXPECT_TRUE(f.state().stragglers.empty());
  EXPECT_NE(watch_table(f.state(), "t").find("ended after 1m15s"), std::string::npos);
  // A resumed run appends step records after the end: it is running again.
  f.feed("{\"step\": 4, \"loss\": 1.0}\n");
  EXPECT_TRUE(f.state().ended.empty());
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::path(CIUIC_TEST_TMP) / "report" / name;
  std::error_code ec;
  ciuic::remove_tree(d.string(), ec);
  fs::create_directories(d);
  return d;
}

TEST(Watch, FollowsAFileUntilItsRunEnds) {
  const fs::path dir = fresh_dir("watch_follow");
  const std::string text = run_with_ranks(2, 3, false);
  std::ofstream(dir / "metrics.jsonl") << text.substr(0, text.size() / 2);
  std::atomic<int> alive{1};
  std::thread writer([&] {  // the "run": the rest of its records, then the end, then it exits
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    std::ofstream(dir / "metrics.jsonl", std::ios::app)
        << text.substr(text.size() / 2) << "{\"event\": \"end\"}\n";
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    alive = 0;
  });
  std::ostringstream out;
  WatchOptions o;
  o.interval_s = 0.05;
  o.run_alive = [&] { return alive.load(); };
  EXPECT_EQ(watch(dir.string(), out, o), 0);
  writer.join();
  EXPECT_NE(out.str().find("step 3/100"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("ended"), std::string::npos) << out.str();
  // A run that goes without its end record: exit 1, said so.
  std::ofstream(dir / "metrics.jsonl") << text;
  std::ostringstream crashed;
  o.run_alive = [] { return 0; };
  EXPECT_EQ(watch(dir.string(), crashed, o), 1);
  EXPECT_NE(crashed.str().find("the run stopped without an end record"), std::string::npos)
      << crashed.str();
  // No run at all: a usage error naming the folder, after start_wait_s.
  o.start_wait_s = 0.1;
  try {
    std::ostringstream none;
    watch((dir / "nothing").string(), none, o);
    ADD_FAILURE() << "no error";
  } catch (const UsageError& e) {
    EXPECT_NE(
        std::string(e.what()).find("--watch " + (dir / "nothing").string() + ": no run there"),
        std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ciuic::report
