// The NF4 kernels (quant/cuda/nf4_kernels.h). Memory-bound. Dequantization: each thread reads one
// packed byte and writes its two outputs; the 16-entry code sits in shared memory. Quantization:
// one warp per block of `blocksize` elements (its absmax a warp reduction, exact), each lane
// packing two elements a byte; the double quantization one thread block per 256 absmax values.
// Every fp32 operation that the CPU loops (quant/nf4.cpp) round is an explicitly rounded intrinsic
// here (__fmul_rn, __fdiv_rn, __fsub_rn: never contracted, IEEE division): the CPU's bits.
#include "quant/cuda/nf4_kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "base/cuda/float_convert.cuh"

namespace ciuic::quant::cuda {
namespace {

using ciuic::cuda::from_f;
using ciuic::cuda::to_f;

constexpr int kThreads = 256;
constexpr float kMinAbsmax = 1e-38f;  // bitsandbytes' clamp(min=1e-38), as quant/nf4.cpp
constexpr int kNested = 256;          // kNf4NestedBlocksize

__device__ __forceinline__ float clamp1(float s) {
  return s < -1.0f ? -1.0f : (s > 1.0f ? 1.0f : s);
}

// std::lower_bound(mids, mids + 15, s) - mids: the midpoints are ascending, so the count below s.
__device__ __forceinline__ uint8_t nearest16(const Nf4Mids& mids, float s) {
  int k = 0;
#pragma unroll
  for (int i = 0; i < 15; ++i) k += mids.m[i] < s ? 1 : 0;
  return static_cast<uint8_t>(k);
}

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

template <typename T>
__global__ void nf4_quantize_kernel(const T* __restrict__ x, int64_t n, int64_t blocksize,
                                    Nf4Mids mids, uint8_t* __restrict__ packed,
                                    float* __restrict__ absmax, int* __restrict__ nonfinite) {
  const int lane = threadIdx.x & 31;
  const int64_t warps_per_block = blockDim.x / 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * warps_per_block;
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  // b is the same for every lane of a warp: the shuffles below see all 32 lanes.
  for (int64_t b = blockIdx.x * warps_per_block + threadIdx.x / 32; b < blocks; b += stride) {
    const int64_t start = b * blocksize;
    const int64_t end = start + blocksize < n ? start + blocksize : n;
    float am = 0.0f;
    bool bad = false;
    for (int64_t i = start + lane; i < end; i += 32) {
      const float v = to_f(x[i]);
      bad = bad || !isfinite(v);
      am = fmaxf(am, fabsf(v));
    }
    for (int o = 16; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    if (__any_sync(0xffffffffu, bad) && lane == 0) *nonfinite = 1;
    if (lane == 0) absmax[b] = am;
    const float c = fmaxf(am, kMinAbsmax);
    const bool full = end - start == blocksize;
    const float r = __fdiv_rn(1.0f, c);
    // start is even (blocksize is): the block owns its bytes.
    for (int64_t i = start + 2 * lane; i < end; i += 64) {
      const float v0 = to_f(x[i]);
      const uint8_t hi = nearest16(mids, clamp1(full ? __fmul_rn(v0, r) : __fdiv_rn(v0, c)));
      uint8_t lo = 7;
      if (i + 1 < end) {
        const float v1 = to_f(x[i + 1]);
        lo = nearest16(mids, clamp1(full ? __fmul_rn(v1, r) : __fdiv_rn(v1, c)));
      }
      packed[i >> 1] = static_cast<uint8_t>((hi << 4) | lo);
    }
  }
}

__global__ void nf4_double_quantize_kernel(const float* __restrict__ absmax, int64_t blocks,
                                           float offset, const float* __restrict__ mids2,
                                           uint8_t* __restrict__ codes,
                                           float* __restrict__ absmax2) {
  __shared__ float mids[255];
  __shared__ float warp_max[kNested / 32];
  for (int i = threadIdx.x; i < 255; i += blockDim.x) mids[i] = mids2[i];
  __syncthreads();
  const int64_t blocks2 = (blocks + kNested - 1) / kNested;
  const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
  for (int64_t nb = blockIdx.x; nb < blocks2; nb += gridDim.x) {
    const int64_t i = nb * kNested + threadIdx.x;
    const bool in = i < blocks;
    const float d = in ? __fsub_rn(absmax[i], offset) : 0.0f;
    float am = fabsf(d);
    for (int o = 16; o > 0; o >>= 1) am = fmaxf(am, __shfl_xor_sync(0xffffffffu, am, o));
    if (lane == 0) warp_max[warp] = am;
    __syncthreads();
    am = warp_max[0];
    for (int k = 1; k < kNested / 32; ++k) am = fmaxf(am, warp_max[k]);
    if (in) {
      const float s = clamp1(__fdiv_rn(d, fmaxf(am, kMinAbsmax)));
      int lo = 0, hi = 255;  // std::lower_bound over the 255 midpoints
      while (lo < hi) {
        const int mid = (lo + hi) / 2;
        if (mids[mid] < s)
          lo = mid + 1;
        else
          hi = mid;
      }
      codes[i] = static_cast<uint8_t>(lo);
    }
    if (threadIdx.x == 0) absmax2[nb] = am;
    __syncthreads();  // warp_max is reused by the next nested block
  }
}

int64_t grid_of(int64_t units, int64_t per_block) {
  int64_t grid = (units + per_block - 1) / per_block;
  return grid < 1 ? 1
                  : (grid > 65535 * 32 ? 65535 * 32 : grid);  // grid-stride loops cover the rest
}

}  // namespace

const char* nf4_quantize(const void* x, DType dtype, int64_t n, int64_t blocksize,
                         const Nf4Mids& mids, uint8_t* packed, float* absmax, int* nonfinite,
                         cudaStream_t stream) {
  const int64_t blocks = (n + blocksize - 1) / blocksize;
  const dim3 g(static_cast<unsigned>(grid_of(blocks, kThreads / 32))), b(kThreads);
  switch (dtype) {
    case DType::kFloat:
      nf4_quantize_kernel<float><<<g, b, 0, stream>>>(static_cast<const float*>(x), n, blocksize,
                                                      mids, packed, absmax, nonfinite);
      break;
    case DType::kBFloat16:
      nf4_quantize_kernel<__nv_bfloat16><<<g, b, 0, stream>>>(
          static_cast<const __nv_bfloat16*>(x), n, blocksize, mids, packed, absmax, nonfinite);
      break;
    case DType::kHalf:
      nf4_quantize_kernel<__half><<<g, b, 0, stream>>>(static_cast<const __half*>(x), n, blocksize,
                                                       mids, packed, absmax, nonfinite);
      break;
  }
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

const char* nf4_double_quantize(const float* absmax, int64_t blocks, float offset,
                                const float* mids2, uint8_t* codes, float* absmax2,
                                cudaStream_t stream) {
  const int64_t blocks2 = (blocks + kNested - 1) / kNested;
  const dim3 g(static_cast<unsigned>(blocks2 < 65535 ? (blocks2 < 1 ? 1 : blocks2) : 65535)),
      b(kNested);
  nf4_double_quantize_kernel<<<g, b, 0, stream>>>(absmax, blocks, offset, mids2, codes, absmax2);
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

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
