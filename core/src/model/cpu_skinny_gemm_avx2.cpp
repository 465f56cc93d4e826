// AVX2 + FMA skinny GEMM kernel (model/cpu_skinny_gemm.h). Only the functions inside the target
// region below use these instructions; cpu_skinny_gemm.cpp calls kernel_avx2() only after
// checking the CPU. Compiled to nothing off x86-64.
#if defined(__x86_64__)

#include <cstdint>

#include <immintrin.h>

#if !defined(__clang__)
// GCC 12's intrinsic headers initialise "undefined" vectors as `__m256i __Y = __Y;`, which
// -Wmaybe-uninitialized reports once inlined (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include "model/cpu_skinny_gemm_kernel.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif

#include "model/cpu_skinny_gemm_body.h"

namespace ciuic::model::skinny {
namespace {

struct Avx2Ops {
  using V = __m256;
  static constexpr int kLanes = 8;
  static V zero() { return _mm256_setzero_ps(); }
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static V load_tail(const float* p, int n) {
    const __m256i mask =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    return _mm256_maskload_ps(p, mask);  // masked-off lanes are neither read nor faulted
  }
  static constexpr bool kPrefetch = true;
  static void prefetch(const float* p) {
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
  }
  static V in_register(V v) {
    __asm__("" : "+x"(v));
    return v;
  }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static float reduce(V v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  // 16 vector registers: MT x NB accumulators + NB W vectors + one x vector.
  template <int MT>
  static constexpr int block() {
    return MT == 1 ? 6 : MT == 2 ? 4 : MT == 3 ? 3 : MT <= 6 ? 2 : 1;
  }
};

void run_avx2(const Args& a, int64_t n_begin, int64_t n_end) {
  skinny_run<Avx2Ops>(a, n_begin, n_end);
}

}  // namespace
}  // namespace ciuic::model::skinny

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace ciuic::model::skinny {
void kernel_avx2(const Args& a, int64_t n_begin, int64_t n_end) { run_avx2(a, n_begin, n_end); }
}  // namespace ciuic::model::skinny

#endif  // __x86_64__
