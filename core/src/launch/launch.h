// Internal: process launch, worker environment and rendezvous (core/src/launch).
//
// `ciuic-run recipe.toml` is its own launcher. When the process was not started by a launcher
// (no RANK/WORLD_SIZE, SLURM_PROCID, OMPI_COMM_WORLD_RANK, ...) it spawns nproc_per_node workers
// (the same executable and arguments, with a torchrun-compatible environment), supervises them
// and returns the run's exit code. Inside a worker, detect_worker_env() describes the process.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <ciuic/store.h>

namespace ciuic::launch {

struct WorkerEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  // The launcher already hosts the TCPStore at master_addr:master_port (torchrun's agent store,
  // or ciuic-run's own launcher); otherwise rank 0 hosts it.
  bool store_hosted_by_launcher = false;
  std::string launcher;  // "ciuic", "torchrun", "slurm", "mpirun", or "none" (single process)
};

// The worker environment of this process, or nullopt when no launcher started it.
std::optional<WorkerEnv> detect_worker_env();

struct LaunchOptions {
  std::vector<std::string> argv;  // the command line to run in each worker (argv[0] = executable)
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;            // 0: pick a free port (single node only)
  bool output_all_ranks = false;  // prefix and show every rank's output, not only rank 0's
  std::chrono::seconds stop_grace{10};
  std::chrono::milliseconds rendezvous_timeout{std::chrono::minutes(10)};
};

// Spawns and supervises the workers of this node; returns the exit code for ciuic-run.
int launch_and_supervise(const LaunchOptions& options);

// Connects this worker to the run's key-value store (a c10d TCPStore client, or the server when
// rank 0 hosts it). Single-process runs (world_size 1, no launcher) get an in-memory store.
std::shared_ptr<Store> connect_store(const WorkerEnv& env, std::chrono::milliseconds timeout);

}  // namespace ciuic::launch
