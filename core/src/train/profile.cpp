// The step profiler (train/profile.h).
#include "train/profile.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <utility>
#include <vector>

#include <torch/csrc/autograd/profiler_kineto.h>

#include <ciuic/log.h>

#include "train/device_info.h"

namespace ciuic::train {

namespace fs = std::filesystem;
namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
bool has(const std::string& s, std::initializer_list<const char*> parts) {
  for (const char* p : parts)
    if (s.find(p) != std::string::npos) return true;
  return false;
}
}  // namespace

std::string kernel_category(const std::string& kernel_name) {
  std::string n = kernel_name;
  std::transform(n.begin(), n.end(), n.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  if (has(n, {"nccldevkernel", "ncclkernel"})) return "communication";  // NCCL's device kernels
  if (has(n, {"memcpy", "memset"})) return "copies (memcpy)";
  if (has(n, {"flash", "fmha", "sdpa", "attention", "attn", "cudnn"})) return "attention";
  if (has(n, {"adam", "multi_tensor", "vector_norm", "foreach"})) return "optimizer";
  if (has(n, {"gemm", "xmma", "cutlass", "nvjet", "cublas", "gemv", "splitk", "sm90_", "sm80_",
              "ampere_"}))
    return "matmul";
  if (has(n, {"direct_copy", "copy_kernel", "cat_", "catarray", "cast"})) return "copies, casts";
  if (has(n, {"rms", "norm"})) return "norm";
  if (has(n, {"rope_kernel", "roll_cuda", "addcmul"})) return "rope";
  if (has(n, {"silu", "swiglu"})) return "activation";
  if (has(n, {"logsumexp", "log_softmax", "nll", "cross_entropy", "scatter", "gather", "exp_kernel",
              "expfunctor"}))
    return "loss";
  if (has(n, {"embedding", "index", "sort", "radix"})) return "embedding";
  if (has(n, {"copy"})) return "copies, casts";
  return "other elementwise";
}

StepProfiler::StepProfiler(int64_t start, int64_t steps, std::string dir, int rank, bool cuda)
    : start_(start),
      steps_(std::max<int64_t>(steps, 1)),
      dir_(std::move(dir)),
      rank_(rank),
      cuda_(cuda) {}

StepProfiler::~StepProfiler() {
  if (active_) {
    try {
      finish();
    } catch (...) {
    }
  }
}

void StepProfiler::before_step(int64_t step) {
  if (start_ <= 0 || step != start_ || active_) return;
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda_) activities.insert(ActivityType::CUDA);
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
  prof::prepareProfiler(config, activities);
  if (cuda_) synchronize(c10::Device(c10::kCUDA));
  prof::enableProfiler(config, activities);
  active_ = true;
  t0_ = now_s();
}

void StepProfiler::after_step(int64_t step) {
  if (active_ && step >= start_ + steps_ - 1) finish();
}

void StepProfiler::finish() {
  if (cuda_) synchronize(c10::Device(c10::kCUDA));
  const double wall = now_s() - t0_;
  active_ = false;
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  if (!result) return;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  const std::string base = (fs::path(dir_) / ("rank" + std::to_string(rank_))).string();
  try {
    result->save(base + ".trace.json");
  } catch (const std::exception& e) {
    log_warn(std::string("profile: could not write ") + base + ".trace.json: " + e.what());
  }
  // GPU work: kernels and copies on the device, by category; busy time as the union of their
  // intervals (streams overlap).
  std::map<std::string, double> by_cat;
  struct KernelTotal {
    double ms = 0.0;
    int64_t launches = 0;
    std::string category;  // of the full name (the key is cut to 90 characters)
  };
  std::map<std::string, KernelTotal> by_kernel;
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  double gpu_total = 0.0;
  for (const auto& e : result->events()) {
    if (e.deviceType() != c10::DeviceType::CUDA || e.durationNs() == 0) continue;
    const std::string name = e.name();
    const double ms = static_cast<double>(e.durationNs()) / 1e6;
    const std::string category = kernel_category(name);
    by_cat[category] += ms;
    auto& k = by_kernel[name.substr(0, 90)];
    k.ms += ms;
    k.launches += 1;
    k.category = category;
    gpu_total += ms;
    spans.emplace_back(e.startNs(), e.endNs());
  }
  std::sort(spans.begin(), spans.end());
  double busy_ms = 0.0;
  uint64_t cur_b = 0, cur_e = 0;
  for (const auto& [b, e] : spans) {
    if (b > cur_e) {
      busy_ms += static_cast<double>(cur_e - cur_b) / 1e6;
      cur_b = b;
      cur_e = e;
    } else {
      cur_e = std::max(cur_e, e);
    }
  }
  busy_ms += static_cast<double>(cur_e - cur_b) / 1e6;
  const double steps = static_cast<double>(steps_);
  const double wall_ms = wall * 1e3 / steps;
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "profile of steps %lld-%lld (rank %d): %.1f ms a step wall",
                static_cast<long long>(start_), static_cast<long long>(start_ + steps_ - 1), rank_,
                wall_ms);
  os << line;
  if (cuda_) {
    std::snprintf(line, sizeof line, ", GPU busy %.1f ms (%.0f%%), idle %.1f ms\n", busy_ms / steps,
                  100.0 * busy_ms / steps / wall_ms, wall_ms - busy_ms / steps);
    os << line;
    std::vector<std::pair<std::string, double>> cats(by_cat.begin(), by_cat.end());
    std::sort(cats.begin(), cats.end(), [](auto& a, auto& b) { return a.second > b.second; });
    os << "  category               ms/step   share of GPU time\n";
    for (const auto& [c, ms] : cats) {
      std::snprintf(line, sizeof line, "  %-20s %9.2f   %5.1f%%\n", c.c_str(), ms / steps,
                    100.0 * ms / gpu_total);
      os << line;
    }
    std::vector<std::pair<std::string, KernelTotal>> ks(by_kernel.begin(), by_kernel.end());
    std::sort(ks.begin(), ks.end(), [](auto& a, auto& b) { return a.second.ms > b.second.ms; });
    os << "  top kernels (ms/step, launches/step, category):\n";
    for (size_t i = 0; i < std::min<size_t>(ks.size(), 25); ++i) {
      std::snprintf(line, sizeof line, "  %9.2f %6lld  %-18s %s\n", ks[i].second.ms / steps,
                    static_cast<long long>(ks[i].second.launches / steps_),
                    ks[i].second.category.c_str(), ks[i].first.c_str());
      os << line;
    }
  } else {
    os << " (CPU run: see the trace for the host ops)\n";
  }
  std::ofstream out(base + ".txt");
  out << os.str();
  if (!out) log_warn("profile: could not write " + base + ".txt");
  if (rank_ == 0) log_info(os.str() + "  trace: " + base + ".trace.json");
}

}  // namespace ciuic::train
