// ciuic_test_worker: a small worker program for the launcher tests (not the trainer).
//
//   ciuic_test_worker <mode> [args]
// Every mode first detects its environment and writes its pid to $CIUIC_TEST_PIDDIR/<rank>.pid
// (when set). Modes:
//   ok                 rendezvous; ranks exchange rank*rank through the store and check the sum;
//                      prints "rank R of W local L/LW node N/NN launcher X sum S omp T"
//   fail R C           rendezvous; rank R logs an error line and exits with code C; the others
//                      print "waiting" and sleep until signalled
//   sigkill R          rendezvous; rank R kills itself with SIGKILL; the others sleep
//   ignore-term R C    like fail, but the other ranks ignore SIGTERM (they need SIGKILL)
//   noisy R C N        every rank prints N numbered lines; after a rendezvous rank R exits with
//                      code C
//   interrupt          prints "ready" (and writes <rank>.ready), waits for SIGINT/SIGTERM, prints
//                      "rank R got SIG..." and exits 130
//   stubborn           like interrupt, but ignores SIGINT and SIGTERM (only SIGKILL ends it)
//   grandchild         forks a child that sleeps (pid in <rank>.child.pid), then sleeps itself
//   mesh R C           like a comm plugin's connections: rendezvous, then every rank keeps a TCP
//                      connection to rank 0 (rank 0 one to each) and writes <rank>.ready; a rank
//                      whose connection breaks logs "... Connection reset by peer" at error level
//                      and exits 1 (as gloo's peers of a dead rank do). Rank R (-1: none) fails
//                      after 500 ms the way an exception does: it closes its connections first
//                      (unwinding), then, 300 ms later, logs "deliberate failure of rank R" and
//                      exits with code C
//   info-fail R C      rank R logs info and warning lines (and LibTorch-style "[W...]" lines) on
//                      stderr, then exits with code C without an error line; the others sleep
//   errors R C         rank R logs two error lines, "first error of rank R" then "second error of
//                      rank R", and exits with code C; the others sleep
#include <arpa/inet.h>
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "launch/launch.h"

namespace {

volatile sig_atomic_t g_sig = 0;
void on_sig(int s) { g_sig = s; }

void write_pid(int rank, const std::string& suffix, pid_t pid) {
  const char* dir = std::getenv("CIUIC_TEST_PIDDIR");
  if (!dir) return;
  std::string path = std::string(dir) + "/" + std::to_string(rank) + suffix;
  std::ofstream(path + ".tmp") << pid << "\n";
  std::rename((path + ".tmp").c_str(), path.c_str());
}

[[noreturn]] void sleep_forever() {
  for (;;) pause();
}

// The "mesh" mode: connections like a comm plugin's (see the file comment).
int mesh(const ciuic::launch::WorkerEnv& env, ciuic::Store& store, int bad, int code) {
  using namespace ciuic;
  std::vector<std::pair<int, int>> peers;  // (rank, fd)
  if (env.rank == 0) {
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 64) != 0 ||
        getsockname(l, reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw Error("mesh: cannot listen");
    store.set("mesh/port", std::to_string(ntohs(a.sin_port)));
    for (int i = 1; i < env.world_size; ++i) {
      int fd = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
      int32_t from = -1;
      if (fd < 0 || read(fd, &from, sizeof from) != sizeof from) throw Error("mesh: accept failed");
      peers.emplace_back(from, fd);
    }
    close(l);
  } else {
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(std::stoi(store.get("mesh/port"))));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int32_t me = env.rank;
    if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        write(fd, &me, sizeof me) != sizeof me)
      throw Error("mesh: cannot connect to rank 0");
    peers.emplace_back(0, fd);
  }
  write_pid(env.rank, ".ready", getpid());
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    if (env.rank == bad &&
        std::chrono::steady_clock::now() - start > std::chrono::milliseconds(500)) {
      for (auto& p : peers) close(p.second);  // unwinding closes the connections first
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      log_error("deliberate failure of rank " + std::to_string(env.rank));
      return code;
    }
    std::vector<pollfd> pfds;
    for (auto& p : peers) pfds.push_back({p.second, POLLIN, 0});
    if (poll(pfds.data(), pfds.size(), 50) > 0)
      for (size_t i = 0; i < pfds.size(); ++i)
        if (pfds[i].revents) {
          char c;
          if (read(pfds[i].fd, &c, 1) <= 0) {
            log_error("comm test: all_reduce failed: [pair.cc:547] Read error from rank " +
                      std::to_string(peers[i].first) + ": Connection reset by peer");
            return 1;
          }
        }
  }
}

int run(int argc, char** argv) {
  using namespace ciuic;
  if (argc < 2) throw UsageError("usage: ciuic_test_worker <mode> [args]");
  const std::string mode = argv[1];
  auto arg = [&](int i) {
    if (argc <= i) throw UsageError("mode " + mode + " needs more arguments");
    return std::atoi(argv[i]);
  };
  auto env = launch::detect_worker_env();
  if (!env) throw Error("not started by a launcher");
  set_log_rank(env->rank);
  write_pid(env->rank, ".pid", getpid());

  if (mode == "interrupt" || mode == "stubborn") {
    signal(SIGINT, mode == "interrupt" ? on_sig : SIG_IGN);
    signal(SIGTERM, mode == "interrupt" ? on_sig : SIG_IGN);
    write_pid(env->rank, ".ready", getpid());
    printf("ready\n");
    fflush(stdout);
    if (mode == "stubborn") sleep_forever();
    while (!g_sig) pause();
    printf("rank %d got %s\n", env->rank, g_sig == SIGINT ? "SIGINT" : "SIGTERM");
    return kExitInterrupted;
  }
  if (mode == "grandchild") {
    pid_t c = fork();
    if (c == 0) sleep_forever();
    write_pid(env->rank, ".child.pid", c);
    sleep_forever();
  }
  if (mode == "progress") {  // redraws one line on stderr like the trainer's Progress, then a line
    for (int i = 1; i <= 3; ++i) {
      fprintf(stderr, "\r\033[2Kstep %d/3 of rank %d", i, env->rank);
      fflush(stderr);
      usleep(20000);
    }
    fprintf(stderr, "\r\033[2K");
    fflush(stderr);
    fprintf(stderr, "finished rank %d\n", env->rank);
    return 0;
  }
  if (mode == "noisy") {
    int bad = arg(2), code = arg(3), n = arg(4);
    for (int i = 0; i < n; ++i) printf("line %d of rank %d\n", i, env->rank);
    fflush(stdout);
    launch::connect_store(*env, std::chrono::seconds(20));  // everyone has printed
    if (env->rank == bad) return code;
    sleep_forever();
  }

  if (mode == "info-fail" || mode == "errors") {
    const int bad = arg(2), code = arg(3);
    if (env->rank != bad) sleep_forever();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (mode == "errors") {
      log_error("first error of rank " + std::to_string(env->rank));
      log_error("second error of rank " + std::to_string(env->rank));
      return code;
    }
    log_info("loading shard 3 of rank " + std::to_string(env->rank));
    fprintf(stderr, "[W1201 04:42:24.084379125 socket.cpp:469] [c10d] a LibTorch warning\n");
    log_warn("a warning of rank " + std::to_string(env->rank));
    return code;
  }

  auto store = launch::connect_store(*env, std::chrono::seconds(20));
  if (mode == "mesh") return mesh(*env, *store, arg(2), arg(3));
  if (mode == "ok") {
    store->set("val/" + std::to_string(env->rank), std::to_string(env->rank * env->rank));
    long sum = 0;
    for (int r = 0; r < env->world_size; ++r)
      sum += std::stol(store->get("val/" + std::to_string(r)));
    const char* omp = std::getenv("OMP_NUM_THREADS");
    printf("rank %d of %d local %d/%d node %d/%d launcher %s sum %ld omp %s\n", env->rank,
           env->world_size, env->local_rank, env->local_world_size, env->node_rank, env->num_nodes,
           env->launcher.c_str(), sum, omp ? omp : "unset");
    // Leave only when everyone has read every value (rank 0 may host the store).
    store->add("done", 1);
    while (store->add("done", 0) < env->world_size)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    return 0;
  }
  if (mode == "fail" || mode == "sigkill" || mode == "ignore-term") {
    int bad = arg(2);
    if (env->rank == bad) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      if (mode == "sigkill") raise(SIGKILL);
      log_error("deliberate failure of rank " + std::to_string(env->rank));
      return arg(3);
    }
    if (mode == "ignore-term") signal(SIGTERM, SIG_IGN);
    printf("waiting\n");
    fflush(stdout);
    sleep_forever();
  }
  throw UsageError("unknown mode " + mode);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const ciuic::Error& e) {
    ciuic::log_error(e.what());
    return e.exit_code();
  }
}
