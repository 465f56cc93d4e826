// base/cuda/float_convert.cuh — the element conversions of the CUDA kernels (model/cuda,
// quant/cuda): to_f widens fp32, bf16 or fp16 to fp32 exactly, from_f<T> rounds fp32 to T to the
// nearest (even). Device code for nvcc only (no LibTorch types); every function is inline.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ciuic::cuda {

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(__half x) { return __half2float(x); }

template <typename T>
__device__ __forceinline__ T from_f(float x);
template <>
__device__ __forceinline__ float from_f<float>(float x) {
  return x;
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_f<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half from_f<__half>(float x) {
  return __float2half_rn(x);
}

}  // namespace ciuic::cuda
