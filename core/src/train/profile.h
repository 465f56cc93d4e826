// Internal: the step profiler ([log] profile_start_step, profile_steps).
//
// Records `steps` optimizer steps from `start` (1-based) with LibTorch's Kineto profiler (host
// ops; GPU kernels and copies through CUPTI on CUDA) and writes, per rank, into
// <output_dir>/profile/:
//   rank<R>.trace.json   Chrome trace (chrome://tracing, Perfetto), with input shapes
//   rank<R>.txt          per-step GPU time by category (matmul, attention, norm, rope,
//                        activation, loss, optimizer, communication, copies, other), the top
//                        kernels, and the step's wall time, GPU-busy time and gaps
// Rank 0 also logs the table. Off (start == 0) costs nothing. Not thread-safe: the training
// thread calls before_step/after_step around each step. Failures to write are logged as
// warnings; profiling never fails a run.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <ciuic/export.h>

namespace ciuic::train {

// A GPU kernel's category in the table, from its name (the same rules the summary uses).
CIUIC_API std::string kernel_category(const std::string& kernel_name);

class StepProfiler {
 public:
  StepProfiler(int64_t start, int64_t steps, std::string dir, int rank, bool cuda);
  ~StepProfiler();
  StepProfiler(const StepProfiler&) = delete;
  StepProfiler& operator=(const StepProfiler&) = delete;

  // `step` (1-based) is about to run / has just run.
  void before_step(int64_t step);
  void after_step(int64_t step);

 private:
  void finish();
  int64_t start_, steps_;
  std::string dir_;
  int rank_;
  bool cuda_;
  bool active_ = false;
  double t0_ = 0.0;  // wall clock at the window's start (s)
};

}  // namespace ciuic::train
