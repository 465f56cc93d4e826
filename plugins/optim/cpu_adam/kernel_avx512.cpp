// AVX-512 (F + BW) AdamW kernel (see adamw_kernel.h). Only the functions inside the target region
// below use these instructions; the plugin calls adamw_avx512() only after checking the CPU.
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
#pragma clang attribute push(__attribute__((target("avx512f,avx512bw"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw")
#endif

#include "adamw_body.h"

namespace ciuic_cpu_adam {
namespace {

struct Avx512Ops {
  using V = __m512;
  static constexpr int W = 16;
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V x) { _mm512_storeu_ps(p, x); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V sqrt(V a) { return _mm512_sqrt_ps(a); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  template <Dtype D>
  static V load_grad(const void* p) {
    if constexpr (D == Dtype::kF32) {
      return _mm512_loadu_ps(static_cast<const float*>(p));
    } else {
      const __m256i h = _mm256_loadu_si256(static_cast<const __m256i*>(p));
      if constexpr (D == Dtype::kBF16)
        return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
      else
        return _mm512_cvtph_ps(h);
    }
  }
  template <Dtype D>
  static void store_out(void* p, V x) {
    if constexpr (D == Dtype::kF32) {
      _mm512_storeu_ps(static_cast<float*>(p), x);
    } else if constexpr (D == Dtype::kF16) {
      _mm256_storeu_si256(static_cast<__m256i*>(p),
                          _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    } else {
      // bf16, round to nearest even: add 0x7fff + (bit 16), keep the high half; NaN -> 0x7fc0.
      const __m512i b = _mm512_castps_si512(x);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(b, 16), _mm512_set1_epi32(1));
      __m512i r = _mm512_add_epi32(b, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff)));
      r = _mm512_srli_epi32(r, 16);
      const __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
      r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7fc0));
      _mm256_storeu_si256(static_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
    }
  }
};

void run_avx512(const KernelArgs& a) { AdamWLoop<Avx512Ops>::run(a); }

}  // namespace
}  // namespace ciuic_cpu_adam

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace ciuic_cpu_adam {
void adamw_avx512(const KernelArgs& a) { run_avx512(a); }
}  // namespace ciuic_cpu_adam
