// ciuic/context.h — what a worker process knows about the run, handed to every plugin.
//
// Filled by the core before any plugin is created and immutable afterwards; plugins may keep a
// reference for their whole life (the context outlives them). Rank numbering follows torchrun:
// rank = node_rank * local_world_size + local_rank.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include <c10/core/Device.h>

#include <ciuic/store.h>

namespace ciuic {

struct RunContext {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node_rank = 0;
  int num_nodes = 1;

  // The device this rank computes on: cpu, or cuda:<local_rank> (already made current).
  c10::Device device{c10::kCPU};

  // Rendezvous address (MASTER_ADDR/MASTER_PORT) and the timeout for rendezvous and collectives.
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::chrono::milliseconds timeout{std::chrono::minutes(10)};
  // Shared key-value store; never null.
  std::shared_ptr<Store> store;

  std::string run_name;
  std::string output_dir;  // [run] output_dir, created; plugins may write below it
  std::string recipe_dir;  // folder of the top-level recipe: base for relative paths
  uint64_t seed = 0;       // [run] seed
  int cpu_threads = 1;     // CPU cores this rank may use (host cores / local ranks)
};

}  // namespace ciuic
