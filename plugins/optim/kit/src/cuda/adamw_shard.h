// kit/src/cuda/adamw_shard.h — AdamW over a whole flat shard in one CUDA launch (internal to the
// optim kit; the C++ side is ciuic/kit/fused_adamw.h).
//
// Compiled by nvcc into the kit in CUDA builds only (plugins/optim/kit/CMakeLists.txt,
// CIUIC_KIT_CUDA_KERNELS). No LibTorch types here, so nvcc compiles it alone and quickly.
// The launch enqueues one kernel on `stream` and returns; it does not synchronise. A launch error
// is returned as the CUDA error string (nullptr on success); the kernel itself cannot fail.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace ciuic::kit::cuda {

enum class DType { kFloat, kBFloat16, kHalf };

// One block's work: shard elements [begin, begin + count), all with or all without weight decay.
// Built once per shard from its segments (count <= kTileElements).
struct Tile {
  int64_t begin;
  int32_t count;
  int32_t decay;  // 1: weight decay applies
};
inline constexpr int32_t kTileElements = 1 << 16;

struct AdamWScalars {
  float lr;
  float beta1, beta2, eps;
  float one_minus_beta1, one_minus_beta2;  // from fp64 (1 - 0.999f in fp32 is 1.3e-5 off 0.001)
  float lr_weight_decay;                   // lr * weight_decay (applied to tiles with decay)
  float step_size;                         // lr / (1 - beta1^t)
  float bias_correction2_sqrt;             // sqrt(1 - beta2^t)
  float grad_scale;  // multiplies the gradient (clip coefficient / loss scale)
};

// For every element i of every tile, in fp32 (g = grad[i] * grad_scale):
//   p  <- p - lr_weight_decay * p                         (decay tiles only)
//   m  <- beta1 * m + one_minus_beta1 * g
//   v  <- beta2 * v + one_minus_beta2 * g * g
//   p  <- p - step_size * m / (sqrt(v) / bias_correction2_sqrt + eps)
// and, when params_out is not null, params_out[i] <- p rounded to nearest even in param_dtype.
// master, exp_avg, exp_avg_sq: fp32; grad: grad_dtype; all indexed by shard element, 16-byte
// aligned base pointers. `tiles` is a device array of num_tiles entries.
const char* adamw_shard(const Tile* tiles, int64_t num_tiles, float* master, const void* grad,
                        DType grad_dtype, float* exp_avg, float* exp_avg_sq, void* params_out,
                        DType param_dtype, const AdamWScalars& s, cudaStream_t stream);

}  // namespace ciuic::kit::cuda
