// model/step_graph.h — a decode step captured once as a CUDA graph and replayed
// (model/generate.cpp).
//
// The step is a callable that reads and writes only tensors that outlive the graph (static input
// and output buffers on one CUDA device: the token ids, positions and cache slot it reads, the
// KV cache, the logits buffer it fills) and whose shapes and host-side values are the same on
// every call (LlamaModel::decode_step). capture() runs it once for real on a side stream — the
// warm-up: CUDA's lazy kernel loading, cuBLAS workspaces and the allocator's first blocks happen
// outside the capture — then captures it on that stream (nothing runs during capture); replay()
// launches the captured kernels on the current stream, so they see the buffers as the eager work
// queued before them left them. The graph's intermediate tensors live in its own memory pool,
// freed with it.
//
// Only in CUDA builds (CIUIC_FUSED_KERNELS, core/CMakeLists.txt); elsewhere capture() always
// declines. Threading: one thread at a time per StepGraph; capture uses CUDA's thread-local
// capture mode, so other threads' CUDA calls neither fail nor spoil it (they must not use the
// step's buffers). Failure: an error of the warm-up (a real error of the step) propagates; a
// failed capture (an op that cannot be captured) returns null with the reason, after the warm-up
// ran: the step has then run once either way.
#pragma once

#include <functional>
#include <memory>
#include <string>

#include <c10/core/Device.h>

namespace ciuic::model {

class StepGraph {
 public:
  // Whether this build can capture graphs (a CUDA build).
  static bool built();
  // Runs `step` once on a side stream of `device` (ordered after the current stream's work, and
  // before the current stream's later work), then captures it. Null, with *why_not set, when the
  // capture failed or the build has no CUDA (then `step` did not run when !built()).
  static std::unique_ptr<StepGraph> capture(c10::Device device, const std::function<void()>& step,
                                            std::string* why_not);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;
  // Enqueues the captured step on the current stream of the capture's device. Does not wait.
  void replay();

 private:
  struct Impl;
  explicit StepGraph(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ciuic::model
