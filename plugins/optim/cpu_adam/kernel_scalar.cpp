// Portable AdamW kernel (see adamw_kernel.h); also the fp16 scalar conversions.
#include <cmath>
#include <cstring>

#include <c10/util/Half.h>

#include "adamw_body.h"
#include "adamw_kernel.h"

namespace ciuic_cpu_adam {

float half_to_float(uint16_t h) { return c10::detail::fp16_ieee_to_fp32_value(h); }
uint16_t float_to_half_rne(float f) { return c10::detail::fp16_ieee_from_fp32_value(f); }

namespace {

// One lane. std::fma is exact (one rounding) with or without a hardware FMA.
struct ScalarOps {
  using V = float;
  static constexpr int W = 1;
  static V set1(float x) { return x; }
  static V load(const float* p) { return *p; }
  static void store(float* p, V x) { *p = x; }
  static V add(V a, V b) { return a + b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V sqrt(V a) { return std::sqrt(a); }
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
  template <Dtype D>
  static V load_grad(const void* p) {
    if constexpr (D == Dtype::kF32) {
      return *static_cast<const float*>(p);
    } else {
      uint16_t h;
      std::memcpy(&h, p, 2);
      return D == Dtype::kBF16 ? bf16_to_float(h) : half_to_float(h);
    }
  }
  template <Dtype D>
  static void store_out(void* p, V x) {
    if constexpr (D == Dtype::kF32) {
      *static_cast<float*>(p) = x;
    } else {
      const uint16_t h = D == Dtype::kBF16 ? float_to_bf16_rne(x) : float_to_half_rne(x);
      std::memcpy(p, &h, 2);
    }
  }
};

}  // namespace

void adamw_scalar(const KernelArgs& a) { AdamWLoop<ScalarOps>::run(a); }

}  // namespace ciuic_cpu_adam
