// Placeholder until the launcher lands: single-process runs only.
#include "launch/launch.h"

#include <ciuic/error.h>

namespace ciuic::launch {

std::optional<WorkerEnv> detect_worker_env() { return std::nullopt; }

int launch_and_supervise(const LaunchOptions&) {
  throw Error("multi-process launch is not implemented yet");
}

std::shared_ptr<Store> connect_store(const WorkerEnv& env, std::chrono::milliseconds timeout) {
  if (env.world_size != 1) throw Error("multi-process rendezvous is not implemented yet");
  return make_local_store(timeout);
}

}  // namespace ciuic::launch
