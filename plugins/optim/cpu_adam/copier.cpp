#include "copier.h"

#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace ciuic_cpu_adam {

Copier::Copier(c10::Device device) : device_(device), async_(!device.is_cpu()) {
  if (async_) {
    c10::impl::VirtualGuardImpl impl(device.type());
    up_ = impl.getStreamFromGlobalPool(device, /*isHighPriority=*/false);
  }
}

int64_t Copier::record(const c10::Stream& stream) {
  events_.emplace_back(device_.type());
  events_.back().record(stream);
  return next_++;
}

int64_t Copier::upload(const at::Tensor& dst, const at::Tensor& src) {
  if (!async_) {
    dst.copy_(src);
    return next_++;
  }
  c10::StreamGuard guard(*up_);
  dst.copy_(src, /*non_blocking=*/true);
  return record(*up_);
}

void Copier::wait(int64_t ticket) {
  if (!async_ || ticket < first_) return;
  events_.at(static_cast<size_t>(ticket - first_)).synchronize();
}

void Copier::current_stream_waits_for_uploads() {
  if (!async_) return;
  c10::impl::VirtualGuardImpl impl(device_.type());
  c10::Event done(device_.type());
  done.record(*up_);
  done.block(impl.getStream(device_));
}

void Copier::reset() {
  first_ = next_;
  events_.clear();
}

}  // namespace ciuic_cpu_adam
