// AVX2 + FMA + F16C AdamW kernel (see adamw_kernel.h). Only the functions inside the target
// region below use these instructions; the plugin calls adamw_avx2() only after checking the CPU.
#include <cstdint>
#include <cstring>

#include <immintrin.h>

#if !defined(__clang__)
// GCC 12's intrinsic headers initialise "undefined" vectors as `__m256i __Y = __Y;`, which
// -Wmaybe-uninitialized reports once inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "adamw_kernel.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

#include "adamw_body.h"

namespace ciuic_cpu_adam {
namespace {

struct Avx2Ops {
  using V = __m256;
  static constexpr int W = 8;
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V x) { _mm256_storeu_ps(p, x); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V sqrt(V a) { return _mm256_sqrt_ps(a); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  template <Dtype D>
  static V load_grad(const void* p) {
    if constexpr (D == Dtype::kF32) {
      return _mm256_loadu_ps(static_cast<const float*>(p));
    } else {
      const __m128i h = _mm_loadu_si128(static_cast<const __m128i*>(p));
      if constexpr (D == Dtype::kBF16)
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
      else
        return _mm256_cvtph_ps(h);
    }
  }
  template <Dtype D>
  static void store_out(void* p, V x) {
    if constexpr (D == Dtype::kF32) {
      _mm256_storeu_ps(static_cast<float*>(p), x);
    } else if constexpr (D == Dtype::kF16) {
      _mm_storeu_si128(static_cast<__m128i*>(p),
                       _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      // bf16, round to nearest even: add 0x7fff + (bit 16), keep the high half; NaN -> 0x7fc0.
      const __m256i b = _mm256_castps_si256(x);
      const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(b, 16), _mm256_set1_epi32(1));
      __m256i r = _mm256_add_epi32(b, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff)));
      r = _mm256_srli_epi32(r, 16);
      const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
      r = _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
      const __m128i packed =
          _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
      _mm_storeu_si128(static_cast<__m128i*>(p), packed);
    }
  }
};

void run_avx2(const KernelArgs& a) { AdamWLoop<Avx2Ops>::run(a); }

}  // namespace
}  // namespace ciuic_cpu_adam

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace ciuic_cpu_adam {
void adamw_avx2(const KernelArgs& a) { run_avx2(a); }
}  // namespace ciuic_cpu_adam
