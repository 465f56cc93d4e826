// The GPU busy meter (train/nvml.h). NVML's C API is declared here by hand, with the few types it
// needs: no NVML header or library is needed to build.
#include "train/nvml.h"

#include <dlfcn.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <type_traits>
#include <vector>

namespace ciuic::train {

namespace {

// From nvml.h (the stable v2 entry points).
using nvmlReturn_t = int;
using nvmlDevice_t = void*;
constexpr nvmlReturn_t kNvmlSuccess = 0;
constexpr nvmlReturn_t kNvmlNotSupported = 3;
constexpr nvmlReturn_t kNvmlNotFound = 6;
constexpr int kGpuUtilizationSamples = 1;  // NVML_GPU_UTILIZATION_SAMPLES
enum ValueType : int {
  kDouble = 0,
  kUInt = 1,
  kULong = 2,
  kULongLong = 3,
  kSLongLong = 4,
  kSInt = 5
};
union Value {
  double d;
  unsigned int ui;
  unsigned long ul;
  unsigned long long ull;
  long long sll;
  int si;
};
struct Sample {
  unsigned long long time_stamp;  // microseconds
  Value value;
};
struct Utilization {
  unsigned int gpu, memory;  // percent
};

struct Nvml {
  nvmlReturn_t (*init)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*by_pci)(const char*, nvmlDevice_t*) = nullptr;
  nvmlReturn_t (*samples)(nvmlDevice_t, int, unsigned long long, int*, unsigned int*,
                          Sample*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, Utilization*) = nullptr;
  std::string why;  // empty: loaded and initialised
};

std::string error_text(const Nvml& n, nvmlReturn_t rc) {
  const char* s = n.error_string ? n.error_string(rc) : nullptr;
  return s ? std::string(s) : "error " + std::to_string(rc);
}

// Loaded once per process and library path.
const Nvml& nvml(const std::string& library) {
  static std::mutex mu;
  static std::vector<std::pair<std::string, Nvml*>> loaded;
  std::lock_guard<std::mutex> lock(mu);
  for (auto& [path, n] : loaded)
    if (path == library) return *n;
  auto* n = new Nvml;  // lives as long as the process, like the library
  loaded.emplace_back(library, n);
  void* h = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    n->why = "cannot load " + library + (e ? std::string(": ") + e : std::string());
    return *n;
  }
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
    if (!fn && n->why.empty()) n->why = library + " has no " + name;
  };
  sym(n->init, "nvmlInit_v2");
  sym(n->error_string, "nvmlErrorString");
  sym(n->by_pci, "nvmlDeviceGetHandleByPciBusId_v2");
  sym(n->samples, "nvmlDeviceGetSamples");
  sym(n->utilization, "nvmlDeviceGetUtilizationRates");
  if (!n->why.empty()) return *n;
  if (const nvmlReturn_t rc = n->init(); rc != kNvmlSuccess)
    n->why = "nvmlInit failed: " + error_text(*n, rc);
  return *n;
}

double as_double(int type, const Value& v) {
  switch (type) {
    case kDouble: return v.d;
    case kUInt: return v.ui;
    case kULong: return static_cast<double>(v.ul);
    case kULongLong: return static_cast<double>(v.ull);
    case kSLongLong: return static_cast<double>(v.sll);
    case kSInt: return v.si;
    default: return NAN;
  }
}

}  // namespace

DeviceBusyMeter::DeviceBusyMeter(const std::string& pci_bus_id, const std::string& library) {
  if (pci_bus_id.empty()) return;
  const Nvml& n = nvml(library);
  if (!n.why.empty()) {
    why_ = n.why;
    return;
  }
  nvmlDevice_t d = nullptr;
  if (const nvmlReturn_t rc = n.by_pci(pci_bus_id.c_str(), &d); rc != kNvmlSuccess) {
    why_ = "NVML does not see the GPU at PCI " + pci_bus_id + ": " + error_text(n, rc);
    return;
  }
  lib_ = &n;
  device_ = d;
  why_.clear();
  busy_since_last();  // the samples from before now are not the caller's
}

double DeviceBusyMeter::busy_since_last() {
  if (!device_) return NAN;
  const Nvml& n = *static_cast<const Nvml*>(lib_);
  if (samples_) {
    int type = 0;
    unsigned int count = 0;
    nvmlReturn_t rc =
        n.samples(device_, kGpuUtilizationSamples, last_seen_us_, &type, &count, nullptr);
    if (rc == kNvmlNotFound) return NAN;  // no sample since the last call
    if (rc == kNvmlSuccess && count > 0) {
      std::vector<Sample> buf(count);
      rc = n.samples(device_, kGpuUtilizationSamples, last_seen_us_, &type, &count, buf.data());
      if (rc == kNvmlNotFound) return NAN;
      if (rc == kNvmlSuccess) {
        double sum = 0;
        unsigned int used = 0;
        for (unsigned int i = 0; i < count && i < buf.size(); ++i) {
          if (buf[i].time_stamp <= last_seen_us_ && last_seen_us_ != 0) continue;
          const double v = as_double(type, buf[i].value);
          if (!std::isfinite(v)) continue;
          sum += v;
          ++used;
        }
        for (unsigned int i = 0; i < count && i < buf.size(); ++i)
          last_seen_us_ = std::max<uint64_t>(last_seen_us_, buf[i].time_stamp);
        return used ? std::clamp(sum / used / 100.0, 0.0, 1.0) : NAN;
      }
    }
    if (rc != kNvmlSuccess && rc != kNvmlNotSupported) return NAN;
    if (rc == kNvmlNotSupported) samples_ = false;
    if (rc == kNvmlSuccess) return NAN;  // no samples kept yet
  }
  Utilization u{};
  if (n.utilization(device_, &u) != kNvmlSuccess) return NAN;
  return std::clamp(u.gpu / 100.0, 0.0, 1.0);
}

}  // namespace ciuic::train
