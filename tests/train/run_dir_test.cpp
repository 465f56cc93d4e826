// The run directory claim (checkpoint/run_dir.h) in-process: folders that are files, another
// run's files (refused, or moved aside by --overwrite, never deleted), resumes in place, the run
// lock (another process, a crashed holder, the checkpoint dir shared by two output_dirs, one
// folder for both), and rank 0 deciding for every rank. The same through ciuic-run:
// run_dir_e2e_test.cpp.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include <ciuic/error.h>
#include <ciuic/store.h>

#include "../launch/subprocess.h"
#include "checkpoint/run_dir.h"

namespace fs = std::filesystem;
using ciuic::checkpoint::claim_run_dir;
using ciuic::checkpoint::ClaimOptions;
using ciuic::checkpoint::RunDirClaim;
using ciuic::checkpoint::RunPaths;

namespace {

RunPaths paths_in(const std::string& out, const std::string& ckpt = "") {
  RunPaths p;
  p.output_dir = out;
  p.checkpoint_dir = ckpt.empty() ? out + "/checkpoints" : ckpt;
  p.metrics_file = out + "/metrics.jsonl";
  p.hf_dir = out + "/hf";
  return p;
}

void write(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

// Every file under `dir` (relative path -> content), lock files left out.
std::map<std::string, std::string> snapshot(const std::string& dir) {
  std::map<std::string, std::string> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.is_regular_file() && e.path().filename() != ciuic::checkpoint::kLockFile)
      out[fs::relative(e.path(), dir).string()] = ciuic::testing::read_file(e.path().string());
  return out;
}

// A previous run's files: two checkpoints, metrics, an export.
void previous_run(const RunPaths& p) {
  write(fs::path(p.checkpoint_dir) / "step_00000005/manifest.json", "{\"step\": 5}");
  write(fs::path(p.checkpoint_dir) / "step_00000010/manifest.json", "{\"step\": 10}");
  write(p.metrics_file, "{\"step\": 1}\n");
  write(fs::path(p.hf_dir) / "config.json", "{}");
}

template <class E = ciuic::Error>
std::string error_of(const RunPaths& p, const ClaimOptions& o) {
  try {
    RunDirClaim c = claim_run_dir(p, o);
  } catch (const E& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("wrong exception type: ") + e.what();
  }
  return "(no error)";
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

std::string host() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

}  // namespace

TEST(RunDir, FolderThatIsAFileIsRefusedAtStartNamingIt) {
  const std::string d = ciuic::testing::fresh_dir("rundir-file");
  write(d + "/blocker", "x");
  // [checkpoint] dir is a file.
  std::string e = error_of<ciuic::UsageError>(paths_in(d + "/out", d + "/blocker"), {});
  EXPECT_TRUE(has(e, "[checkpoint] dir " + d + "/blocker is a file, not a folder")) << e;
  // ... or a file is where one of its parents must go.
  e = error_of<ciuic::UsageError>(paths_in(d + "/out", d + "/blocker/ckpt"), {});
  EXPECT_TRUE(has(e, "[checkpoint] dir " + d + "/blocker/ckpt cannot be created: " + d +
                         "/blocker is a file, not a folder"))
      << e;
  // [run] output_dir is a file (then so is its default checkpoint dir's parent).
  e = error_of<ciuic::UsageError>(paths_in(d + "/blocker"), {});
  EXPECT_TRUE(has(e, "[run] output_dir " + d + "/blocker is a file, not a folder")) << e;
  EXPECT_FALSE(fs::exists(d + "/out")) << "nothing is created before the paths are checked";
  EXPECT_EQ(ciuic::testing::read_file(d + "/blocker"), "x");
}

// A folder that cannot be created (here under /proc, refused even to root) is an I/O failure:
// exit code 1, naming the folder and the reason.
TEST(RunDir, FolderThatCannotBeCreatedIsARuntimeErrorNamingIt) {
  try {
    RunDirClaim c = claim_run_dir(paths_in("/proc/ciuic-run-dir-test/out"), {});
    ADD_FAILURE() << "no error";
  } catch (const ciuic::Error& e) {
    EXPECT_EQ(e.exit_code(), ciuic::kExitRuntime) << e.what();
    EXPECT_TRUE(has(e.what(), "cannot create [run] output_dir /proc/ciuic-run-dir-test/out: "))
        << e.what();
  }
}

TEST(RunDir, FreshRunRefusesAnotherRunsFilesAndTouchesNothing) {
  const std::string d = ciuic::testing::fresh_dir("rundir-refuse");
  const RunPaths p = paths_in(d + "/out");
  previous_run(p);
  const auto before = snapshot(d);
  const std::string e = error_of<ciuic::UsageError>(p, {});
  EXPECT_TRUE(has(e, "[run] output_dir " + d +
                         "/out already holds the files of another run: 2 checkpoints in " +
                         p.checkpoint_dir + " (step_00000005, step_00000010), " + p.metrics_file +
                         ", " + p.hf_dir))
      << e;
  for (const char* choice : {"--resume latest|auto", "--set run.output_dir=DIR", "--overwrite",
                             d.c_str(), "/replaced-<date-time>", "nothing is deleted"})
    EXPECT_TRUE(has(e, choice)) << choice << "\n" << e;
  EXPECT_EQ(snapshot(d), before);

  // Each kind of file alone is enough.
  for (const std::string& only : {"ckpt", "metrics", "hf"}) {
    const std::string o = d + "/only-" + only;
    const RunPaths q = paths_in(o);
    if (only == "ckpt") write(fs::path(q.checkpoint_dir) / "step_00000001/x", "x");
    if (only == "metrics") write(q.metrics_file, "{}\n");
    if (only == "hf") write(fs::path(q.hf_dir) / "model.safetensors", "x");
    EXPECT_TRUE(has(error_of<ciuic::UsageError>(q, {}), "already holds the files of another run"))
        << only;
  }
  // What is not another run's: empty metrics, an empty hf/, a crashed save's .tmp-*, replaced-*,
  // the lock file, other files of the user.
  const RunPaths clean = paths_in(d + "/clean");
  write(clean.metrics_file, "");
  fs::create_directories(clean.hf_dir);
  write(fs::path(clean.checkpoint_dir) / ".tmp-step_00000003/x", "x");
  write(fs::path(clean.checkpoint_dir) / "replaced-20260101-000000/step_00000002/x", "x");
  write(d + "/clean/replaced-20260101-000000/metrics.jsonl", "{}\n");
  write(d + "/clean/notes.txt", "mine");
  EXPECT_NO_THROW(claim_run_dir(clean, {}));
}

TEST(RunDir, ResumingInPlaceContinuesThatRunElsewhereIsAFreshStart) {
  const std::string d = ciuic::testing::fresh_dir("rundir-resume");
  const RunPaths p = paths_in(d + "/out");
  previous_run(p);
  for (const std::string& r : {std::string("latest"), std::string("auto"), p.checkpoint_dir,
                               p.checkpoint_dir + "/step_00000005", p.checkpoint_dir + "/"}) {
    EXPECT_TRUE(ciuic::checkpoint::resumes_in_place(r, p.checkpoint_dir)) << r;
    EXPECT_NO_THROW(claim_run_dir(p, {r, false})) << r;
  }
  // A checkpoint of another folder: this folder must be free of another run's files.
  write(d + "/other/checkpoints/step_00000002/manifest.json", "{}");
  EXPECT_FALSE(ciuic::checkpoint::resumes_in_place(d + "/other/checkpoints", p.checkpoint_dir));
  EXPECT_TRUE(
      has(error_of<ciuic::UsageError>(p, {d + "/other/checkpoints", false}), "already holds"))
      << d;
  EXPECT_NO_THROW(claim_run_dir(paths_in(d + "/fresh"), {d + "/other/checkpoints", false}));
  // --overwrite and a resume in place contradict each other.
  EXPECT_TRUE(has(error_of<ciuic::UsageError>(p, {"auto", true}),
                  "--overwrite starts a fresh run, --resume auto"));
}

TEST(RunDir, OverwriteMovesTheOldRunAsideAndDeletesNothing) {
  const std::string d = ciuic::testing::fresh_dir("rundir-overwrite");
  const RunPaths p = paths_in(d + "/out");
  previous_run(p);
  write(d + "/out/notes.txt", "mine");
  const auto before = snapshot(d + "/out");
  std::string replaced;
  {
    RunDirClaim c = claim_run_dir(p, {"", true});
    ASSERT_EQ(c.replaced().size(), 1u);
    replaced = c.replaced()[0];
  }
  EXPECT_EQ(fs::path(replaced).parent_path(), fs::path(d + "/out"));
  EXPECT_EQ(fs::path(replaced).filename().string().rfind("replaced-", 0), 0u) << replaced;
  // Everything of the old run is there, byte for byte, at the same relative place.
  auto moved = snapshot(replaced);
  for (const auto& [rel, text] : before) {
    if (rel == "notes.txt") continue;
    EXPECT_EQ(moved[rel], text) << rel;
  }
  EXPECT_EQ(ciuic::testing::read_file(d + "/out/notes.txt"), "mine");  // not the run's: stays
  EXPECT_FALSE(fs::exists(p.metrics_file));
  EXPECT_FALSE(fs::exists(p.hf_dir));
  EXPECT_TRUE(fs::is_directory(p.checkpoint_dir));
  EXPECT_TRUE(fs::is_empty(p.checkpoint_dir) ||
              (fs::exists(fs::path(p.checkpoint_dir) / ciuic::checkpoint::kLockFile)));
  // The folder is now free; a second --overwrite of a new old run gets its own folder.
  previous_run(p);
  RunDirClaim c2 = claim_run_dir(p, {"", true});
  ASSERT_EQ(c2.replaced().size(), 1u);
  EXPECT_NE(c2.replaced()[0], replaced);
  EXPECT_TRUE(fs::exists(replaced + "/checkpoints/step_00000010/manifest.json"));

  // A checkpoint dir outside output_dir: its checkpoints move within it.
  const RunPaths q = paths_in(d + "/out2", d + "/ckpts");
  previous_run(q);
  RunDirClaim c3 = claim_run_dir(q, {"", true});
  ASSERT_EQ(c3.replaced().size(), 2u);
  bool in_ckpt = false;
  for (const auto& r : c3.replaced())
    if (fs::path(r).parent_path() == fs::path(d + "/ckpts")) {
      in_ckpt = true;
      EXPECT_TRUE(fs::exists(r + "/step_00000005/manifest.json")) << r;
    }
  EXPECT_TRUE(in_ckpt);
}

TEST(RunDir, LockRefusesASecondRunNamingPidAndHostAndDiesWithItsHolder) {
  const std::string d = ciuic::testing::fresh_dir("rundir-lock");
  const RunPaths p = paths_in(d + "/out");
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(ready[0]);
    try {
      RunDirClaim c = claim_run_dir(p, {});
      (void)!write(ready[1], "1", 1);
      for (;;) pause();
    } catch (...) {
      _exit(3);
    }
  }
  close(ready[1]);
  char b = 0;
  ASSERT_EQ(read(ready[0], &b, 1), 1) << "the child could not claim the folder";
  close(ready[0]);
  const std::string e = error_of(p, {"auto", false});
  EXPECT_TRUE(has(e, "[run] output_dir " + d + "/out is in use by another run: ciuic-run pid " +
                         std::to_string(child) + " on host " + host() + ", started "))
      << e;
  EXPECT_TRUE(has(e, "lock file " + d + "/out/.ciuic-run.lock")) << e;
  // The holder crashes (SIGKILL): the kernel drops its lock; nothing stale remains.
  kill(child, SIGKILL);
  int st;
  waitpid(child, &st, 0);
  RunDirClaim mine = claim_run_dir(p, {"auto", false});
  EXPECT_EQ(mine.lock_files().size(), 2u);  // output_dir and the checkpoint dir
  // In one process too: a second claim is refused until the first is released.
  EXPECT_TRUE(has(error_of(p, {"auto", false}), "ciuic-run pid " + std::to_string(getpid())));
  mine.release();
  EXPECT_NO_THROW(claim_run_dir(p, {"auto", false}));
}

TEST(RunDir, CheckpointDirSharedByTwoOutputDirsIsLocked) {
  const std::string d = ciuic::testing::fresh_dir("rundir-shared");
  RunDirClaim a = claim_run_dir(paths_in(d + "/a", d + "/ckpts"), {});
  const std::string e = error_of(paths_in(d + "/b", d + "/ckpts"), {"auto", false});
  EXPECT_TRUE(has(e, "[checkpoint] dir " + d + "/ckpts is in use by another run")) << e;
  // One folder for both: one lock, no deadlock with itself.
  RunDirClaim same = claim_run_dir(paths_in(d + "/c", d + "/c"), {});
  EXPECT_EQ(same.lock_files().size(), 1u);
}

// Workers of another launcher: rank 0 decides, every rank fails the same way (exit code
// included) instead of training or waiting for a rank 0 that left.
TEST(RunDir, RankZeroDecidesForEveryRank) {
  const std::string d = ciuic::testing::fresh_dir("rundir-ranks");
  const RunPaths p = paths_in(d + "/out");
  previous_run(p);
  auto store = ciuic::make_local_store(std::chrono::seconds(20));
  ciuic::RunContext r0, r1;
  r0.store = r1.store = store;
  r0.world_size = r1.world_size = 2;
  r1.rank = 1;
  std::string e1;
  int code1 = 0;
  std::thread t([&] {
    try {
      claim_run_dir(p, {}, r1);
    } catch (const ciuic::Error& e) {
      e1 = e.what();
      code1 = e.exit_code();
    }
  });
  std::string e0;
  try {
    claim_run_dir(p, {}, r0);
  } catch (const ciuic::Error& e) {
    e0 = e.what();
  }
  t.join();
  EXPECT_TRUE(has(e0, "already holds the files of another run")) << e0;
  EXPECT_EQ(e1, e0);
  EXPECT_EQ(code1, ciuic::kExitUsage);
}
