// Portable skinny GEMM kernel (model/cpu_skinny_gemm.h): the fallback where neither AVX2 nor
// AVX-512 is available, and the reference the tests force.
#include <cstdint>

#include "model/cpu_skinny_gemm_body.h"

namespace ciuic::model::skinny {
namespace {

struct ScalarOps {
  using V = float;
  static constexpr int kLanes = 1;
  static V zero() { return 0.0f; }
  static V load(const float* p) { return *p; }
  static V load_tail(const float*, int) { return 0.0f; }  // never called: kLanes == 1
  static constexpr bool kPrefetch = false;
  static void prefetch(const float*) {}
  static V in_register(V v) { return v; }
  static V fma(V a, V b, V c) { return a * b + c; }
  static float reduce(V v) { return v; }
  template <int MT>
  static constexpr int block() {
    return MT <= 2 ? 4 : MT <= 4 ? 2 : 1;
  }
};

}  // namespace

void kernel_scalar(const Args& a, int64_t n_begin, int64_t n_end) {
  skinny_run<ScalarOps>(a, n_begin, n_end);
}

}  // namespace ciuic::model::skinny
