// AVX-512 (F) skinny GEMM kernel (model/cpu_skinny_gemm.h). Only the functions inside the target
// region below use these instructions; cpu_skinny_gemm.cpp calls kernel_avx512() only after
// checking the CPU. Compiled to nothing off x86-64.
#if defined(__x86_64__)

#include <cstdint>

#include <immintrin.h>

#if !defined(__clang__)
// GCC 12's intrinsic headers initialise "undefined" vectors as `__m256i __Y = __Y;`, which
// -Wmaybe-uninitialized (and, in _mm512_reduce_add_ps, -Wuninitialized) reports once inlined
// (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif

#include "model/cpu_skinny_gemm_kernel.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f")
#endif

#include "model/cpu_skinny_gemm_body.h"

namespace ciuic::model::skinny {
namespace {

struct Avx512Ops {
  using V = __m512;
  static constexpr int kLanes = 16;
  static V zero() { return _mm512_setzero_ps(); }
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static V load_tail(const float* p, int n) {
    return _mm512_maskz_loadu_ps(static_cast<__mmask16>((1u << n) - 1u), p);
  }
  static constexpr bool kPrefetch = true;
  static void prefetch(const float* p) {
    _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1);
  }
  static V in_register(V v) {
    __asm__("" : "+v"(v));
    return v;
  }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static float reduce(V v) { return _mm512_reduce_add_ps(v); }
  // 32 vector registers: MT x NB accumulators + NB W vectors + one x vector. One row of x: 12
  // streams of W (24.3 GB/s from memory, one thread, vs 22.8 with 8 and 19 with 4).
  template <int MT>
  static constexpr int block() {
    return MT == 1 ? 12 : MT == 2 ? 6 : MT == 3 ? 6 : MT <= 5 ? 4 : 3;
  }
};

void run_avx512(const Args& a, int64_t n_begin, int64_t n_end) {
  skinny_run<Avx512Ops>(a, n_begin, n_end);
}

}  // namespace
}  // namespace ciuic::model::skinny

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

namespace ciuic::model::skinny {
void kernel_avx512(const Args& a, int64_t n_begin, int64_t n_end) { run_avx512(a, n_begin, n_end); }
}  // namespace ciuic::model::skinny

#endif  // __x86_64__
