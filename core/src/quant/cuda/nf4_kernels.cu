// The NF4 dequantization kernel (quant/cuda/nf4_kernels.h). Memory-bound: each thread reads one
// packed byte and writes its two outputs; the 16-entry code sits in shared memory.
#include "quant/cuda/nf4_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace ciuic::quant::cuda {
namespace {

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

constexpr int kThreads = 256;

__device__ __forceinline__ float block_absmax(int64_t b, const float* absmax_f32,
                                              const uint8_t* absmax_u8, const float* code2,
                                              const float* absmax2, float offset) {
  if (absmax_f32) return absmax_f32[b];
  const float v = __fmul_rn(code2[absmax_u8[b]], absmax2[b / 256]);
  return __fadd_rn(v, offset);
}

template <typename T>
__global__ void nf4_dequantize_kernel(const uint8_t* __restrict__ packed,
                                      const float* __restrict__ code,
                                      const float* __restrict__ absmax_f32,
                                      const uint8_t* __restrict__ absmax_u8,
                                      const float* __restrict__ code2,
                                      const float* __restrict__ absmax2, float offset,
                                      T* __restrict__ out, int64_t n, int64_t blocksize) {
  __shared__ float table[16];
  if (threadIdx.x < 16) table[threadIdx.x] = code[threadIdx.x];
  __syncthreads();
  const int64_t bytes = (n + 1) / 2;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < bytes;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint8_t byte = packed[j];
    const int64_t i = 2 * j;  // blocksize is even: both elements share a block
    const float scale = block_absmax(i / blocksize, absmax_f32, absmax_u8, code2, absmax2, offset);
    out[i] = from_f<T>(__fmul_rn(table[byte >> 4], scale));
    if (i + 1 < n) out[i + 1] = from_f<T>(__fmul_rn(table[byte & 0x0F], scale));
  }
}

}  // namespace

const char* nf4_dequantize(const uint8_t* packed, const float* code, const float* absmax_f32,
                           const uint8_t* absmax_u8, const float* code2, const float* absmax2,
                           float offset, void* out, int64_t n, int64_t blocksize, DType dtype,
                           cudaStream_t stream) {
  const int64_t bytes = (n + 1) / 2;
  int64_t grid = (bytes + kThreads - 1) / kThreads;
  grid = grid < 1
             ? 1
             : (grid > 65535 * 32 ? 65535 * 32 : grid);  // the grid-stride loop covers the rest
  const dim3 g(static_cast<unsigned>(grid)), b(kThreads);
  switch (dtype) {
    case DType::kFloat:
      nf4_dequantize_kernel<float><<<g, b, 0, stream>>>(packed, code, absmax_f32, absmax_u8, code2,
                                                        absmax2, offset, static_cast<float*>(out),
                                                        n, blocksize);
      break;
    case DType::kBFloat16:
      nf4_dequantize_kernel<__nv_bfloat16>
          <<<g, b, 0, stream>>>(packed, code, absmax_f32, absmax_u8, code2, absmax2, offset,
                                static_cast<__nv_bfloat16*>(out), n, blocksize);
      break;
    case DType::kHalf:
      nf4_dequantize_kernel<__half><<<g, b, 0, stream>>>(packed, code, absmax_f32, absmax_u8, code2,
                                                         absmax2, offset, static_cast<__half*>(out),
                                                         n, blocksize);
      break;
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

}  // namespace ciuic::quant::cuda
