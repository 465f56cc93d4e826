// AdamW over a whole flat shard in one launch (kit/src/cuda/adamw_shard.h). Memory-bound: per
// element it reads master, gradient and both moments once and writes master, moments and (when
// asked) the rounded parameter once — the update, the gradient's scaling and the rounding into the
// model's parameters in one pass instead of three (scale, ATen's multi-tensor AdamW, the cast).
#include "cuda/adamw_shard.h"

#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ciuic::kit::cuda {
namespace {

constexpr int kThreads = 256;

// Four consecutive elements of type T at a 4-element-aligned index, to and from fp32.
__device__ __forceinline__ void load4(const float* p, float (&o)[4]) {
  const float4 v = *reinterpret_cast<const float4*>(p);
  o[0] = v.x;
  o[1] = v.y;
  o[2] = v.z;
  o[3] = v.w;
}
__device__ __forceinline__ void load4(const __nv_bfloat16* p, float (&o)[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 a = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 b = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  o[0] = a.x;
  o[1] = a.y;
  o[2] = b.x;
  o[3] = b.y;
}
__device__ __forceinline__ void load4(const __half* p, float (&o)[4]) {
  const uint2 raw = *reinterpret_cast<const uint2*>(p);
  const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&raw.x));
  const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&raw.y));
  o[0] = a.x;
  o[1] = a.y;
  o[2] = b.x;
  o[3] = b.y;
}
__device__ __forceinline__ void store4(float* p, const float (&o)[4]) {
  *reinterpret_cast<float4*>(p) = make_float4(o[0], o[1], o[2], o[3]);
}
__device__ __forceinline__ void store4(__nv_bfloat16* p, const float (&o)[4]) {
  const __nv_bfloat162 a = __floats2bfloat162_rn(o[0], o[1]), b = __floats2bfloat162_rn(o[2], o[3]);
  uint2 raw;
  raw.x = *reinterpret_cast<const unsigned*>(&a);
  raw.y = *reinterpret_cast<const unsigned*>(&b);
  *reinterpret_cast<uint2*>(p) = raw;
}
__device__ __forceinline__ void store4(__half* p, const float (&o)[4]) {
  const __half2 a = __floats2half2_rn(o[0], o[1]), b = __floats2half2_rn(o[2], o[3]);
  uint2 raw;
  raw.x = *reinterpret_cast<const unsigned*>(&a);
  raw.y = *reinterpret_cast<const unsigned*>(&b);
  *reinterpret_cast<uint2*>(p) = raw;
}
// The update of one element (header's formula). `wd` is lr * weight_decay or 0.
__device__ __forceinline__ void adamw(float& p, float& m, float& v, float g, float wd,
                                      const AdamWScalars& s) {
  p = p - wd * p;
  m = s.beta1 * m + s.one_minus_beta1 * g;
  v = s.beta2 * v + s.one_minus_beta2 * g * g;
  p = p - s.step_size * m / (sqrtf(v) / s.bias_correction2_sqrt + s.eps);
}

// One block per tile: a scalar head up to the first 4-aligned element, 4-wide vectors, a scalar
// tail. P = void: no parameter output.
template <typename G, typename P>
__global__ void __launch_bounds__(kThreads)
    adamw_shard_kernel(const Tile* __restrict__ tiles, float* __restrict__ master,
                       const G* __restrict__ grad, float* __restrict__ exp_avg,
                       float* __restrict__ exp_avg_sq, P* __restrict__ out, AdamWScalars s) {
  const Tile t = tiles[blockIdx.x];
  const float wd = t.decay ? s.lr_weight_decay : 0.0f;
  const int64_t begin = t.begin, end = t.begin + t.count;
  const int64_t aligned = (begin + 3) & ~int64_t{3};
  const int64_t head_end = aligned < end ? aligned : end;
  auto one = [&](int64_t i) {
    float p = master[i], m = exp_avg[i], v = exp_avg_sq[i];
    adamw(p, m, v, static_cast<float>(grad[i]) * s.grad_scale, wd, s);
    master[i] = p;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
    if constexpr (!std::is_void_v<P>) out[i] = P(p);  // round to nearest even
  };
  for (int64_t i = begin + threadIdx.x; i < head_end; i += blockDim.x) one(i);
  const int64_t vectors = (end - head_end) / 4;
  for (int64_t k = threadIdx.x; k < vectors; k += blockDim.x) {
    const int64_t i = head_end + 4 * k;
    float p[4], m[4], v[4], g[4];
    load4(master + i, p);
    load4(exp_avg + i, m);
    load4(exp_avg_sq + i, v);
    load4(grad + i, g);
#pragma unroll
    for (int j = 0; j < 4; ++j) adamw(p[j], m[j], v[j], g[j] * s.grad_scale, wd, s);
    store4(master + i, p);
    store4(exp_avg + i, m);
    store4(exp_avg_sq + i, v);
    if constexpr (!std::is_void_v<P>) store4(out + i, p);
  }
  for (int64_t i = head_end + 4 * vectors + threadIdx.x; i < end; i += blockDim.x) one(i);
}

template <typename G, typename P>
void launch(const Tile* tiles, int64_t num_tiles, float* master, const void* grad, float* m,
            float* v, void* out, const AdamWScalars& s, cudaStream_t stream) {
  adamw_shard_kernel<G, P><<<static_cast<unsigned>(num_tiles), kThreads, 0, stream>>>(
      tiles, master, static_cast<const G*>(grad), m, v, static_cast<P*>(out), s);
}

template <typename G>
void launch_out(const Tile* tiles, int64_t num_tiles, float* master, const void* grad, float* m,
                float* v, void* out, DType param_dtype, const AdamWScalars& s,
                cudaStream_t stream) {
  if (out == nullptr) return launch<G, void>(tiles, num_tiles, master, grad, m, v, out, s, stream);
  switch (param_dtype) {
    case DType::kFloat:
      return launch<G, float>(tiles, num_tiles, master, grad, m, v, out, s, stream);
    case DType::kBFloat16:
      return launch<G, __nv_bfloat16>(tiles, num_tiles, master, grad, m, v, out, s, stream);
    case DType::kHalf:
      return launch<G, __half>(tiles, num_tiles, master, grad, m, v, out, s, stream);
  }
}

}  // namespace

const char* adamw_shard(const Tile* tiles, int64_t num_tiles, float* master, const void* grad,
                        DType grad_dtype, float* exp_avg, float* exp_avg_sq, void* params_out,
                        DType param_dtype, const AdamWScalars& s, cudaStream_t stream) {
  if (num_tiles <= 0) return nullptr;
  if (num_tiles > 0x7fffffff) return "adamw_shard: more tiles than a grid holds";
  switch (grad_dtype) {
    case DType::kFloat:
      launch_out<float>(tiles, num_tiles, master, grad, exp_avg, exp_avg_sq, params_out,
                        param_dtype, s, stream);
      break;
    case DType::kBFloat16:
      launch_out<__nv_bfloat16>(tiles, num_tiles, master, grad, exp_avg, exp_avg_sq, params_out,
                                param_dtype, s, stream);
      break;
    case DType::kHalf:
      launch_out<__half>(tiles, num_tiles, master, grad, exp_avg, exp_avg_sq, params_out,
                         param_dtype, s, stream);
      break;
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace ciuic::kit::cuda
