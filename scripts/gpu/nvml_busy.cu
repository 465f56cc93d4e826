// The device busy meter (core/src/train/nvml.{h,cpp}) against a known pattern on a real GPU:
// a kernel that spins for `busy` seconds, then the GPU idle for as long, three times. The meter
// must read nearly 1 over each busy window and nearly 0 over each idle one. Built and run by
// scripts/gpu/nvml_busy.sh (nvcc, no ciuic build needed); exits 0 when every window is right,
// 1 otherwise, 77 when there is no GPU or no NVML.
#include <cuda_runtime.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <thread>

#include "train/nvml.h"

__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  char pci[32] = {};
  cudaDeviceGetPCIBusId(pci, sizeof pci, 0);
  ciuic::train::DeviceBusyMeter meter(pci);
  if (!meter.available()) {
    std::printf("no NVML: %s (skipped)\n", meter.why_unavailable().c_str());
    return 77;
  }
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  const double busy_s = 2.0;
  bool ok = true;
  for (int round = 0; round < 3; ++round) {
    meter.busy_since_last();
    // One block per SM would be enough: NVML counts the time any kernel runs.
    spin<<<1, 1>>>(static_cast<long long>(busy_s * clock_khz * 1e3));
    cudaDeviceSynchronize();
    const double busy = meter.busy_since_last();
    std::this_thread::sleep_for(std::chrono::duration<double>(busy_s));
    const double idle = meter.busy_since_last();
    std::printf("round %d: busy window %.3f, idle window %.3f\n", round, busy, idle);
    ok = ok && std::isfinite(busy) && busy > 0.8 && std::isfinite(idle) && idle < 0.1;
  }
  std::printf("%s (pci %s)\n", ok ? "PASS" : "FAIL", pci);
  return ok ? 0 : 1;
}
