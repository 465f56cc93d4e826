// cluster.memory_per_device_gib: a cap on the rank's CUDA caching allocator, and the OOM message.
#include <ciuic/error.h>
#include <ciuic/log.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "launch/launch.h"

#ifdef CIUIC_WITH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>
#endif

namespace ciuic::launch {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

std::string gib_str(double bytes) {
  char buf[32];
  snprintf(buf, sizeof buf, "%.2f GiB", bytes / kGiB);
  return buf;
}

#ifdef CIUIC_WITH_CUDA
double device_total_bytes(int device_index) {
  cudaDeviceProp prop{};
  cudaError_t rc = cudaGetDeviceProperties(&prop, device_index);
  if (rc != cudaSuccess)
    throw Error("cannot read the properties of cuda:" + std::to_string(device_index) + ": " +
                cudaGetErrorString(rc));
  return static_cast<double>(prop.totalGlobalMem);
}
#endif

// The allocator setting in force, as "NAME=value" ("" when neither variable is set).
std::string allocator_conf() {
  for (const char* name : {"PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"})
    if (const char* v = std::getenv(name)) return std::string(name) + "=" + v;
  return "";
}

}  // namespace

std::string apply_allocator_defaults() {
  if (std::string conf = allocator_conf(); !conf.empty()) return conf;
  setenv("PYTORCH_CUDA_ALLOC_CONF", kAllocatorDefault, /*overwrite=*/0);
  return allocator_conf();
}

void apply_memory_cap(int device_index, double gib) {
  if (gib <= 0) return;
#ifdef CIUIC_WITH_CUDA
  const double total = device_total_bytes(device_index);
  const double fraction = gib * kGiB / total;
  if (fraction > 1.0)
    throw UsageError("cluster.memory_per_device_gib = " + std::to_string(gib) +
                     " exceeds the memory of cuda:" + std::to_string(device_index) + " (" +
                     gib_str(total) + ")");
  // The caching allocator sets up its per-device state on CUDA's lazy initialisation; the cap
  // may come first (before any tensor exists on the device).
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction,
                                                     static_cast<c10::DeviceIndex>(device_index));
  const std::string conf = allocator_conf();
  log_info("memory cap: the caching allocator of cuda:" + std::to_string(device_index) +
           " may hold at most " + gib_str(gib * kGiB) + " of " + gib_str(total) +
           (conf.empty() ? std::string() : " (" + conf + ")"));
#else
  log_debug("cluster.memory_per_device_gib applies to CUDA devices only; ignored on CPU");
#endif
}

std::string out_of_memory_message(int rank, int device_index, double cap_gib,
                                  std::string_view detail) {
  std::string m = "rank " + std::to_string(rank) + " ran out of memory";
#ifdef CIUIC_WITH_CUDA
  m += " on cuda:" + std::to_string(device_index);
  try {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        static_cast<c10::DeviceIndex>(device_index));
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    m += ": peak allocated " + gib_str(static_cast<double>(stats.allocated_bytes[agg].peak)) +
         ", peak reserved " + gib_str(static_cast<double>(stats.reserved_bytes[agg].peak));
    if (cap_gib > 0) m += ", cap " + gib_str(cap_gib * kGiB) + " (cluster.memory_per_device_gib)";
    m += ", device memory " + gib_str(device_total_bytes(device_index));
  } catch (const std::exception&) {
    if (cap_gib > 0) m += " (cap " + gib_str(cap_gib * kGiB) + ")";
  }
#else
  (void)device_index;
  if (cap_gib > 0) m += " (cap " + gib_str(cap_gib * kGiB) + ")";
#endif
  if (!detail.empty()) m += ": " + std::string(detail);
  return m;
}

}  // namespace ciuic::launch
