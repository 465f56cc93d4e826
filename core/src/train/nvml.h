// Internal: how busy a GPU was, from NVML — loaded at run time (dlopen of libnvidia-ml.so.1), so
// that a CPU build, or a host without the NVIDIA driver, needs nothing and links nothing.
//
// NVML keeps a ring of GPU utilisation samples (the fraction of each sample period in which a
// kernel ran, about every 1/6 s on recent GPUs); busy_since_last() averages the samples taken
// since the previous call, so a caller that calls it at each log step gets the busy fraction of
// the interval. Where the driver does not keep samples, the utilisation of the last sample period
// is used (nvmlDeviceGetUtilizationRates).
//
// Never throws: every failure (no library, no symbol, a GPU NVML does not see, NVML errors) makes
// the meter unavailable, and why_unavailable() says why. Not thread-safe; one meter per training
// thread. NVML itself is initialised once per process and never shut down (it stays loaded).
#pragma once

#include <cstdint>
#include <string>

#include <ciuic/export.h>

namespace ciuic::train {

class CIUIC_API DeviceBusyMeter {
 public:
  DeviceBusyMeter() = default;  // unavailable
  // The GPU with this PCI bus id ("0000:3B:00.0", as cudaDeviceGetPCIBusId gives it); an empty id
  // (CPU runs) leaves the meter unavailable. `library` is the file dlopen loads (tests point it
  // elsewhere).
  explicit DeviceBusyMeter(const std::string& pci_bus_id,
                           const std::string& library = "libnvidia-ml.so.1");
  bool available() const { return device_ != nullptr; }
  const std::string& why_unavailable() const { return why_; }
  // Mean busy fraction (0..1) of the samples since the previous call (the first call: since the
  // meter was made); NaN when unavailable or when NVML has no new sample.
  double busy_since_last();

 private:
  const void* lib_ = nullptr;  // the loaded NVML (nvml.cpp)
  void* device_ = nullptr;     // nvmlDevice_t
  uint64_t last_seen_us_ = 0;
  bool samples_ = true;  // nvmlDeviceGetSamples works on this GPU
  std::string why_ = "not a CUDA device";
};

}  // namespace ciuic::train
