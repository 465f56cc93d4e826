// A decode step as a CUDA graph (model/step_graph.h): at::cuda::CUDAGraph around the step, with
// the warm-up on a side stream. Without CUDA (CIUIC_FUSED_KERNELS undefined) capture() declines.
#include "model/step_graph.h"

#include <exception>
#include <utility>

#ifdef CIUIC_FUSED_KERNELS
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace ciuic::model {

#ifdef CIUIC_FUSED_KERNELS

struct StepGraph::Impl {
  c10::Device device;
  at::cuda::CUDAGraph graph;
  explicit Impl(c10::Device d) : device(d) {}
};

bool StepGraph::built() { return true; }

std::unique_ptr<StepGraph> StepGraph::capture(c10::Device device, const std::function<void()>& step,
                                              std::string* why_not) {
  if (!device.is_cuda()) {
    if (why_not) *why_not = "not a CUDA device (" + device.str() + ")";
    return nullptr;
  }
  const c10::cuda::CUDAGuard device_guard(device);
  const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(device.index());
  const c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device.index());
  at::cuda::CUDAEvent before;  // the side stream starts after the work queued so far
  before.record(current);
  before.block(side);
  auto impl = std::make_unique<Impl>(device);
  std::string failure;
  {
    const c10::cuda::CUDAStreamGuard on_side(side);
    step();  // the warm-up is the real step; an error here is the step's own: it propagates
    try {
      impl->graph.capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      try {
        step();
      } catch (...) {
        // End the capture (the stream must leave capture mode), then report the step's error.
        try {
          impl->graph.capture_end();
        } catch (...) {
        }
        throw;
      }
      impl->graph.capture_end();  // also instantiates
    } catch (const std::exception& e) {
      failure = e.what();
    } catch (...) {
      failure = "unknown error";
    }
  }
  at::cuda::CUDAEvent after;  // the current stream's later work sees the warm-up's results
  after.record(side);
  after.block(current);
  if (!failure.empty()) {
    (void)cudaGetLastError();  // a failed capture leaves a non-sticky error behind
    if (why_not) *why_not = "CUDA graph capture failed: " + failure;
    return nullptr;
  }
  return std::unique_ptr<StepGraph>(new StepGraph(std::move(impl)));
}

void StepGraph::replay() {
  const c10::cuda::CUDAGuard device_guard(impl_->device);
  impl_->graph.replay();
}

#else

struct StepGraph::Impl {};

bool StepGraph::built() { return false; }

std::unique_ptr<StepGraph> StepGraph::capture(c10::Device, const std::function<void()>&,
                                              std::string* why_not) {
  if (why_not) *why_not = "this build has no CUDA";
  return nullptr;
}

void StepGraph::replay() {}

#endif

StepGraph::StepGraph(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StepGraph::~StepGraph() = default;

}  // namespace ciuic::model
