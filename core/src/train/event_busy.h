// Internal: the device busy fraction from CUDA events, where NVML (train/nvml.h) is absent or
// gives no figure (docs/metrics.md, `device_busy` and `busy_source`).
//
// The loop brackets each step's compute — the micro-batches' forward and backward and the
// optimizer step — with begin() and end(): two timing events recorded on the current stream, no
// synchronisation. busy_since_last() waits for the last end event, sums end - start over the
// brackets since the previous call and divides by the host's wall time of that interval. What it
// measures is the span the stream spent inside the brackets: kernels, and the gaps between them
// while the host enqueued or the stream waited on another (a collective inside backward) — an
// upper bound on kernel time, which NVML's samples measure instead; data loading, checkpoints and
// evaluation between steps fall outside the brackets and count as idle.
//
// Cost: two cudaEventRecord per step (the events are made once and reused); at a log step one
// cudaEventSynchronize (the timed step has synchronised already) and one elapsed-time query per
// step of the interval. CPU builds and CPU devices: unavailable, every call a no-op.
// Not thread-safe: the training thread owns it.
#pragma once

#include <chrono>
#include <memory>

#include <c10/core/Device.h>

#include <ciuic/export.h>

namespace ciuic::train {

class CIUIC_API EventBusyMeter {
 public:
  EventBusyMeter();  // unavailable
  // Available on a CUDA device in a CUDA build (CIUIC_WITH_CUDA).
  explicit EventBusyMeter(c10::Device device);
  ~EventBusyMeter();
  EventBusyMeter(EventBusyMeter&&) noexcept;
  EventBusyMeter& operator=(EventBusyMeter&&) noexcept;

  bool available() const { return impl_ != nullptr; }
  void begin();  // the start of a compute bracket, on the current stream
  void end();    // its end (an end without a begin is ignored)
  // Sum of the brackets' stream time since the previous call / that interval's wall time, clamped
  // to [0, 1]; NaN when unavailable or when no bracket closed in the interval.
  double busy_since_last();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ciuic::train
