// model/cuda/fused_kernels.h — the model's fused CUDA kernels, as plain launch functions.
//
// Compiled by nvcc into the engine in CUDA builds only (core/CMakeLists.txt, CIUIC_FUSED_KERNELS);
// the callers (model/fused_ops.cpp) wrap them in autograd functions. No LibTorch types here, so
// that nvcc compiles this part alone and quickly. Every function enqueues one kernel on `stream`
// and returns; it does not synchronise. Pointers are device pointers to the element type `dtype`
// names; sizes are element counts. A launch error is returned as the CUDA error string (nullptr
// on success); kernels themselves cannot fail.
#pragma once

#include <cstdint>

#include <cuda_runtime_api.h>

namespace ciuic::model::cuda {

enum class DType { kFloat, kBFloat16, kHalf };

// Rotary embedding of x [batch, seq, heads, 2 * half] (the last dimension contiguous; the
// element strides of the first three in x_strides), with per-position tables cos, sin_signed
// [batch * seq, 2 * half] contiguous (model/llama_ops.h's RopeTables). Writes out
// [batch, seq, heads, 2 * half] contiguous.
//   forward:  out[i] = x[i] cos[i] + x[p(i)] sin_signed[i]
//   backward: out[i] = x[i] cos[i] + x[p(i)] sin_signed[p(i)]   (x is then the incoming gradient)
// where p(i) = i + half for i < half and i - half otherwise. Computed in fp32, rounded once.
const char* rope(const void* x, const void* cos, const void* sin_signed, void* out, int64_t batch,
                 int64_t seq, int64_t heads, int64_t half, const int64_t x_strides[3],
                 bool backward, DType dtype, cudaStream_t stream);

// The gated MLP activation act(gate) * up: SwiGLU (act = silu) or GeGLU (act = GELU in
// PyTorch's tanh form, gelu(approximate = "tanh")).
enum class Glu { kSilu, kGeluTanh };
// out = act(gate) * up over n elements (all contiguous).
const char* glu_forward(const void* gate, const void* up, void* out, int64_t n, Glu act,
                        DType dtype, cudaStream_t stream);
// Its gradient: d_gate = grad * up * act'(gate), d_up = grad * act(gate).
const char* glu_backward(const void* gate, const void* up, const void* grad, void* d_gate,
                         void* d_up, int64_t n, Glu act, DType dtype, cudaStream_t stream);

// RMSNorm over rows of `dim` elements with transformers' rounding points, computing in fp32:
//   plain (LlamaRMSNorm, Qwen3RMSNorm): y = w * (x * rstd).to(dtype), the product in the dtype
//   gemma (Gemma3RMSNorm): y = (x * rstd * (1 + w)).to(dtype), everything in fp32
// with rstd = rsqrt(mean(x^2) + eps) in fp32. x, w, y contiguous ([rows, dim], [dim]).
const char* rms_norm_forward(const void* x, const void* w, void* y, int64_t rows, int64_t dim,
                             float eps, bool gemma, DType dtype, cudaStream_t stream);
// Its gradient for the incoming grad [rows, dim] (contiguous): dx [rows, dim] in the dtype and,
// unless d_w_parts is null, fp32 partial sums of d_w, [rms_norm_backward_blocks(rows), dim]:
// their sum over the first dimension is d_w (a fixed split: deterministic).
const char* rms_norm_backward(const void* x, const void* w, const void* grad, void* dx,
                              float* d_w_parts, int64_t rows, int64_t dim, float eps, bool gemma,
                              DType dtype, cudaStream_t stream);
int64_t rms_norm_backward_blocks(int64_t rows);

// The per-head q/k norm then rotary embedding (qwen3, gemma3_text): x [batch, seq, heads,
// 2 * half] (last dimension contiguous, the others' element strides in x_strides), each head's
// row normed as rms_norm_forward does (weight w [2 * half]), rounded to the dtype (the norm's
// output), then rotated as rope's forward does with the tables cos, sin_signed, rounded once.
// Writes out [batch, seq, heads, 2 * half] contiguous. 2 * half <= 512.
const char* qk_norm_rope_forward(const void* x, const void* w, const void* cos,
                                 const void* sin_signed, void* out, int64_t batch, int64_t seq,
                                 int64_t heads, int64_t half, const int64_t x_strides[3], float eps,
                                 bool gemma, DType dtype, cudaStream_t stream);
// Its gradient for the incoming grad (same shape, strides g_strides, last dimension
// contiguous): dx contiguous and, unless d_w_parts is null, fp32 partial sums of d_w
// [qk_norm_rope_backward_blocks(batch * seq * heads), 2 * half] as for rms_norm_backward.
const char* qk_norm_rope_backward(const void* x, const void* w, const void* cos,
                                  const void* sin_signed, const void* grad, void* dx,
                                  float* d_w_parts, int64_t batch, int64_t seq, int64_t heads,
                                  int64_t half, const int64_t x_strides[3],
                                  const int64_t g_strides[3], float eps, bool gemma, DType dtype,
                                  cudaStream_t stream);
int64_t qk_norm_rope_backward_blocks(int64_t rows);

}  // namespace ciuic::model::cuda
