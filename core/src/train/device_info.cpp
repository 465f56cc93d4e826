#include "train/device_info.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>

#include <ciuic/error.h>

#ifdef CIUIC_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace ciuic::train {

#ifdef CIUIC_WITH_CUDA
namespace {
// Dense bf16 tensor-core TFLOP/s from vendor data sheets (no sparsity).
double table_peak(const std::string& name) {
  struct Row {
    const char* key;
    double tflops;
  };
  static const Row rows[] = {
      {"H200", 989.0},    {"H100 PCIe", 756.0}, {"H100", 989.0}, {"H800", 989.0},
      {"A100", 312.0},    {"A800", 312.0},      {"L40S", 362.0}, {"RTX 4090", 165.2},
      {"RTX 3090", 71.0}, {"A10", 125.0},       {"V100", 125.0},
  };
  for (const auto& r : rows)
    if (name.find(r.key) != std::string::npos) return r.tflops;
  return 0.0;
}
}  // namespace
#endif

DeviceInfo device_info(c10::Device device, double override_tflops) {
  DeviceInfo d;
  if (device.is_cuda()) {
#ifdef CIUIC_WITH_CUDA
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(device.index());
    d.name = p->name;
    d.total_bytes = p->totalGlobalMem;
    d.peak_tflops = table_peak(d.name);
#endif
  } else {
    d.name = "cpu";
  }
  if (override_tflops > 0) d.peak_tflops = override_tflops;
  return d;
}

void synchronize(c10::Device device) {
#ifdef CIUIC_WITH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

MemoryStats memory_stats(c10::Device device) {
  MemoryStats m;
#ifdef CIUIC_WITH_CUDA
  if (device.is_cuda()) {
    auto s = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    m.peak_allocated = s.allocated_bytes[all].peak;
    m.peak_reserved = s.reserved_bytes[all].peak;
    m.allocated = s.allocated_bytes[all].current;
    m.reserved = s.reserved_bytes[all].current;
    return m;
  }
#endif
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  m.peak_allocated = m.peak_reserved = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  return m;
}

void reset_peak_memory(c10::Device device) {
#ifdef CIUIC_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

HostMemory host_memory() {
  HostMemory h;
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  h.peak_rss = static_cast<uint64_t>(ru.ru_maxrss) * 1024;
  if (std::FILE* f = std::fopen("/proc/self/statm", "r")) {
    unsigned long long size = 0, resident = 0;
    if (std::fscanf(f, "%llu %llu", &size, &resident) == 2)
      h.rss = resident * static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    std::fclose(f);
  }
  h.peak_rss = std::max(h.peak_rss, h.rss);  // getrusage and statm count a little differently
  return h;
}

std::string pci_bus_id(c10::Device device) {
#ifdef CIUIC_WITH_CUDA
  if (device.is_cuda()) {
    char id[32] = {};
    if (cudaDeviceGetPCIBusId(id, sizeof id, device.index()) == cudaSuccess) return id;
  }
#endif
  (void)device;
  return "";
}

int cuda_device_count() {
#ifdef CIUIC_WITH_CUDA
  return c10::cuda::device_count();
#else
  return 0;
#endif
}

void set_current_device(c10::Device device) {
  if (!device.is_cuda()) return;
#ifdef CIUIC_WITH_CUDA
  const int n = c10::cuda::device_count();
  if (device.index() >= n)
    throw Error("device " + device.str() + " does not exist: this host has " + std::to_string(n) +
                " CUDA device(s)");
  c10::cuda::set_device(device.index());
#else
  throw UsageError(
      "[cluster] device = \"cuda\" but this build of ciuic has no CUDA support "
      "(configure with CUDA and NCCL present, -DCIUIC_WITH_CUDA=ON)");
#endif
}

}  // namespace ciuic::train
