// Internal: this rank's figures at a log step (report/ranks.h's RankFigures), measured where the
// trainer runs: device memory (the CUDA caching allocator), the device's busy fraction (NVML,
// train/nvml.h), the comm plugin's traffic over the interval (Comm::counters), host memory, data
// wait and the step's phases as the loop timed them.
//
// Rates and fractions are over the interval since the previous sample() (the first: since
// begin()). Not thread-safe: the training thread owns it. Costs at a log step: one NVML query, a
// read of /proc/self/statm, the allocator's counters — microseconds; nothing at other steps.
#pragma once

#include <chrono>
#include <cstdint>

#include <ciuic/comm.h>

#include "report/ranks.h"
#include "train/comm_traffic.h"
#include "train/event_busy.h"
#include "train/nvml.h"

namespace ciuic::train {

struct Run;

class RankMonitor {
 public:
  explicit RankMonitor(const Run& run);
  // Just before the first step: the interval's baselines.
  void begin();

  // What the loop measured for the figures that are not read from a device or a counter.
  struct Timings {
    double step_s = 0;                  // last step
    double data_wait_s = 0;             // sum over the steps of the interval
    int64_t steps = 0;                  // steps of the interval
    double fwd_bwd_s = 0, optim_s = 0;  // last step (timed)
    double optim_step_s = NAN;          // the optimizer plugin's own figure, when it reports one
    // Of the last step, time in the loop's collectives (comm_wait_s): the label-count agreement
    // after the data, the norm (finishing the reductions + its all-reduce, inside optim_s), the
    // sharding's publish when it reports one (step_publish_s, inside optim_s; NaN: none).
    double agree_s = 0, norm_s = 0, publish_s = NAN;
  };
  report::RankFigures sample(const Timings& t);
  // Around each step's compute (forward/backward and the optimizer step): the brackets of the
  // CUDA-event busy fraction (train/event_busy.h), used where NVML gives no figure. No-ops on CPU.
  void compute_begin() { events_.begin(); }
  void compute_end() { events_.end(); }

 private:
  const Run& r_;
  DeviceBusyMeter busy_;
  EventBusyMeter events_;  // the fallback: on every CUDA device, two events a step
  CommCounters last_counters_;
  const TrafficComm*
      traffic_;  // the Run's Comm as the core wraps it (null: not wrapped, no direction split)
  TrafficComm::Traffic last_traffic_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace ciuic::train
