// A stand-in for libnvidia-ml.so.1 with the five entry points the busy meter loads
// (train/nvml.cpp), for nvml_test on machines without a GPU: one GPU at PCI 0000:01:00.0 whose
// utilisation samples the test scripts with fake_nvml_push(). Written from NVML's documented
// contract: nvmlDeviceGetSamples returns the samples newer than lastSeenTimeStamp, their count
// when the buffer is null, NVML_ERROR_NOT_FOUND (6) when there are none.
#include <cstring>
#include <vector>

namespace {
struct Sample {
  unsigned long long ts;
  unsigned int value;  // NVML_VALUE_TYPE_UNSIGNED_INT
  unsigned int pad;
};
std::vector<Sample> g_samples;
int g_device;
}  // namespace

extern "C" {
__attribute__((visibility("default"))) void fake_nvml_push(unsigned long long ts,
                                                           unsigned int percent) {
  g_samples.push_back({ts, percent, 0});
}
__attribute__((visibility("default"))) int nvmlInit_v2() { return 0; }
__attribute__((visibility("default"))) const char* nvmlErrorString(int) { return "fake error"; }
__attribute__((visibility("default"))) int nvmlDeviceGetHandleByPciBusId_v2(const char* id,
                                                                            void** dev) {
  if (std::strcmp(id, "0000:01:00.0") != 0) return 6;
  *dev = &g_device;
  return 0;
}
__attribute__((visibility("default"))) int nvmlDeviceGetSamples(void* dev, int type,
                                                                unsigned long long last, int* vtype,
                                                                unsigned int* count, void* out) {
  if (dev != &g_device || type != 1) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  std::vector<Sample> newer;
  for (const Sample& s : g_samples)
    if (s.ts > last) newer.push_back(s);
  if (newer.empty()) return 6;
  *vtype = 1;
  if (!out) {
    *count = static_cast<unsigned int>(newer.size());
    return 0;
  }
  const size_t n = std::min<size_t>(*count, newer.size());
  std::memcpy(out, newer.data(), n * sizeof(Sample));
  *count = static_cast<unsigned int>(n);
  return 0;
}
__attribute__((visibility("default"))) int nvmlDeviceGetUtilizationRates(void*,
                                                                         unsigned int* rates) {
  rates[0] = 42;
  rates[1] = 0;
  return 0;
}
}
