// quant/cuda/nf4_kernels.h — the NF4 quantization and dequantization kernels (quant/nf4.h), plain
// launch functions.
//
// Compiled by nvcc into the engine in CUDA builds only (core/CMakeLists.txt's
// core/src/*/cuda/*.cu glob, CIUIC_FUSED_KERNELS); quant/nf4.cpp calls it for CUDA tensors. No
// LibTorch types, so nvcc compiles it alone. Each enqueues one kernel on `stream` and returns
// without synchronising; a launch error is returned as the CUDA error string (nullptr on success).
// The quantization kernels compute exactly what quant/nf4.cpp's CPU loops compute (every fp32
// operation an explicitly rounded intrinsic, nothing contracted), so their bits equal the CPU's.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace ciuic::quant::cuda {

enum class DType { kFloat, kBFloat16, kHalf };

// out[i] = code[nibble i of packed] * absmax(i / blocksize), rounded once to `dtype`, for i < n;
// nibble 2j is the high half of packed[j]. absmax(b) is absmax_f32[b] when that is non-null, else
// code2[absmax_u8[b]] * absmax2[b / 256] + offset (double quantization), in fp32 as on the CPU.
// All pointers are device pointers, contiguous.
const char* nf4_dequantize(const uint8_t* packed, const float* code, const float* absmax_f32,
                           const uint8_t* absmax_u8, const float* code2, const float* absmax2,
                           float offset, void* out, int64_t n, int64_t blocksize, DType dtype,
                           cudaStream_t stream);

// The 15 midpoints between neighbouring NF4 code values (quant/nf4.cpp computes them on the host).
struct Nf4Mids {
  float m[15];
};

// First stage of quantize_nf4: for each block b of `blocksize` (even, 32..4096) consecutive
// elements of x (n elements of `dtype`), absmax[b] = max |x| in fp32, and every element's NF4 index
// packed as quant/nf4.h states (scaled by x * (1 / c) in a full block, x / c in the short last one,
// with c = max(absmax, 1e-38), clamped to [-1, 1], the number of midpoints below it; element 2i the
// high nibble of byte i, an odd n padded with index 7). *nonfinite is set to 1 when an element is
// NaN or infinite (left as it is otherwise). packed: ceil(n / 2) bytes; absmax: ceil(n /
// blocksize).
const char* nf4_quantize(const void* x, DType dtype, int64_t n, int64_t blocksize,
                         const Nf4Mids& mids, uint8_t* packed, float* absmax, int* nonfinite,
                         cudaStream_t stream);

// Second stage (double quantization): for each block of 256 consecutive absmax values,
// absmax2[b] = max |absmax - offset| and codes[i] = the number of the 255 midpoints `mids2`
// (between the dynamic map's codes, ascending) below clamp((absmax[i] - offset) / max(absmax2,
// 1e-38), -1, 1). absmax: `blocks` values; absmax2: ceil(blocks / 256).
const char* nf4_double_quantize(const float* absmax, int64_t blocks, float offset,
                                const float* mids2, uint8_t* codes, float* absmax2,
                                cudaStream_t stream);

}  // namespace ciuic::quant::cuda
