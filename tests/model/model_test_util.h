// Helpers shared by the model tests.
#pragma once

#include <ciuic/files.h>
#include <filesystem>
#include <string>

#include <ATen/core/Tensor.h>
#include <gtest/gtest.h>

#include <ciuic/error.h>

#include "model/safetensors.h"

namespace ciuic::model::testing {

// The tiny random models of tests/fixtures/model/families/ (gen_model_families.py).
inline constexpr const char* kFamilyCases[] = {"mistral", "qwen2", "qwen3", "gemma3", "llama_pad"};

inline std::string fixture(const std::string& rel) {
  return std::string(CIUIC_FIXTURES_DIR) + "/model/" + rel;
}

// A fresh, empty folder under the build tree's test-tmp for this test.
inline std::string temp_dir(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::filesystem::path p =
      std::filesystem::path(CIUIC_TEST_TMP) / "model" /
      (std::string(info->test_suite_name()) + "." + info->name() + "." + name);
  {
    std::error_code rm_ec;
    ciuic::remove_tree(std::filesystem::path(p).string(), rm_ec);
  }
  std::filesystem::create_directories(p);
  return p.string();
}

// transformers' outputs (tests/fixtures/model/expected.safetensors).
inline const SafetensorsReader& expected() {
  static const SafetensorsReader r = SafetensorsReader::open(fixture("expected.safetensors"));
  return r;
}

// max |a - b| / max |b| (0 when both are zero), computed in float64.
inline double max_rel_diff(const at::Tensor& a, const at::Tensor& b) {
  at::Tensor x = a.detach().to(at::kCPU).to(at::kDouble),
             y = b.detach().to(at::kCPU).to(at::kDouble);
  EXPECT_EQ(x.sizes(), y.sizes());
  const double scale = y.abs().max().item<double>();
  const double diff = x.sub(y).abs().max().item<double>();
  return scale == 0 ? diff : diff / scale;
}

// Runs `f`, expects a ciuic::Error whose message contains every one of `parts`.
template <class F>
void expect_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected a ciuic::Error mentioning " << *parts.begin();
  } catch (const ciuic::Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts)
      EXPECT_NE(msg.find(p), std::string::npos) << "message: " << msg << "\nmissing: " << p;
  }
}

}  // namespace ciuic::model::testing
