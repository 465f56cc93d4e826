// Monitoring through build/bin/ciuic-run on 3 CPU ranks (gloo): every rank's own record at each
// log step, checked against the counters rank 0 reports for itself; a rank slowed by the test data
// plugin data/slow named as the straggler, and no other; the [log] keys validated; and
// `ciuic-run --watch` in a pseudo-terminal against a live run, with `--plot` during it.
// Timing-robust on a loaded 2-core machine: sleeps make a rank slow by far more than any jitter,
// and nothing asserts how fast anything is.
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <thread>

#include "../support/pty_child.h"
#include "e2e_support.h"
#include "report/ranks.h"

namespace ciuic::e2e {
namespace {

namespace fs = std::filesystem;
using ciuic::testing::PtyChild;
using nlohmann::json;

const std::string kSlowPlugins = std::string(CIUIC_TEST_PLUGINS) + "/slow";

std::vector<json> records(const Result& r, const std::string& event) {
  std::vector<json> out;
  for (const json& rec : metrics(r))
    if (rec.value("event", "") == event) out.push_back(rec);
  return out;
}

TEST(MonitorE2E, EveryRankWritesItsOwnFiguresAtEachLogStep) {
  const Shape s{.world = 3, .micro = 2, .steps = 6, .sharding = "zero2"};
  const Result r =
      run("ranks3", s, {"--set", "log.every_steps=2", "--set", "log.tensorboard=true"});
  EXPECT_RUN_OK(r);
  std::map<int64_t, json> steps;  // step -> rank 0's step record
  std::map<int64_t, std::map<int64_t, json>> ranks;
  for (const json& rec : metrics(r)) {
    if (!rec.contains("event") && rec.contains("loss")) steps[rec["step"].get<int64_t>()] = rec;
    if (rec.value("event", "") == "rank")
      ranks[rec["step"].get<int64_t>()][rec["rank"].get<int64_t>()] = rec;
  }
  ASSERT_EQ(steps.size(), 3u) << r.log();
  ASSERT_EQ(ranks.size(), 3u) << r.log();
  // The exchange: per rank its loss sum + its 25 figures (docs/metrics.md's table), fp64.
  const size_t row = 26;
  int64_t prev_calls[3] = {0, 0, 0};
  for (const auto& [step, by_rank] : ranks) {
    ASSERT_EQ(by_rank.size(), 3u) << "step " << step;
    const json& mine = steps.at(step);
    EXPECT_EQ(mine["max_steps"], 6);
    EXPECT_TRUE(mine.contains("monitor_s") && mine.contains("monitor_exchange_s")) << mine.dump();
    for (const auto& [rank, rec] : by_rank) {
      for (const char* k :
           {"step_s", "data_wait_s", "fwd_bwd_s", "optim_s", "work_s", "link_bytes_per_s",
            "link_busy", "link_calls_per_s", "comm_calls", "comm_bytes", "host_rss_gib",
            "host_rss_peak_gib", "compute_s", "comm_wait_s", "compute_busy",
            "link_sent_bytes_per_s", "link_received_bytes_per_s"})
        EXPECT_TRUE(rec.contains(k)) << "rank " << rank << " lacks " << k << ": " << rec.dump();
      // A CPU run has no device figures (left out, not zero).
      for (const char* k :
           {"mem_gib", "mem_reserved_gib", "mem_now_gib", "device_busy", "busy_source"})
        EXPECT_FALSE(rec.contains(k)) << rec.dump();
      EXPECT_GT(rec["link_bytes_per_s"].get<double>(), 0.0);
      EXPECT_GT(rec["host_rss_gib"].get<double>(), 0.01);
      EXPECT_NEAR(rec["work_s"].get<double>(),
                  rec["data_wait_s"].get<double>() + rec["fwd_bwd_s"].get<double>(), 1e-9);
      // Busy without NVML: the step less data and collectives, a fraction of the step.
      const double busy = rec["compute_busy"].get<double>(), step_s = rec["step_s"].get<double>();
      EXPECT_GT(busy, 0.0) << rec.dump();
      EXPECT_LE(busy, 1.0) << rec.dump();
      EXPECT_NEAR(busy, rec["compute_s"].get<double>() / step_s, 1e-9) << rec.dump();
      EXPECT_LE(rec["compute_s"].get<double>() + rec["comm_wait_s"].get<double>(), step_s + 1e-9)
          << rec.dump();
      // ZeRO-2 issues symmetric collectives only (reduce-scatter, all-gather, all-reduce): as much
      // sent as received, between (W-1)/W = 2/3 and W-1 = 2 times the input handed over.
      const double sent = rec["link_sent_bytes_per_s"].get<double>(),
                   in = rec["link_bytes_per_s"].get<double>();
      EXPECT_NEAR(sent, rec["link_received_bytes_per_s"].get<double>(), 1e-6 * sent) << rec.dump();
      EXPECT_GE(sent, 2.0 / 3.0 * in * (1 - 1e-9)) << rec.dump();
      EXPECT_LE(sent, 2.0 * in * (1 + 1e-9)) << rec.dump();
      // zero2 issues the same collectives of the same sizes on every rank: each rank's own
      // counters agree with rank 0's.
      EXPECT_EQ(rec["comm_calls"], by_rank.at(0)["comm_calls"])
          << "rank " << rank << " step " << step;
      EXPECT_EQ(rec["comm_bytes"], by_rank.at(0)["comm_bytes"])
          << "rank " << rank << " step " << step;
      EXPECT_GT(rec["comm_calls"].get<int64_t>(), prev_calls[rank]);
      prev_calls[rank] = rec["comm_calls"].get<int64_t>();
    }
    // Rank 0's figures were sampled just before the log step's exchange; its step record's
    // counters just after: one all-reduce of 3 rows of fp64 between them.
    EXPECT_EQ(mine["comm_calls"].get<int64_t>() - by_rank.at(0)["comm_calls"].get<int64_t>(), 1)
        << step;
    EXPECT_EQ(mine["comm_bytes"].get<int64_t>() - by_rank.at(0)["comm_bytes"].get<int64_t>(),
              static_cast<int64_t>(3 * row * sizeof(double)))
        << step;
  }
  // TensorBoard got rank<N>/... scalars: the event file names each rank's tags.
  std::string events;
  for (const auto& f : fs::directory_iterator(r.dir + "/out/tb")) {
    std::ifstream in(f.path(), std::ios::binary);
    events.assign(std::istreambuf_iterator<char>(in), {});
  }
  for (const char* tag : {"rank0/step_s", "rank1/link_bytes_per_s", "rank2/data_wait_s"})
    EXPECT_NE(events.find(tag), std::string::npos) << tag;
  // And the report has the per-rank section.
  std::ifstream html(r.dir + "/out/report.html");
  const std::string report((std::istreambuf_iterator<char>(html)), {});
  EXPECT_NE(report.find("data-label=\"rank 2\""), std::string::npos);
  EXPECT_TRUE(records(r, "straggler").empty()) << "no rank was slowed";
}

TEST(MonitorE2E, ARankSlowedByItsDataIsNamedAsTheStraggler) {
  Shape s{.world = 3, .micro = 2, .steps = 8, .sharding = "ddp"};
  s.data = "plugin = \"slow\"\nvocab_size = 64\nsleep_rank = 2\nsleep_s = 0.3\n";
  s.plugin_paths = {kSlowPlugins};
  const Result r = run("straggler", s,
                       {"--set", "log.straggler_margin=0.5", "--set", "log.straggler_log_steps=3",
                        "--set", "log.progress=\"on\""});
  EXPECT_RUN_OK(r);
  const auto named = records(r, "straggler");
  ASSERT_EQ(named.size(), 1u) << r.log();
  EXPECT_EQ(named[0]["rank"], 2);
  EXPECT_GE(named[0]["step"].get<int64_t>(), 3);  // at the earliest the third log step in a row
  EXPECT_GT(named[0]["data_wait_s"].get<double>(), 0.25);
  // Named in the log, as the rule words it, and on the progress line.
  EXPECT_TRUE(std::regex_search(
      r.err, std::regex("rank 2: [0-9]+% slower than the median for [0-9]+ steps; waiting on "
                        "data 0\\.[0-9]+ s/step")))
      << r.log();
  EXPECT_TRUE(std::regex_search(r.err, std::regex("\\| slow: rank 2 \\+[0-9]+%"))) << r.log();
  // Its own records say why: the data wait is rank 2's alone.
  for (const json& rec : records(r, "rank")) {
    const double wait = rec["data_wait_s"].get<double>();
    if (rec["rank"] == 2)
      EXPECT_GT(wait, 0.25) << rec.dump();
    else
      EXPECT_LT(wait, 0.25) << rec.dump();
    // The busy fraction without NVML: no rank computes for most of a step that sleeps 0.3 s. The
    // ranks that wait for rank 2 wait in the label-count agreement (a collective), rank 2 in its
    // data.
    EXPECT_LT(rec["compute_busy"].get<double>(), 0.6) << rec.dump();
    if (rec["rank"] == 2)
      EXPECT_LT(rec["comm_wait_s"].get<double>(), 0.2) << rec.dump();
    else
      EXPECT_GT(rec["comm_wait_s"].get<double>(), 0.2) << rec.dump();
    // DDP moves its gradients by ring all-reduce only: 2(W-1)/W = 4/3 of the input each way.
    const double in = rec["link_bytes_per_s"].get<double>();
    EXPECT_NEAR(rec["link_sent_bytes_per_s"].get<double>(), 4.0 / 3.0 * in, 1e-6 * in)
        << rec.dump();
    EXPECT_NEAR(rec["link_received_bytes_per_s"].get<double>(), 4.0 / 3.0 * in, 1e-6 * in)
        << rec.dump();
  }
}

// [log] rank_records = false: no "rank" records, no rank<N>/ scalars, no Ranks section, and a
// smaller exchange — only what the straggler rule reads (rank, work_s, data_wait_s), or only the
// loss sums when that rule is off too. The same collectives either way (comm_calls equal); the
// bytes differ by exactly the rows left out, worked out by hand from docs/metrics.md.
TEST(MonitorE2E, RankRecordsFalseLeavesThemOutOfTheExchangeAndEveryOutput) {
  const Shape s{.world = 3, .micro = 2, .steps = 4, .sharding = "zero2"};
  struct Case {
    const char* name;
    std::vector<std::string> set;
    int64_t doubles_per_rank;  // loss sum + exchanged figures
  };
  const std::vector<Case> cases = {
      {"rr-on", {}, 1 + 25},
      {"rr-off", {"--set", "log.rank_records=false"}, 1 + 3},
      {"rr-off-nostrag", {"--set", "log.rank_records=false", "--set", "log.straggler_margin=0"}, 1},
  };
  std::map<std::string, std::map<int64_t, json>> steps;  // case -> step -> step record
  for (const Case& c : cases) {
    std::vector<std::string> args = {"--set", "log.every_steps=2", "--set", "log.tensorboard=true"};
    args.insert(args.end(), c.set.begin(), c.set.end());
    const Result r = run(c.name, s, args);
    EXPECT_RUN_OK(r);
    for (const json& rec : metrics(r))
      if (!rec.contains("event") && rec.contains("loss"))
        steps[c.name][rec["step"].get<int64_t>()] = rec;
    ASSERT_EQ(steps[c.name].size(), 2u) << c.name << "\n" << r.log();
    const bool on = c.set.empty();
    EXPECT_EQ(records(r, "rank").size(), on ? 3u * 2u : 0u) << c.name;
    std::string events;
    for (const auto& f : fs::directory_iterator(r.dir + "/out/tb")) {
      std::ifstream in(f.path(), std::ios::binary);
      events.append(std::istreambuf_iterator<char>(in), {});
    }
    EXPECT_EQ(events.find("rank0/") != std::string::npos, on) << c.name;
    EXPECT_NE(events.find("train/loss"), std::string::npos) << c.name;
    std::ifstream html(r.dir + "/out/report.html");
    const std::string report((std::istreambuf_iterator<char>(html)), {});
    EXPECT_EQ(report.find("<h2>Ranks</h2>") != std::string::npos, on) << c.name;
  }
  // Step 2's record counts one exchange, step 4's two: 3 ranks x the doubles left out x 8 bytes
  // each.
  for (const int64_t step : {2, 4}) {
    const int64_t exchanges = step / 2;
    for (const Case& c : cases) {
      EXPECT_EQ(steps[c.name][step]["comm_calls"], steps["rr-on"][step]["comm_calls"])
          << c.name << " step " << step;
      const int64_t less = steps["rr-on"][step]["comm_bytes"].get<int64_t>() -
                           steps[c.name][step]["comm_bytes"].get<int64_t>();
      EXPECT_EQ(less, exchanges * 3 * (26 - c.doubles_per_rank) * 8) << c.name << " step " << step;
    }
  }
}

TEST(MonitorE2E, BadStragglerKeysAreUsageErrorsNamingTheKey) {
  for (const auto& [set, key] : std::vector<std::pair<std::string, std::string>>{
           {"log.straggler_margin=-0.1", "straggler_margin"},
           {"log.straggler_margin=\"big\"", "straggler_margin"},
           {"log.straggler_log_steps=0", "straggler_log_steps"},
           {"log.rank_records=1", "rank_records"}}) {
    const Result r =
        run("badkey", Shape{.world = 1, .steps = 1}, {"--set", set, "--print-recipe"}, 60);
    EXPECT_EQ(r.code, 2) << set << "\n" << r.log();
    EXPECT_NE(r.err.find(key), std::string::npos) << set << "\n" << r.log();
  }
}

// ---- --watch in a pseudo-terminal ------------------------------------------------------------

TEST(MonitorE2E, WatchShowsEveryRankOfALiveRunAndExitsWhenItEnds) {
  const std::string dir = ciuic::testing::fresh_dir("e2e-watch");
  Shape s{.world = 3, .micro = 2, .steps = 30, .sharding = "zero2"};
  s.data =
      "plugin = \"slow\"\nvocab_size = 64\nsleep_rank = -1\nsleep_s = 0.15\n";  // >= 4.5 s of steps
  std::ofstream(dir + "/recipe.toml") << recipe_text(s, dir + "/out");
  Child train({std::string(CIUIC_BIN_DIR) + "/ciuic-run", dir + "/recipe.toml", "--plugin-path",
               kSlowPlugins, "--set", "log.every_steps=2"},
              dir + "/train", {"OMP_NUM_THREADS=1"});
  // Started with the run: it waits for the run to appear in the folder.
  PtyChild watch(
      {std::string(CIUIC_BIN_DIR) + "/ciuic-run", "--watch", dir + "/out", "--interval", "0.3"});
  // --plot while the run goes: the report is written from the records so far.
  bool plotted = false;
  std::string plot_err;
  for (int i = 0; i < 600 && !plotted; ++i) {
    std::error_code ec;
    std::ifstream m(dir + "/out/metrics.jsonl");
    const std::string text((std::istreambuf_iterator<char>(m)), {});
    if (text.find("\"event\":\"rank\"") != std::string::npos &&
        text.find("\"event\":\"end\"") == std::string::npos) {
      Child plot({std::string(CIUIC_BIN_DIR) + "/ciuic-run", "--plot", dir + "/out"},
                 dir + "/plot");
      ASSERT_TRUE(plot.wait(std::chrono::seconds(60)));
      plot_err = plot.err();
      ASSERT_EQ(plot.exit_code(), 0) << plot.err();
      std::ifstream html(dir + "/out/report.html");
      const std::string report((std::istreambuf_iterator<char>(html)), {});
      EXPECT_NE(report.find("no end record (the run is still going"), std::string::npos);
      EXPECT_NE(report.find("<h2>Ranks</h2>"), std::string::npos);
      plotted = true;
    }
    if (!plotted) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_TRUE(plotted) << "no rank record before the run ended (too fast to plot during it?)\n"
                       << plot_err;
  ASSERT_TRUE(train.wait(std::chrono::seconds(300))) << train.err();
  EXPECT_EQ(train.exit_code(), 0) << train.err();
  ASSERT_TRUE(watch.run_until_exit(std::chrono::seconds(60))) << watch.out();
  EXPECT_EQ(watch.code(), 0) << watch.out();
  const std::string& out = watch.out();
  EXPECT_NE(out.find("ciuic-run --watch " + dir + "/out"), std::string::npos) << out;
  EXPECT_NE(out.find("rank  mem GiB  resv GiB  busy  comp  link GB/s  sent GB/s  recv GB/s"),
            std::string::npos)
      << out;
  for (const char* rank : {"\n   0 ", "\n   1 ", "\n   2 "})
    EXPECT_NE(out.find(rank), std::string::npos) << "no row for rank" << rank << "\n" << out;
  EXPECT_TRUE(std::regex_search(
      out, std::regex("step [0-9]+/30 \\([0-9]+%\\) \\| loss [0-9.]+ \\| [0-9.k]+ tok/s \\| ETA ")))
      << "no table of a running step\n"
      << out;
  EXPECT_NE(out.find("step 30/30 (100%)"), std::string::npos) << out;
  EXPECT_NE(out.find("ended after"), std::string::npos) << out;
  // Redrawn in place on the terminal, more than once.
  size_t redraws = 0;
  for (size_t at = 0; (at = out.find("\033[H\033[2J", at)) != std::string::npos; ++at) ++redraws;
  EXPECT_GE(redraws, 2u) << out;
}

TEST(MonitorE2E, WatchRefusesABadInterval) {
  const std::string dir = ciuic::testing::fresh_dir("e2e-watch-none");
  Child w({std::string(CIUIC_BIN_DIR) + "/ciuic-run", "--watch", dir, "--interval", "0"},
          dir + "/w");
  ASSERT_TRUE(w.wait(std::chrono::seconds(60)));
  EXPECT_EQ(w.exit_code(), 2);
  EXPECT_NE(w.err().find("--interval"), std::string::npos) << w.err();
}

}  // namespace
}  // namespace ciuic::e2e
