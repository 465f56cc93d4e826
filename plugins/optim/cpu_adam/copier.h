// Asynchronous parameter uploads from host staging tiles to the run's device, for the staged
// pipeline.
//
// On CUDA the copies run on a side stream taken from the device's stream pool (so uploads overlap
// the update of the next tile and the compute stream), ordered with events through c10's
// device-generic Stream/Event API — no CUDA headers
// are needed to build this, only a CUDA-enabled LibTorch at run time. On the CPU (the staged
// pipeline forced by `pipeline = "staged"`) every copy is synchronous and tickets are complete
// at once, so the same bookkeeping runs in CPU tests.
//
// Threading: main thread only. Failure: c10 errors from the copies propagate.
#pragma once

#include <cstdint>
#include <deque>
#include <optional>

#include <ATen/core/Tensor.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

namespace ciuic_cpu_adam {

class Copier {
 public:
  explicit Copier(c10::Device device);

  // dst.copy_(src) on the upload stream (after the previous uploads). Returns a ticket for wait().
  int64_t upload(const at::Tensor& dst, const at::Tensor& src);
  // Blocks the calling thread until the copy of `ticket` has completed.
  void wait(int64_t ticket);
  // Makes the device's current stream wait for every upload enqueued so far (no host blocking).
  void current_stream_waits_for_uploads();
  // Forgets completed tickets (call when no ticket is outstanding).
  void reset();

 private:
  int64_t record(const c10::Stream& stream);

  c10::Device device_;
  bool async_;
  std::optional<c10::Stream> up_;
  std::deque<c10::Event> events_;  // ticket i = events_[i - first_]
  int64_t first_ = 0;
  int64_t next_ = 0;
};

}  // namespace ciuic_cpu_adam
