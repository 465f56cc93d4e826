// A run that does not resume never mixes with or deletes another run's files (issue 18), two runs
// never share a folder at once, and a checkpoint folder that is a file is refused at start (issue
// 16, items 8 and 10) — through build/bin/ciuic-run with CPU workers (gloo), tiny model, few
// steps. The claim's rules in-process: run_dir_test.cpp.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "../launch/subprocess.h"

namespace fs = std::filesystem;
using ciuic::testing::Child;

namespace {

const std::string kBin = std::string(CIUIC_BIN_DIR) + "/ciuic-run";

// A tiny 2-rank run: 10 steps take a few seconds on 2 cores.
std::string recipe_text(const std::string& out, int steps) {
  std::ostringstream r;
  r << "[run]\nname = \"rundir\"\noutput_dir = \"" << out << "\"\nseed = 7\n"
    << "[cluster]\nnproc_per_node = 2\ntimeout_s = 60.0\n"
    << "[model.config]\nhidden_size = 32\nintermediate_size = 64\nnum_hidden_layers = 2\n"
    << "num_attention_heads = 4\nnum_key_value_heads = 2\nvocab_size = 64\n"
    << "max_position_embeddings = 64\n"
    << "[train]\nmicro_batch_size = 2\nseq_len = 32\nmax_steps = " << steps << "\n"
    << "[optimizer]\nlr = 1e-3\n"
    << "[sharding]\nplugin = \"zero2\"\n"
    << "[data]\nplugin = \"synthetic\"\nvocab_size = 64\n"
    << "[checkpoint]\nevery_steps = 5\nkeep_last = 1\nexport_hf = true\nexport_dtype = \"fp32\"\n"
    << "[log]\nprogress = \"off\"\n";
  return r.str();
}

struct Result {
  int code = -1;
  std::string err;
  pid_t pid = 0;
};

int g_n = 0;

// ciuic-run on a recipe with `out` as output_dir, `steps` steps, more arguments.
Result run(const std::string& dir, const std::string& out, int steps,
           const std::vector<std::string>& args = {}, int timeout_s = 180) {
  const std::string recipe = dir + "/recipe" + std::to_string(++g_n) + ".toml";
  std::ofstream(recipe) << recipe_text(out, steps);
  std::vector<std::string> argv = {kBin, recipe};
  argv.insert(argv.end(), args.begin(), args.end());
  Child c(argv, dir + "/log" + std::to_string(g_n), {"OMP_NUM_THREADS=1"});
  Result r;
  r.pid = c.pid();
  if (!c.wait(std::chrono::seconds(timeout_s))) {
    r.err = "timed out\n" + c.err();
    return r;
  }
  r.code = c.exit_code();
  r.err = c.err();
  return r;
}

// Every file under `dir` (relative path -> content), the lock files left out.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != ".ciuic-run.lock")
      out[fs::relative(e.path(), dir).string()] = ciuic::testing::read_file(e.path().string());
  return out;
}

std::vector<std::string> step_folders(const std::string& ckpt_dir) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(ckpt_dir))
    if (e.path().filename().string().rfind("step_", 0) == 0)
      out.push_back(e.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

std::string run_id(const std::string& folder) {
  std::ifstream in(folder + "/trainer.json");
  return nlohmann::json::parse(in).value("run_id", "");
}

std::vector<nlohmann::json> metrics(const std::string& file) {
  std::vector<nlohmann::json> out;
  std::ifstream f(file);
  for (std::string line; std::getline(f, line);)
    if (!line.empty()) out.push_back(nlohmann::json::parse(line));
  return out;
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string host() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

#define ASSERT_RUN_OK(r) ASSERT_EQ((r).code, 0) << (r).err

// The old run of the issue: 10 steps, a checkpoint every 5, keep_last 1 -> step_00000010.
void old_run(const std::string& dir, const std::string& out,
             const std::vector<std::string>& args = {}) {
  const Result a = run(dir, out, 10, args);
  ASSERT_RUN_OK(a);
}

}  // namespace

// The sequence: a 10-step run, then a fresh 5-step run in the same output_dir. It used to
// prune its own checkpoint (the old step_10 looked newer) and fail, its metrics appended to the
// old run's. Now it is refused before any worker starts, and nothing of the old run changes.
TEST(RunDirE2E, FreshRunInAUsedOutputDirIsRefusedAtStartTouchingNothing) {
  const std::string d = ciuic::testing::fresh_dir("rundir-e2e-issue");
  ASSERT_NO_FATAL_FAILURE(old_run(d, d + "/out"));
  const auto before = snapshot(d + "/out");
  ASSERT_EQ(step_folders(d + "/out/checkpoints"), std::vector<std::string>{"step_00000010"});
  const Result r = run(d, d + "/out", 5);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "[run] output_dir " + d +
                             "/out already holds the files of another run: 1 checkpoint in " + d +
                             "/out/checkpoints (step_00000010), " + d + "/out/metrics.jsonl, " + d +
                             "/out/hf"))
      << r.err;
  for (const char* choice : {"--resume latest|auto", "--set run.output_dir=DIR", "--overwrite"})
    EXPECT_TRUE(has(r.err, choice)) << choice << "\n" << r.err;
  EXPECT_FALSE(has(r.err, "started 2 worker")) << r.err;
  EXPECT_EQ(snapshot(d + "/out"), before);
}

// The same second command with --resume auto continues the old run: allowed, and the run keeps
// its lineage (run id), so keep_last prunes the old run's checkpoint once it has a newer one.
TEST(RunDirE2E, ResumeAutoInTheSameOutputDirContinuesThatRun) {
  const std::string d = ciuic::testing::fresh_dir("rundir-e2e-auto");
  ASSERT_NO_FATAL_FAILURE(old_run(d, d + "/out"));
  const std::string id = run_id(d + "/out/checkpoints/step_00000010");
  EXPECT_FALSE(id.empty());
  Result r = run(d, d + "/out", 5, {"--resume", "auto"});
  ASSERT_RUN_OK(r);
  EXPECT_TRUE(has(r.err, "resumed from " + d + "/out/checkpoints/step_00000010 at step 10"))
      << r.err;
  EXPECT_EQ(step_folders(d + "/out/checkpoints"), std::vector<std::string>{"step_00000010"});
  r = run(d, d + "/out", 12, {"--resume", "auto"});
  ASSERT_RUN_OK(r);
  EXPECT_EQ(step_folders(d + "/out/checkpoints"), std::vector<std::string>{"step_00000012"});
  EXPECT_EQ(run_id(d + "/out/checkpoints/step_00000012"), id);
}

// [checkpoint] dir outside output_dir, shared by a second run with another output_dir.
TEST(RunDirE2E, FreshRunInAUsedCheckpointDirIsRefused) {
  const std::string d = ciuic::testing::fresh_dir("rundir-e2e-ckptdir");
  const std::vector<std::string> ck = {"--set", "checkpoint.dir=\"" + d + "/ckpts\""};
  ASSERT_NO_FATAL_FAILURE(old_run(d, d + "/a", ck));
  const auto before = snapshot(d + "/ckpts");
  ASSERT_EQ(step_folders(d + "/ckpts"), std::vector<std::string>{"step_00000010"});
  const Result r = run(d, d + "/b", 5, ck);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "[checkpoint] dir " + d +
                             "/ckpts already holds the files of another run: 1 checkpoint"))
      << r.err;
  EXPECT_TRUE(has(r.err, "--set checkpoint.dir=DIR")) << r.err;
  EXPECT_EQ(snapshot(d + "/ckpts"), before);
  EXPECT_FALSE(fs::exists(d + "/b/metrics.jsonl"));
}

// --overwrite moves the old run into output_dir/replaced-<date-time>/ (byte for byte) and starts
// fresh; the new run's metrics hold only its own steps.
TEST(RunDirE2E, OverwriteMovesTheOldRunAsideAndStartsFresh) {
  const std::string d = ciuic::testing::fresh_dir("rundir-e2e-overwrite");
  ASSERT_NO_FATAL_FAILURE(old_run(d, d + "/out"));
  const auto before = snapshot(d + "/out");
  Result r = run(d, d + "/out", 5, {"--overwrite", "--resume", "auto"});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "--overwrite starts a fresh run, --resume auto continues the run in"))
      << r.err;
  r = run(d, d + "/out", 5, {"--overwrite"});
  ASSERT_RUN_OK(r);
  EXPECT_TRUE(has(r.err, "--overwrite: moved the previous run's files")) << r.err;
  std::vector<std::string> replaced;
  for (const auto& e : fs::directory_iterator(d + "/out"))
    if (e.path().filename().string().rfind("replaced-", 0) == 0)
      replaced.push_back(e.path().string());
  ASSERT_EQ(replaced.size(), 1u);
  EXPECT_EQ(snapshot(replaced[0]), before);
  EXPECT_EQ(step_folders(d + "/out/checkpoints"), std::vector<std::string>{"step_00000005"});
  const auto m = metrics(d + "/out/metrics.jsonl");
  ASSERT_FALSE(m.empty());
  for (const auto& rec : m) EXPECT_LE(rec.value("step", 0), 5) << rec.dump();
  EXPECT_EQ(m.back().value("event", ""), "end");
  EXPECT_EQ(m.back().value("steps", 0), 5);
}

// A second launcher on the output_dir of a running one is refused, naming the holder's pid and
// host; the first run's metrics are not interleaved; the lock goes with the run.
TEST(RunDirE2E, SecondLauncherOnARunningOutputDirIsRefusedNamingPidAndHost) {
  const std::string d = ciuic::testing::fresh_dir("rundir-e2e-lock");
  const std::string recipe = d + "/long.toml";
  std::ofstream(recipe) << recipe_text(d + "/out", 100000);
  Child first({kBin, recipe, "--set", "checkpoint.every_steps=0"}, d + "/first",
              {"OMP_NUM_THREADS=1"});
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  auto training = [&] {  // a step's metrics are written
    std::error_code ec;
    return fs::file_size(d + "/out/metrics.jsonl", ec) > 0 && !ec;
  };
  while (!training() && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(training()) << first.err();
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--resume", "auto"}, std::vector<std::string>{}}) {
    const Result r = run(d, d + "/out", 5, args, 60);
    EXPECT_EQ(r.code, 1) << r.err;
    EXPECT_TRUE(has(r.err, "[run] output_dir " + d +
                               "/out is in use by another run: ciuic-run pid " +
                               std::to_string(first.pid()) + " on host " + host() + ", started "))
        << r.err;
    EXPECT_FALSE(has(r.err, "started 2 worker")) << r.err;
  }
  kill(first.pid(), SIGINT);
  ASSERT_TRUE(first.wait(std::chrono::seconds(60)));
  EXPECT_EQ(first.exit_code(), 130) << first.err();
  int64_t last = 0;
  for (const auto& rec : metrics(d + "/out/metrics.jsonl")) {
    if (!rec.contains("loss")) continue;
    EXPECT_GT(rec["step"].get<int64_t>(), last) << "interleaved metrics";
    last = rec["step"].get<int64_t>();
  }
  // The lock went with the run: the same folder can be resumed now.
  const Result again = run(d, d + "/out", 1, {"--resume", "auto"});
  ASSERT_RUN_OK(again);
}

// Workers started by another launcher (torchrun's variables, rank 0 hosting the store): rank 0
// refuses for the run and the other rank stops with it, promptly, instead of training or waiting.
TEST(RunDirE2E, TorchrunStyleWorkersAreRefusedByRankZero) {
  const std::string d = ciuic::testing::fresh_dir("rundir-e2e-torchrun");
  auto workers = [&](const std::string& out, int steps, const std::string& name) {
    const std::string recipe = d + "/" + name + ".toml";
    std::ofstream(recipe) << recipe_text(out, steps);
    const std::string port = std::to_string(ciuic::testing::free_port());
    std::vector<std::unique_ptr<Child>> w;
    for (int rank = 0; rank < 2; ++rank)
      w.push_back(std::make_unique<Child>(
          std::vector<std::string>{kBin, recipe}, d + "/" + name + std::to_string(rank),
          std::vector<std::string>{"OMP_NUM_THREADS=1", "RANK=" + std::to_string(rank),
                                   "WORLD_SIZE=2", "LOCAL_RANK=" + std::to_string(rank),
                                   "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1",
                                   "MASTER_PORT=" + port},
          std::vector<std::string>{"CIUIC_LAUNCHER", "TORCHELASTIC_USE_AGENT_STORE"}));
    for (auto& c : w) EXPECT_TRUE(c->wait(std::chrono::seconds(120))) << c->err();
    return w;
  };
  // A fresh folder trains; rank 0 held the lock.
  auto ok = workers(d + "/out", 10, "fresh");
  for (auto& c : ok) ASSERT_EQ(c->exit_code(), 0) << c->err();
  EXPECT_TRUE(has(ciuic::testing::read_file(d + "/out/.ciuic-run.lock"),
                  "pid=" + std::to_string(ok[0]->pid())));
  const auto before = snapshot(d + "/out");
  // A fresh run in it again: both ranks refuse with rank 0's message.
  auto refused = workers(d + "/out", 5, "again");
  for (auto& c : refused) {
    EXPECT_EQ(c->exit_code(), 2) << c->err();
    EXPECT_TRUE(has(c->err(), "already holds the files of another run")) << c->err();
    EXPECT_LT(c->seconds(), 30.0);
  }
  EXPECT_EQ(snapshot(d + "/out"), before);
}

// Item 10 of issue 16: a [checkpoint] dir (or output_dir) that is a file is refused at start,
// naming it, not at the first save.
TEST(RunDirE2E, CheckpointDirThatIsAFileIsRefusedAtStart) {
  const std::string d = ciuic::testing::fresh_dir("rundir-e2e-file");
  std::ofstream(d + "/file") << "x";
  Result r = run(d, d + "/out", 5, {"--set", "checkpoint.dir=\"" + d + "/file\""});
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "[checkpoint] dir " + d + "/file is a file, not a folder")) << r.err;
  EXPECT_FALSE(has(r.err, "started 2 worker")) << r.err;
  EXPECT_FALSE(fs::exists(d + "/out/metrics.jsonl"));
  r = run(d, d + "/file", 5);
  EXPECT_EQ(r.code, 2) << r.err;
  EXPECT_TRUE(has(r.err, "[run] output_dir " + d + "/file is a file, not a folder")) << r.err;
  EXPECT_EQ(ciuic::testing::read_file(d + "/file"), "x");
}

// keep_last prunes only this run's lineage: another run's checkpoint (copied in) stays. A run
// resumed from an earlier checkpoint moves the later one of its abandoned history aside (never
// deleted), so that --resume latest continues this run, not the abandoned one.
TEST(RunDirE2E, PruningKeepsOtherLineagesAndLaterCheckpointsAreSetAside) {
  const std::string d = ciuic::testing::fresh_dir("rundir-e2e-lineage");
  ASSERT_NO_FATAL_FAILURE(old_run(d, d + "/out", {"--set", "checkpoint.keep_last=2"}));
  ASSERT_EQ(step_folders(d + "/out/checkpoints"),
            (std::vector<std::string>{"step_00000005", "step_00000010"}));
  const std::string id10 = run_id(d + "/out/checkpoints/step_00000010");
  const Result other = run(d, d + "/other", 3);
  ASSERT_RUN_OK(other);
  fs::copy(d + "/other/checkpoints/step_00000003", d + "/out/checkpoints/step_00000003",
           fs::copy_options::recursive);
  const Result r =
      run(d, d + "/out", 8,
          {"--resume", d + "/out/checkpoints/step_00000005", "--set", "checkpoint.every_steps=1"});
  ASSERT_RUN_OK(r);
  EXPECT_TRUE(has(
      r.err,
      "resumed from step_00000005, an earlier checkpoint than step_00000010: moved those into " +
          d + "/out/checkpoints/replaced-"))
      << r.err;
  EXPECT_EQ(step_folders(d + "/out/checkpoints"),
            (std::vector<std::string>{"step_00000003", "step_00000008"}));
  std::vector<std::string> replaced;
  for (const auto& e : fs::directory_iterator(d + "/out/checkpoints"))
    if (e.path().filename().string().rfind("replaced-", 0) == 0)
      replaced.push_back(e.path().string());
  ASSERT_EQ(replaced.size(), 1u);
  EXPECT_EQ(run_id(replaced[0] + "/step_00000010"), id10);
  EXPECT_EQ(run_id(d + "/out/checkpoints/step_00000008"), id10);
  EXPECT_NE(run_id(d + "/out/checkpoints/step_00000003"), id10);
}
