// model/cpu_skinny_gemm_kernel.h — the per-ISA kernels behind model/cpu_skinny_gemm.h (internal).
#pragma once

#include <cstdint>

namespace ciuic::model::skinny {

// y[m, n] = sum_k x[m, k] * w[n, k] (+ bias[n]) for m < rows, n in [n_begin, n_end).
struct Args {
  const float* x = nullptr;  // rows x k, row stride ldx
  int64_t ldx = 0;
  const float* w = nullptr;  // n x k, row stride ldw
  int64_t ldw = 0;
  const float* bias = nullptr;  // [n] or null
  float* y = nullptr;           // rows x n, row stride ldy
  int64_t ldy = 0;
  int64_t rows = 0;  // 1..kSkinnyMaxRows
  int64_t n = 0;
  int64_t k = 0;
};

// Rows of W per task of the parallel loop (and per pass over x's row tiles): a multiple of every
// block size below, so that the tasks' blocks stay aligned.
constexpr int64_t kRowChunk = 24;

// One thread, W rows [n_begin, n_end). The SIMD ones exist on x86-64 only and may be called only
// where the CPU supports them (skinny_isa_supported).
using KernelFn = void (*)(const Args& a, int64_t n_begin, int64_t n_end);
void kernel_scalar(const Args& a, int64_t n_begin, int64_t n_end);
#if defined(__x86_64__)
void kernel_avx2(const Args& a, int64_t n_begin, int64_t n_end);
void kernel_avx512(const Args& a, int64_t n_begin, int64_t n_end);
#endif

}  // namespace ciuic::model::skinny
