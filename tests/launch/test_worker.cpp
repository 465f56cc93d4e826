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
#include <ciuic/error.h>
#include <ciuic/log.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>

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

  auto store = launch::connect_store(*env, std::chrono::seconds(20));
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
