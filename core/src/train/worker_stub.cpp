// Placeholder until the trainer lands.
#include "train/worker.h"

#include <ciuic/error.h>

namespace ciuic::train {

int run_worker(const Recipe&, const Registry&, const launch::WorkerEnv&, const WorkerOptions&) {
  throw Error("training is not implemented yet");
}

}  // namespace ciuic::train
