// The device busy meter (train/nvml.h) without a GPU: every way it is unavailable (no PCI id, no
// library, a GPU NVML does not see) leaves it quiet with a reason, and against a stand-in NVML
// (fake_nvml.cpp) it averages exactly the samples taken since the previous call. The real driver:
// scripts/gpu/nvml_busy.sh on a GPU host.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cmath>
#include <string>

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

}  // namespace
}  // namespace ciuic::train
