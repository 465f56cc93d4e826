// The device busy fraction from CUDA events (train/event_busy.h).
#include "train/event_busy.h"

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#ifdef CIUIC_WITH_CUDA
#include <c10/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace ciuic::train {

#ifdef CIUIC_WITH_CUDA
struct EventBusyMeter::Impl {
  c10::DeviceIndex device = 0;
  // Brackets of the interval: pairs_[0, used) recorded, reused from one interval to the next.
  std::vector<std::pair<c10::cuda::CUDAEvent, c10::cuda::CUDAEvent>> pairs;
  size_t used = 0;
  bool open = false;  // begin() without its end() yet
  std::chrono::steady_clock::time_point last = std::chrono::steady_clock::now();
};
#else
struct EventBusyMeter::Impl {};
#endif

EventBusyMeter::EventBusyMeter() = default;
EventBusyMeter::~EventBusyMeter() = default;
EventBusyMeter::EventBusyMeter(EventBusyMeter&&) noexcept = default;
EventBusyMeter& EventBusyMeter::operator=(EventBusyMeter&&) noexcept = default;

EventBusyMeter::EventBusyMeter(c10::Device device) {
#ifdef CIUIC_WITH_CUDA
  if (device.is_cuda()) {
    impl_ = std::make_unique<Impl>();
    impl_->device = device.index() < 0 ? c10::DeviceIndex(0) : device.index();
  }
#else
  (void)device;
#endif
}

void EventBusyMeter::begin() {
#ifdef CIUIC_WITH_CUDA
  if (!impl_ || impl_->open) return;
  Impl& m = *impl_;
  if (m.used == m.pairs.size())
    m.pairs.emplace_back(c10::cuda::CUDAEvent(cudaEventDefault),  // timing events
                         c10::cuda::CUDAEvent(cudaEventDefault));
  m.pairs[m.used].first.record(c10::cuda::getCurrentCUDAStream(m.device));
  m.open = true;
#endif
}

void EventBusyMeter::end() {
#ifdef CIUIC_WITH_CUDA
  if (!impl_ || !impl_->open) return;
  Impl& m = *impl_;
  m.pairs[m.used].second.record(c10::cuda::getCurrentCUDAStream(m.device));
  m.open = false;
  ++m.used;
#endif
}

double EventBusyMeter::busy_since_last() {
#ifdef CIUIC_WITH_CUDA
  if (!impl_) return NAN;
  Impl& m = *impl_;
  const auto now = std::chrono::steady_clock::now();
  const double wall = std::chrono::duration<double>(now - m.last).count();
  m.last = now;
  const size_t closed = m.used;
  double busy_s = 0;
  if (closed > 0) {
    m.pairs[closed - 1].second.synchronize();  // the stream reached the last end: all are done
    for (size_t i = 0; i < closed; ++i)
      busy_s += m.pairs[i].first.elapsed_time(m.pairs[i].second) / 1e3;  // milliseconds
  }
  if (m.open) std::swap(m.pairs[0], m.pairs[closed]);  // an open bracket goes on in the next one
  m.used = 0;
  if (closed == 0 || !(wall > 0)) return NAN;
  return std::clamp(busy_s / wall, 0.0, 1.0);
#else
  return NAN;
#endif
}

}  // namespace ciuic::train
