// The cpu_adam AdamW kernels: one contiguous range of the shard, one thread, fp32 arithmetic.
//
// Three implementations of the same arithmetic, chosen at run time from the CPU's features:
// AVX-512 (avx512f + avx512bw), AVX2 (avx2 + fma + f16c) and portable scalar code. The SIMD
// variants are compiled with function-level target attributes, so the plugin itself runs on any
// x86-64. All three evaluate exactly the same sequence of IEEE operations per element (the TUs are
// compiled with -ffp-contract=off; FMAs are written out), so their results are bitwise identical
// to each other, whatever the machine.
//
// Per element, with g the gradient converted to fp32 (matching torch::optim::AdamW's kernels:
// exp_avg.mul_(b1).add_(g, 1-b1) is an FMA in ATen; addcmul_ contracts to an FMA as well):
//   g  = g * grad_scale
//   p  = p * decay                                   decay = fp32(1 - lr * weight_decay)
//   m  = fma(g, 1 - b1, m * b1)
//   v  = fma((1 - b2) * g, g, v * b2)
//   d  = sqrt(v) / sqrt(bias_correction2) + eps      (correctly rounded sqrt and division)
//   p  = p + (neg_step_size * m) / d                 neg_step_size = fp32(-lr / bias_correction1)
//   out = p converted to the parameter dtype (bf16/fp16: round to nearest even, overflow to
//         inf; a NaN becomes a quiet NaN (bf16: 0x7fc0))
// torch::optim::AdamW differs only where its sqrt is not correctly rounded (ATen may use MKL's
// vsSqrt on the CPU): ~1 ulp in the denominator.
#pragma once

#include <cstdint>

namespace ciuic_cpu_adam {

enum class Dtype : uint8_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

inline int64_t dtype_size(Dtype d) { return d == Dtype::kF32 ? 4 : 2; }

// Coefficients of one step, rounded to fp32 once (as torch converts its double scalars).
struct Coefficients {
  float grad_scale = 1.0f;
  float decay = 1.0f;
  float beta1 = 0.9f, one_minus_beta1 = 0.1f;
  float beta2 = 0.999f, one_minus_beta2 = 0.001f;
  float bias_correction2_sqrt = 1.0f;
  float eps = 1e-8f;
  float neg_step_size = 0.0f;
};

// One call's work: elements [0, n) of the given arrays. `grad` holds n elements of grad_dtype;
// `out` (may be null: no copy-back) n elements of out_dtype. p, m, v are updated in place.
struct KernelArgs {
  float* p = nullptr;
  float* m = nullptr;
  float* v = nullptr;
  const void* grad = nullptr;
  Dtype grad_dtype = Dtype::kF32;
  void* out = nullptr;
  Dtype out_dtype = Dtype::kF32;
  int64_t n = 0;
  Coefficients c;
  float decay = 1.0f;  // per-segment: c.decay for weight-decay segments, 1 otherwise
};

// Elements [offset, offset + n) of `a`.
inline KernelArgs slice(const KernelArgs& a, int64_t offset, int64_t n) {
  KernelArgs r = a;
  r.p += offset;
  r.m += offset;
  r.v += offset;
  r.grad = static_cast<const char*>(a.grad) + offset * dtype_size(a.grad_dtype);
  if (a.out) r.out = static_cast<char*>(a.out) + offset * dtype_size(a.out_dtype);
  r.n = n;
  return r;
}

enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
const char* simd_name(SimdLevel level);  // "scalar", "avx2", "avx512"

// Whether this CPU (and OS) supports `level`.
bool simd_supported(SimdLevel level);
// The best supported level.
SimdLevel simd_best();

using KernelFn = void (*)(const KernelArgs&);
KernelFn kernel_for(SimdLevel level);

// The three implementations (kernel_scalar.cpp, kernel_avx2.cpp, kernel_avx512.cpp). Calling a
// SIMD one on a CPU without its features is undefined (SIGILL).
void adamw_scalar(const KernelArgs& a);
void adamw_avx2(const KernelArgs& a);
void adamw_avx512(const KernelArgs& a);

// Scalar conversions shared by the kernels' tails.
inline float bf16_to_float(uint16_t h) {
  uint32_t bits = static_cast<uint32_t>(h) << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
inline uint16_t float_to_bf16_rne(float f) {
  uint32_t bits;
  __builtin_memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN: the canonical quiet NaN, as c10
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}
float half_to_float(uint16_t h);
uint16_t float_to_half_rne(float f);

}  // namespace ciuic_cpu_adam
