// Run-time choice of the AdamW kernel from the CPU's features.
#include "adamw_kernel.h"

namespace ciuic_cpu_adam {

const char* simd_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512: return "avx512";
    case SimdLevel::kAvx2: return "avx2";
    default: return "scalar";
  }
}

bool simd_supported(SimdLevel level) {
#if CIUIC_CPU_ADAM_X86
  __builtin_cpu_init();
  switch (level) {
    // __builtin_cpu_supports also checks that the OS saves the wider registers (XCR0).
    case SimdLevel::kAvx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw");
    case SimdLevel::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    default: return true;
  }
#else
  return level == SimdLevel::kScalar;
#endif
}

SimdLevel simd_best() {
  if (simd_supported(SimdLevel::kAvx512)) return SimdLevel::kAvx512;
  if (simd_supported(SimdLevel::kAvx2)) return SimdLevel::kAvx2;
  return SimdLevel::kScalar;
}

KernelFn kernel_for(SimdLevel level) {
#if CIUIC_CPU_ADAM_X86
  if (level == SimdLevel::kAvx512) return &adamw_avx512;
  if (level == SimdLevel::kAvx2) return &adamw_avx2;
#endif
  return &adamw_scalar;
}

}  // namespace ciuic_cpu_adam
