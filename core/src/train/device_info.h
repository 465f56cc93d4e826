// Internal: what the trainer needs to know about the device it runs on (CUDA parts only in CUDA
// builds; CPU builds report CPU figures).
#pragma once

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

namespace ciuic::train {

struct DeviceInfo {
  std::string name;          // "NVIDIA H200", "cpu"
  double peak_tflops = 0.0;  // dense bf16/fp16 tensor-core peak; 0 = unknown (no MFU)
  uint64_t total_bytes = 0;  // device memory (0 on CPU)
};

// Name and peak of `device`. The peak comes from a table by GPU name (dense bf16, vendor data
// sheets); `override_tflops` > 0 replaces it.
DeviceInfo device_info(c10::Device device, double override_tflops);

// Makes the device make the current stream idle (CUDA); no-op on CPU.
void synchronize(c10::Device device);

struct MemoryStats {
  uint64_t peak_allocated = 0;  // since the last reset
  uint64_t peak_reserved = 0;
  uint64_t allocated = 0;  // now
  uint64_t reserved = 0;   // now
};
// CUDA caching allocator statistics for `device`; on CPU the process's peak resident set (the
// peaks), and `allocated`/`reserved` 0.
MemoryStats memory_stats(c10::Device device);
void reset_peak_memory(c10::Device device);

// The process's resident set in bytes: now (/proc/self/statm; 0 where it cannot be read) and its
// peak (getrusage).
struct HostMemory {
  uint64_t rss = 0, peak_rss = 0;
};
HostMemory host_memory();

// PCI bus id of a CUDA device ("0000:3B:00.0"), for NVML (train/nvml.h); "" on CPU or when the
// runtime cannot say.
std::string pci_bus_id(c10::Device device);

// Makes `device` current for this thread (CUDA), no-op on CPU. Throws Error naming the device
// when it does not exist.
void set_current_device(c10::Device device);
int cuda_device_count();

}  // namespace ciuic::train
