// The device busy meter (train/nvml.h) without a GPU: every way it is unavailable (no PCI id, no
// library, a GPU NVML does not see) leaves it quiet with a reason, and against a stand-in NVML
// (fake_nvml.cpp) it averages exactly the samples taken since the previous call. The real driver:
// scripts/gpu/nvml_busy.sh on a GPU host.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include <ATen/Context.h>
#include <ATen/ops/matmul.h>
#include <ATen/ops/randn.h>

#include "train/event_busy.h"
#include "train/nvml.h"

namespace ciuic::train {
namespace {

const std::string kFake = std::string(CIUIC_TEST_PLUGINS) + "/fake-nvml/libfake_nvml.so";

TEST(DeviceBusyMeter, UnavailableWithoutAGpuOrALibrary) {
  DeviceBusyMeter cpu("");
  EXPECT_FALSE(cpu.available());
  EXPECT_TRUE(std::isnan(cpu.busy_since_last()));
  DeviceBusyMeter nolib("0000:01:00.0", "/nonexistent/libnvidia-ml.so.1");
  EXPECT_FALSE(nolib.available());
  EXPECT_NE(nolib.why_unavailable().find("cannot load /nonexistent/libnvidia-ml.so.1"),
            std::string::npos)
      << nolib.why_unavailable();
  EXPECT_TRUE(std::isnan(nolib.busy_since_last()));
  DeviceBusyMeter other("0000:99:00.0", kFake);
  EXPECT_FALSE(other.available());
  EXPECT_NE(
      other.why_unavailable().find("NVML does not see the GPU at PCI 0000:99:00.0: fake error"),
      std::string::npos)
      << other.why_unavailable();
}

TEST(DeviceBusyMeter, AveragesTheSamplesOfEachInterval) {
  void* lib =
      dlopen(kFake.c_str(), RTLD_NOW | RTLD_LOCAL);  // the meter's own handle: the same library
  ASSERT_NE(lib, nullptr) << dlerror();
  auto push =
      reinterpret_cast<void (*)(unsigned long long, unsigned)>(dlsym(lib, "fake_nvml_push"));
  ASSERT_NE(push, nullptr);
  push(100, 100);  // before the meter: not its interval
  push(200, 100);
  DeviceBusyMeter m("0000:01:00.0", kFake);
  ASSERT_TRUE(m.available()) << m.why_unavailable();
  push(300, 50);
  push(400, 100);
  push(500, 0);
  push(600, 90);
  EXPECT_DOUBLE_EQ(m.busy_since_last(), 0.6);  // (50 + 100 + 0 + 90) / 4 / 100
  EXPECT_TRUE(std::isnan(m.busy_since_last())) << "no sample since the last call";
  push(700, 0);
  EXPECT_DOUBLE_EQ(m.busy_since_last(), 0.0);
  dlclose(lib);
}

// The CUDA-event fallback (train/event_busy.h): unavailable and quiet on the CPU; on a CUDA device
// (skipped without one) a bracket of matmuls then as long idle reads about 1/2, one bracket
// covering the whole interval about 1, and an interval without a bracket NaN. Against NVML on a
// real pattern: scripts/gpu/nvml_busy.sh.
TEST(EventBusyMeter, CpuIsUnavailable) {
  EventBusyMeter m(c10::Device(c10::kCPU));
  EXPECT_FALSE(m.available());
  m.begin();
  m.end();
  EXPECT_TRUE(std::isnan(m.busy_since_last()));
  EXPECT_TRUE(std::isnan(EventBusyMeter().busy_since_last()));
}

TEST(EventBusyMeter, CudaBracketsOverTheInterval) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA device (label gpu)";
  EventBusyMeter m(c10::Device(c10::kCUDA, 0));
#ifndef CIUIC_WITH_CUDA
  EXPECT_FALSE(m.available()) << "a CPU build has no CUDA events";
  GTEST_SKIP() << "built without CUDA";
#endif
  ASSERT_TRUE(m.available());
  const at::Tensor a = at::randn({2048, 2048}, at::TensorOptions().device(at::kCUDA));
  // Device work of about `s` seconds, enqueued and waited for.
  auto work = [&](double s) {
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < s) {
      at::Tensor b = a;
      for (int i = 0; i < 8; ++i) b = at::matmul(b, a).tanh_();
      (void)b.sum().item<float>();  // waits: the host does not run ahead
    }
  };
  m.busy_since_last();
  m.begin();
  work(0.5);
  m.end();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  const double half = m.busy_since_last();
  EXPECT_GT(half, 0.35);
  EXPECT_LT(half, 0.65);
  m.begin();
  work(0.5);
  m.end();
  EXPECT_GT(m.busy_since_last(), 0.9);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_TRUE(std::isnan(m.busy_since_last())) << "no bracket in the interval";
}

}  // namespace
}  // namespace ciuic::train
