// Several processes (data_probe) opening one cold cache at once: exactly one tokenizes, the
// others wait and read the same cache; ranks of one world read disjoint rows.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <spawn.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "data_test_support.h"

extern char** environ;

namespace ciuic::testdata {
namespace {

using Json = nlohmann::json;

pid_t spawn(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 2, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  pid_t pid = -1;
  int rc = posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  EXPECT_EQ(rc, 0) << "cannot start " << argv[0];
  return pid;
}

std::string read_all(const std::string& path) {
  std::stringstream s;
  s << std::ifstream(path).rdbuf();
  return s.str();
}

// Runs `n` probes at once (rank i of `world`, or rank 0 of 1 when world == 1); returns their
// outputs. To make sure they really meet at the cold cache, the test holds the cache's lock (as a
// builder would) until every probe has said that it waits for it.
std::vector<Json> run_probes(const std::string& dir, int n, int world, int batches) {
  std::filesystem::create_directories(dir + "/cache");
  // O_CLOEXEC: the probes must not inherit (and so keep holding) the test's lock.
  int lock_fd = ::open((dir + "/cache/.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  EXPECT_EQ(::flock(lock_fd, LOCK_EX), 0);
  std::vector<pid_t> pids;
  for (int i = 0; i < n; ++i)
    pids.push_back(spawn({std::string(CIUIC_BIN_DIR) + "/data_probe", dir, dir + "/data.toml",
                          std::to_string(world == 1 ? 0 : i), std::to_string(world),
                          std::to_string(batches), dir + "/out" + std::to_string(i) + ".json"},
                         dir + "/log" + std::to_string(i) + ".txt"));
  for (int waited_ms = 0;; waited_ms += 50) {
    int waiting = 0;
    for (int i = 0; i < n; ++i)
      waiting += read_all(dir + "/log" + std::to_string(i) + ".txt").find("waiting for it") !=
                 std::string::npos;
    if (waiting == n) break;
    if (waited_ms > 60000) {
      ADD_FAILURE() << "the probes did not reach the cache lock within 60 s";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::close(lock_fd);  // releases the lock: now they race for the build
  std::vector<Json> out;
  for (int i = 0; i < n; ++i) {
    int status = 0;
    waitpid(pids[i], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "probe " << i << ":\n"
        << read_all(dir + "/log" + std::to_string(i) + ".txt");
    out.push_back(Json::parse(std::ifstream(dir + "/out" + std::to_string(i) + ".json")));
  }
  return out;
}

void make_dataset(const std::string& dir) {
  std::ofstream f(dir + "/d.jsonl");
  for (int i = 0; i < 20000; ++i)
    f << Json{{"text", "doc-" + std::to_string(i) + std::string(i % 97, 'z')}}.dump() << "\n";
  write_file(dir + "/data.toml",
             "sources = [\"d.jsonl\"]\ncache_dir = \"cache\"\nbuild_threads = 1\n");
}

int count_entries(const std::string& dir, const std::string& prefix) {
  int n = 0;
  for (auto& e : std::filesystem::directory_iterator(dir))
    n += e.path().filename().string().rfind(prefix, 0) == 0;
  return n;
}

TEST(DataMultiproc, TwoProcessesBuildAColdCacheOnceAndReadTheSameData) {
  std::string dir = temp_dir("mp_two");
  make_dataset(dir);
  auto out = run_probes(dir, 2, 1, 5);
  ASSERT_EQ(out.size(), 2u);
  EXPECT_EQ(out[0]["data_tokenized_documents"].get<double>() +
                out[1]["data_tokenized_documents"].get<double>(),
            20000);
  EXPECT_EQ(out[0]["data_cache_hit"].get<double>() + out[1]["data_cache_hit"].get<double>(), 1);
  EXPECT_EQ(out[0]["batches"], out[1]["batches"]);
  EXPECT_EQ(count_entries(dir + "/cache", "tokens-"), 1);
  EXPECT_EQ(count_entries(dir + "/cache", ".tmp-"), 0);
}

TEST(DataMultiproc, FourRanksShareOneBuildAndReadDisjointRows) {
  std::string dir = temp_dir("mp_four");
  make_dataset(dir);
  auto out = run_probes(dir, 4, 4, 10);
  ASSERT_EQ(out.size(), 4u);
  double built = 0;
  std::set<Json> rows;
  size_t total = 0;
  for (auto& o : out) {
    built += o["data_tokenized_documents"].get<double>() > 0;
    for (auto& b : o["batches"])
      for (auto& r : b) {
        rows.insert(r);
        ++total;
      }
  }
  EXPECT_EQ(built, 1);
  EXPECT_EQ(total, 4u * 10 * 2);
  EXPECT_EQ(rows.size(), total) << "ranks read the same row";
}

}  // namespace
}  // namespace ciuic::testdata
