// run_ranks (ranks.h): the forked world of the comm and sharding checks.
#include "ranks.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <vector>

#include <ATen/Parallel.h>
#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "launch/launch.h"

namespace ciuic::conformance {
namespace {

using namespace std::chrono_literals;

// The child: rank `rank` of `world` against the store at 127.0.0.1:`port`. Writes its failures,
// one per line, to `fd`; returns the exit code.
int child(const RankBody& body, int rank, int world, int port, int fd) {
  Lines lines;
  try {
    at::set_num_threads(1);
    launch::WorkerEnv env;
    env.rank = env.local_rank = rank;
    env.world_size = env.local_world_size = world;
    env.master_addr = "127.0.0.1";
    env.master_port = port;
    env.store_hosted_by_launcher = true;
    std::shared_ptr<Store> store = launch::connect_store(env, 60s);
    body(rank, world, port, store, lines);
  } catch (const std::exception& e) {
    lines.add("rank " + std::to_string(rank) + " of " + std::to_string(world) + ": " + e.what());
  }
  const std::string text = lines.text();
  for (size_t at = 0; at < text.size();) {
    const ssize_t n = ::write(fd, text.data() + at, text.size() - at);
    if (n <= 0) break;
    at += static_cast<size_t>(n);
  }
  return lines.empty() ? 0 : 1;
}

}  // namespace

void run_ranks(int world, std::chrono::seconds limit, const RankBody& body) {
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  std::vector<int> fds, port_fds;
  for (int r = 0; r < world; ++r) {
    int p[2], q[2];
    ASSERT_EQ(::pipe(p), 0);
    ASSERT_EQ(::pipe(q), 0);
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0) << "fork failed";
    if (pid == 0) {
      ::close(p[0]);
      ::close(q[1]);
      int port = 0;
      const bool got = ::read(q[0], &port, sizeof port) == static_cast<ssize_t>(sizeof port);
      const int code = got ? child(body, r, world, port, p[1]) : 1;
      std::fflush(nullptr);
      ::_exit(code);
    }
    ::close(p[1]);
    ::close(q[0]);
    pids.push_back(pid);
    fds.push_back(p[0]);
    port_fds.push_back(q[1]);
  }
  c10d::TCPStoreOptions so;
  so.port = 0;
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = 60s;
  auto server = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
  const int port = server->getPort();
  for (int fd : port_fds) {
    if (::write(fd, &port, sizeof port) != static_cast<ssize_t>(sizeof port))
      ADD_FAILURE() << "cannot reach a rank";
    ::close(fd);
  }
  // Collect each rank's lines and exit status until `limit` for the whole world, then kill.
  const auto deadline = std::chrono::steady_clock::now() + limit;
  std::vector<std::string> text(world);
  std::vector<bool> open(world, true);
  for (int left = world; left > 0;) {
    std::vector<pollfd> pfd;
    for (int r = 0; r < world; ++r)
      if (open[r]) pfd.push_back({fds[r], POLLIN, 0});
    const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (ms.count() <= 0 || ::poll(pfd.data(), pfd.size(), static_cast<int>(ms.count())) <= 0) break;
    for (const auto& p : pfd) {
      if (!(p.revents & (POLLIN | POLLHUP))) continue;
      const int r = static_cast<int>(std::find(fds.begin(), fds.end(), p.fd) - fds.begin());
      char buf[4096];
      const ssize_t n = ::read(p.fd, buf, sizeof buf);
      if (n > 0) {
        text[r].append(buf, static_cast<size_t>(n));
      } else {
        open[r] = false;
        --left;
      }
    }
  }
  for (int r = 0; r < world; ++r) {
    int status = 0;
    if (open[r]) {
      ADD_FAILURE() << "rank " << r << " of " << world << " did not finish within " << limit.count()
                    << " s (killed)";
      ::kill(pids[r], SIGKILL);
    }
    ::waitpid(pids[r], &status, 0);
    ::close(fds[r]);
    if (!text[r].empty()) {
      ADD_FAILURE() << text[r];
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ADD_FAILURE() << "rank " << r << " of " << world << " ended with "
                    << (WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                                            : "exit code " + std::to_string(WEXITSTATUS(status)));
    }
  }
}

}  // namespace ciuic::conformance
