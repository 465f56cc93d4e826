// quant/cuda/nf4_kernels.h — the NF4 dequantization kernel (quant/nf4.h), a plain launch function.
//
// Compiled by nvcc into the engine in CUDA builds only (core/CMakeLists.txt's
// core/src/*/cuda/*.cu glob, CIUIC_FUSED_KERNELS); quant/nf4.cpp calls it for CUDA tensors. No
// LibTorch types, so nvcc compiles it alone. It enqueues one kernel on `stream` and returns without
// synchronising; a launch error is returned as the CUDA error string (nullptr on success).
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

}  // namespace ciuic::quant::cuda
